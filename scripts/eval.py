"""Evaluate a LoRA adapter (or a run's latest checkpoint) on the env's fixed evaluation set, greedily.

    python scripts/eval.py outputs/2026-05-01/14-03-22                       # the run's adapter, its env
    python scripts/eval.py outputs/.../checkpoints/latest --num-tasks 16 --out eval16.json
    python scripts/eval.py /path/to/adapter env=visgym_interactive env.max_turns=18
    python scripts/eval.py --no-adapter --base /path/to/checkpoint           # the base model alone
    python scripts/eval.py outputs/... --twins     # also the eval mazes' turned and mirrored twins (VisGym)
    python scripts/eval.py outputs/... --reading   # also the grounding stage's questions on the eval mazes (VisGym)

This is the evaluation the training loop runs (rlkit.evaluation.evaluate, rlkit.backends.native):
the base the adapter recorded (adapter_config.json) or ``--base``, wrapped with LoRA of the
adapter's rank, alpha and target modules, the adapter's weights loaded in place
(rlkit.policy.lora.load_adapter_inplace, verified tensor by tensor), sampling
``rollout.eval_temperature`` (0 = greedy) with ``rollout.max_new_tokens`` tokens per turn, the
first ``--num-tasks`` (default: ``eval.num_tasks``, else all) seeds of ``env``'s evaluation set.
Config: conf/train.yaml composed with the run's recorded overrides (when the adapter is in a run
directory) and then the positional Hydra overrides.

Prints the success rate (with the turn budget) and the metrics; ``--out`` writes the per-task
outcomes (rlkit.evaluation.write_outcomes format, as a run's eval/final.json). Exit status 2 with
the message on stderr for an unusable adapter, base or config, or for ``--reading`` / ``--twins`` on an env
without grounding questions or twins (``--reading``'s tasks are checked before anything is evaluated).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from rlkit.cli import DefaultsHelpFormatter, first_eval_seeds, non_negative_int, positive_int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("adapter", nargs="?", default=None,
                   help="adapter dir, run dir, <run>/latest or a checkpoint dir (see rlkit.serve.models)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml (env=..., env.max_turns=...)")
    p.add_argument("--base", default=None, help="base checkpoint dir or hub id (default: what the adapter recorded)")
    p.add_argument("--allow-base-mismatch", action="store_true", help="allow --base to differ from the recorded base")
    p.add_argument("--no-adapter", action="store_true", help="evaluate the base model without an adapter")
    p.add_argument("--num-tasks", type=positive_int, default=None,
                   help="first N seeds of the eval set (default: eval.num_tasks)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="episodes per rollout batch")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads (default: trainer.num_threads, else 1, as in training: "
                        "a tiny model ran ~20x slower with torch's default pool on a shared 2-core machine)")
    p.add_argument("--out", default=None, help="write per-task outcomes (JSON) here")
    p.add_argument("--twins", action="store_true",
                   help="also evaluate the turned and mirrored images of the evaluation mazes that a seed "
                        "below --twin-seed-limit draws (VisGym; envs/visgym/maze.py dihedral_keys): does a failed "
                        "maze fail in every orientation, or only in the one held out?")
    p.add_argument("--twin-seed-limit", type=positive_int, default=6000,
                   help="seeds searched for twins (7x7: all 344 below 5,400; 9x9: about 7 per 6,000)")
    p.add_argument("--reading", action="store_true",
                   help="also ask the grounding stage's questions (grounding.tasks in the run's "
                        "config, walls on the default; every task the env offers when it is []) about the "
                        "evaluation mazes' pictures and print their accuracy table, teacher-forced as "
                        "rlkit.stages.grounding measures it: does the policy still read after GRPO? (VisGym)")
    p.add_argument("--reading-questions", type=positive_int, default=4,
                   help="questions per evaluation maze and task for --reading (each draws its own agent and goal cells)")
    p.add_argument("--reading-seed", type=non_negative_int, default=12345,
                   help="seeds the --reading questions' draws: the same questions for every run and checkpoint asked "
                        "the same tasks (the tasks share one generator)")
    return p


def eval_env_spec(cfg):
    """The env the run evaluated on: ``cfg.env``, and for a control=fixed_image run (its recorded config) the
    same env showing the one picture it trained on (rlkit.controls), as its own evaluations did."""
    from rlkit.serve.config import instantiate_env

    env_spec = instantiate_env(cfg)
    if cfg.get("control") == "fixed_image":
        from rlkit.controls import FixedImageEnvSpec, fixed_image_seed

        env_spec = FixedImageEnvSpec(env_spec, fixed_image_seed(cfg.seed, env_spec))
        print(f"[rlkit] control=fixed_image (from the run's config): every image shown is task "
              f"{env_spec.image_seed}'s first observation; control=null evaluates on the real pictures")
    return env_spec


def load_eval_policy(policy_cfg: dict, adapter, base: str | None, allow_base_mismatch: bool = False):
    """The policy as the training loop evaluates it: base + LoRA (the adapter's r, alpha, targets)
    with the adapter loaded in place; or the plain base when ``adapter`` is None.

    Raises: rlkit.serve.models.AdapterError (base mismatch), ValueError (adapter does not fit),
    rlkit.policy.PolicyLoadError (base not loadable).
    """
    from rlkit.policy import load_policy
    from rlkit.serve.models import resolve_base

    cfg = {k: v for k, v in policy_cfg.items() if k != "_target_"}
    chosen = resolve_base(base, [adapter] if adapter is not None else [], allow_mismatch=allow_base_mismatch)
    if adapter is None:
        return load_policy(**cfg, base_path=chosen, train_mode="full")
    acfg = adapter.config()
    targets, exclude = acfg.get("target_modules"), acfg.get("exclude_modules")
    cfg["lora"] = {**dict(cfg.get("lora") or {}), "enabled": True, "rank": int(acfg["r"]),
                   "alpha": float(acfg["lora_alpha"]), "dropout": 0.0,
                   "target_modules": targets if isinstance(targets, str) else sorted(targets),
                   # what the adapter left out although a target name reaches it (all-linear: the Conv3d patch
                   # embedding, whose leaf name `proj` is a target): without it the rebuilt model has LoRA there
                   "exclude_modules": exclude if exclude is None or isinstance(exclude, str) else sorted(exclude)}
    policy = load_policy(**cfg, base_path=chosen, train_mode="lora")
    policy.load_adapter(adapter.path)
    return policy


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # overrides before or after the flags
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    if args.adapter is not None and "=" in args.adapter and not Path(args.adapter).exists():
        args.overrides.insert(0, args.adapter)  # an override in the adapter's place (with --no-adapter)
        args.adapter = None
    if (args.adapter is None) != args.no_adapter:
        print("error: give an adapter (dir, run dir or checkpoint) or --no-adapter", file=sys.stderr)
        return 2

    import torch

    from rlkit.config import stop_strings
    from rlkit.evaluation import evaluate, write_outcomes
    from rlkit.policy import PolicyLoadError, SamplingParams, make_engine
    from rlkit.errors import ConfigError
    from rlkit.serve.config import ConfigComposeError, compose, node
    from rlkit.serve.models import AdapterError, parse_adapter_arg

    try:
        adapter = parse_adapter_arg(args.adapter) if args.adapter else None
        cfg = compose(args.overrides, run_dir=adapter.run_dir if adapter else None)
        env_spec = eval_env_spec(cfg)
        tasks = reading_tasks(env_spec, cfg.grounding.get("tasks")) if args.reading else []
        policy = load_eval_policy(node(cfg, "policy"), adapter, args.base, args.allow_base_mismatch)
    except (AdapterError, ConfigComposeError, ConfigError, PolicyLoadError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or cfg.trainer.num_threads or 1)
    num_tasks = args.num_tasks if args.num_tasks is not None else cfg.eval.num_tasks
    try:
        seeds = first_eval_seeds(env_spec.eval_seeds(), num_tasks, env_spec.eval_set_name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sampling = SamplingParams(temperature=cfg.rollout.eval_temperature, top_p=1.0, top_k=0,
                              max_new_tokens=cfg.rollout.max_new_tokens, n=1, seed=cfg.seed,
                              stop=stop_strings(cfg.rollout, env_spec))  # as the run's own evaluations
    t0 = time.time()
    metrics, per_task, _ = evaluate(env_spec, policy, make_engine(policy), seeds, sampling, policy_version=0,
                                    batch_size=args.batch_size)
    metrics["timing/eval"] = time.time() - t0
    budget = getattr(env_spec, "action_budget", env_spec.max_turns)
    what = f"adapter {adapter.path}" if adapter else f"base {policy.checkpoint}"
    print(f"[rlkit] eval success on {env_spec.eval_set_name} ({len(seeds)} tasks, budget {budget}): "
          f"{metrics['eval/success_rate']:.1%} ({sum(r['success'] for r in per_task)}/{len(seeds)}); {what}")
    print(json.dumps(metrics, indent=1))
    if args.out:
        write_outcomes(Path(args.out), env_spec.eval_set_name, 0, metrics, per_task)
    status = 0
    if args.reading:
        status = eval_reading(env_spec, policy, seeds, tasks, args.reading_questions, args.reading_seed,
                              args.batch_size)
    if args.twins:
        status = max(status, eval_twins(env_spec, policy, sampling, per_task, args.twin_seed_limit, args.batch_size))
    return status


def reading_tasks(env_spec, tasks) -> list[str]:
    """The grounding tasks ``--reading`` asks: ``grounding.tasks``, or every task the env offers when it is empty or
    None, as the grounding stage reads it (rlkit.stages.grounding.grounding_tasks). Raises ValueError (naming the
    fix) for an env without grounding questions, a value that is not a flat list, or a task the env does not offer."""
    from rlkit.stages.grounding import grounding_tasks
    from rlkit.types import SupportsGroundingQuestions

    if not isinstance(env_spec, SupportsGroundingQuestions):
        raise ValueError(f"--reading needs an env with grounding questions (VisGym), not {type(env_spec).__name__}")
    try:
        return grounding_tasks(env_spec, tasks)
    except ValueError as e:
        raise ValueError(f"--reading: {e}") from None


def eval_reading(env_spec, policy, seeds: list[int], tasks: list[str], per_maze: int, seed: int,
                 batch_size: int = 64) -> int:
    """The grounding stage's questions about the pictures of the evaluation mazes ``seeds``: ``per_maze`` questions
    of each task in ``tasks`` (``reading_tasks``; ``env_spec.grounding_example``, which draws the agent's and the
    goal's cells from one generator seeded by ``seed``, so every checkpoint asked the same tasks gets the same
    questions), scored as rlkit.stages.grounding scores its held-out questions (teacher-forced argmax of every answer token;
    a wall bit by its own token), ``batch_size`` questions a forward. Prints one line and the accuracy table (exact answers per task and
    ``all``, ``wall_bits`` per bit when a task asks wall bits). GRPO never asks these questions, so a policy whose
    success rises can read worse. The pictures are the real ones, also for a control=fixed_image run (a question
    about one maze on another maze's picture has no right answer).
    Returns 0, or 2 (with the message on stderr) when a question cannot be scored (two wall bits in one token of
    the policy's tokenizer: rlkit.stages.grounding.encode_example)."""
    import numpy as np

    from rlkit.controls import FixedImageEnvSpec
    from rlkit.stages.grounding import accuracy_table, bits_name, encode_example, format_table, token_hits

    rng = np.random.default_rng(seed)
    try:
        items = [encode_example(policy, env_spec.grounding_example(s, task, rng))
                 for s in seeds for task in tasks for _ in range(per_maze)]
    except ValueError as e:
        print(f"error: --reading: {e}", file=sys.stderr)
        return 2
    per_token = token_hits(policy, items, batch_size)
    table = accuracy_table(items, [all(h) for h in per_token], per_token, bits_name(env_spec))
    real = " (the real pictures: control=fixed_image does not apply)" if isinstance(env_spec, FixedImageEnvSpec) else ""
    print(f"[rlkit] reading on {len(seeds)} evaluation mazes{real} ({per_maze} question(s) each of "
          f"{', '.join(tasks)}; teacher-forced): {table['all']:.1%} exact" +
          (f", {table['wall_bits']:.1%} of wall bits" if "wall_bits" in table else ""))
    print(format_table({"accuracy": table}))
    return 0


def eval_twins(env_spec, policy, sampling, per_task: list[dict], seed_limit: int, batch_size: int) -> int:
    """Greedy success on the evaluation mazes' turned and mirrored twins (``EvalSet.twin_seeds``) beside the
    evaluation set's ``per_task`` outcomes; prints one line for the twins and one per failed evaluation maze."""
    from rlkit.evaluation import evaluate
    from rlkit.policy import make_engine

    if not callable(getattr(getattr(env_spec, "eval_set", None), "twin_seeds", None)):
        print(f"error: --twins needs a VisGym maze env (env.eval_set.twin_seeds), not {type(env_spec).__name__}",
              file=sys.stderr)
        return 2
    by_eval = {s: tw for s, tw in env_spec.eval_set.twin_seeds(seed_limit).items()
               if s in {r["seed"] for r in per_task}}
    seeds = sorted({t for tw in by_eval.values() for t in tw})
    if not seeds:
        print(f"[rlkit] no seed below {seed_limit} draws a twin of these evaluation mazes; raise --twin-seed-limit")
        return 0
    _, twin_tasks, _ = evaluate(env_spec, policy, make_engine(policy), seeds, sampling, policy_version=0,
                                batch_size=batch_size)
    solved = {r["seed"]: bool(r["success"]) for r in twin_tasks}
    trained = sum(not env_spec.is_eval_seed(t) for t in seeds)  # all under env.holdout=layout, none under dihedral
    print(f"[rlkit] twins (turned or mirrored evaluation mazes, drawn by seeds < {seed_limit}): "
          f"{sum(solved.values()) / len(solved):.1%} ({sum(solved.values())}/{len(solved)}) of "
          f"the twins of {sum(1 for tw in by_eval.values() if tw)} evaluation mazes; {trained} of them are training "
          f"tasks (env.holdout={getattr(env_spec, 'holdout', '?')})")
    for r in per_task:
        if not r["success"] and by_eval.get(r["seed"]):
            tw = by_eval[r["seed"]]
            print(f"  failed evaluation maze {r['seed']}: its twins solved {sum(solved[t] for t in tw)}/{len(tw)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
