"""Play env episodes against an OpenAI-compatible endpoint and report the success rate.

    python scripts/play.py --url http://127.0.0.1:8000/v1 --model maze --num-tasks 64
    python scripts/play.py --url http://127.0.0.1:8000/v1 --run outputs/2026-05-01/14-03-22     # that run's env
    python scripts/play.py --url http://gpu-host:8000/v1 --model maze --mode interactive --max-turns 18 --api-key-env RLKIT_API_KEY
    python scripts/play.py --url http://127.0.0.1:8000/v1 --model maze --api-key sk-local    # the key serve.py --api-key took

Works against scripts/serve.py and ``vllm serve`` alike (official ``openai`` client). The env is
``env`` of conf/train.yaml composed with the run's recorded overrides (``--run``) and then the
positional Hydra overrides (``env=visgym_interactive env.max_turns=18``); ``--variant``, ``--mode``,
``--max-turns`` and ``--parser`` are shorthands for ``env.<key>=...``. Tasks: the first
``--num-tasks`` (default: ``eval.num_tasks``, as scripts/eval.py) seeds of the env's fixed evaluation
set, or ``--seeds``. Per turn: ``--max-tokens``
(default: rollout.max_new_tokens), temperature 0 (greedy) unless ``--temperature``.

With temperature 0 against scripts/serve.py the outcomes equal scripts/eval.py's for the same
adapter, maze by maze (rlkit/serve/play.py says why). ``--out`` writes them (the format of
scripts/eval.py --out). ``--model`` may be omitted when the server lists exactly one adapter.
A server that requires a key (scripts/serve.py ``--api-key`` / ``--api-key-env``, ``vllm serve --api-key``)
gets it as ``Authorization: Bearer KEY`` from ``--api-key KEY`` or from the variable ``--api-key-env`` names
(which keeps it out of the process list); without either, the openai client's placeholder ``EMPTY``, which an
open server ignores.
Exit status 2 for a config error (a bad key option included), 1 when the endpoint fails (a refused key: 401).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rlkit.cli import DefaultsHelpFormatter, first_eval_seeds, positive_int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml (env=..., env.max_turns=...)")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the endpoint's base URL (ending in /v1)")
    p.add_argument("--model", default=None, help="served model name (default: the only adapter the server lists)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="send 'Authorization: Bearer KEY' (the key serve.py --api-key or vllm serve --api-key requires)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="as --api-key, the key read from this environment variable (kept out of the process list)")
    p.add_argument("--run", default=None, help="a run directory whose recorded overrides set env and rollout")
    p.add_argument("--variant", default=None, help="env.variant (easy | hard)")
    p.add_argument("--mode", default=None, help="env.mode (interactive | plan)")
    p.add_argument("--max-turns", type=int, default=None, help="env.max_turns")
    p.add_argument("--parser", default=None, help="env.parser")
    p.add_argument("--num-tasks", type=positive_int, default=None, help="first N seeds of the eval set (default: eval.num_tasks, else all)")
    p.add_argument("--seeds", default=None, help="comma-separated task seeds instead of the eval set")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per turn (default: rollout.max_new_tokens)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="base sampling seed (per request seeds derive from it)")
    p.add_argument("--concurrency", type=positive_int, default=4, help="episodes in flight")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", default=None, help="write per-task outcomes (JSON) here")
    return p


def api_key(args) -> str | None:
    """The key to send: ``--api-key``, else the variable ``--api-key-env`` names, else None (none required).

    Raises: ValueError for an empty ``--api-key``, both options, or an ``--api-key-env`` variable that is unset
    or empty (the server would answer 401).
    """
    if args.api_key is not None:
        if args.api_key_env:
            raise ValueError("--api-key and --api-key-env both given; give the key one way")
        if not args.api_key:
            raise ValueError("--api-key: an empty key; give the key the server requires")
        return args.api_key
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: the environment variable is unset or empty")
        return key
    return None


def pick_model(client, wanted: str | None) -> str:
    """``wanted``, or the only adapter the endpoint lists (models with a ``parent``), else ValueError."""
    if wanted:
        return wanted
    models = client.models.list().data
    adapters = [m.id for m in models if getattr(m, "parent", None)]
    if len(adapters) == 1:
        return adapters[0]
    raise ValueError(f"--model is needed: the endpoint lists {[m.id for m in models]}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import openai

    from rlkit.config import stop_strings
    from rlkit.evaluation import write_outcomes
    from rlkit.errors import ConfigError
    from rlkit.serve.config import ConfigComposeError, compose, instantiate_env
    from rlkit.serve.play import PlayError, play

    try:
        bearer = api_key(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.run and not (Path(args.run) / ".hydra" / "overrides.yaml").is_file():
        print(f"error: --run {args.run}: not a run folder (no .hydra/overrides.yaml); give the folder train.py "
              "wrote (outputs/<date>/<time>, or its hydra.run.dir), or leave --run out", file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    for key in ("variant", "mode", "max_turns", "parser"):
        if getattr(args, key) is not None:
            overrides.append(f"env.{key}={getattr(args, key)}")
    try:
        cfg = compose(overrides, run_dir=Path(args.run) if args.run else None)
        env_spec = instantiate_env(cfg)
    except (ConfigComposeError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    else:
        num_tasks = args.num_tasks if args.num_tasks is not None else cfg.eval.num_tasks
        try:
            seeds = first_eval_seeds(env_spec.eval_seeds(), num_tasks, env_spec.eval_set_name)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    max_tokens = args.max_tokens or int(cfg.rollout.max_new_tokens)
    client = openai.OpenAI(base_url=args.url, api_key=bearer or "EMPTY", timeout=args.timeout, max_retries=2)
    t0 = time.time()
    try:
        model = pick_model(client, args.model)
        metrics, per_task = play(client, model, env_spec, seeds, max_tokens, temperature=args.temperature,
                                 top_p=args.top_p, sampling_seed=args.seed, concurrency=args.concurrency,
                                 stop=stop_strings(cfg.rollout, env_spec))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except openai.APIConnectionError as e:
        print(f"error: cannot reach an OpenAI-compatible endpoint at {args.url} ({e}). Start one "
              f"(scripts/serve.py --adapter <run>, or vllm serve ...) or pass --url.", file=sys.stderr)
        return 1
    except (PlayError, openai.OpenAIError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    metrics["timing/play"] = time.time() - t0
    budget = getattr(env_spec, "action_budget", env_spec.max_turns)
    print(f"[rlkit] play success on {env_spec.eval_set_name} ({len(seeds)} tasks, budget {budget}): "
          f"{metrics['eval/success_rate']:.1%} ({sum(r['success'] for r in per_task)}/{len(seeds)}); "
          f"model {model} at {args.url}, temperature {args.temperature}")
    print(json.dumps(metrics, indent=1))
    if args.out:
        write_outcomes(Path(args.out), env_spec.eval_set_name, 0, metrics, per_task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
