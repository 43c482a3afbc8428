"""Serve a policy and its LoRA adapters over an OpenAI-compatible Chat Completions API.

    python scripts/serve.py --adapter outputs/2026-05-01/14-03-22            # a run's final adapter
    python scripts/serve.py --adapter good=outputs/.../checkpoints/latest --adapter early=outputs/.../checkpoints/step_000010
    python scripts/serve.py policy=qwen3_vl_8b --adapter maze=/shared/run/adapter --api-key-env RLKIT_API_KEY
    VLLM_API_KEY=sk-local python scripts/serve.py --adapter outputs/...     # key required, as vllm serve (or --api-key KEY)
    python scripts/serve.py --adapter outputs/... --print-vllm                # the vllm serve equivalent; starts nothing
    python scripts/serve.py --adapter outputs/2026-05-01/14-03-22 --engine vllm   # the real vLLM server (CPU build, .venv-vllm)

The base model is the one the adapters recorded (adapter_config.json), else ``--base`` (a checkpoint
directory or hub id), else the composed policy config (``policy=tiny_vl`` builds the tiny model).
Positional arguments are Hydra overrides of conf/train.yaml, as for train.py (``policy=...``,
``policy.dtype=...``); with an adapter from a run directory, that run's recorded overrides come
first. Binds 127.0.0.1 unless --host says otherwise. Routes, streaming, logprobs, limits and errors:
rlkit/serve/app.py and docs/serving.md.

``--engine vllm`` serves with vLLM's OpenAI server instead (rlkit/serve/vllm_server.py): started from
``.venv-vllm`` with the flags rlkit.serve.vllm.vllm_command builds, after refusing an adapter vLLM would
load only in part, and probed against rlkit's engine before it is announced ready.

Exit status 2 with the message on stderr when the adapters, base or config are unusable; 1 when vLLM
fails to start or its probe answers differ from rlkit's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rlkit.cli import DefaultsHelpFormatter, port

from rlkit.serve.protocol import ServeLimits  # light: pydantic + PIL


def build_parser() -> argparse.ArgumentParser:
    d = ServeLimits()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of conf/train.yaml (policy=..., policy.dtype=...)")
    p.add_argument("--adapter", action="append", default=[], metavar="[NAME=]PATH",
                   help="adapter dir, run dir (its adapter/ or latest checkpoint), <run>/latest or a checkpoint dir; "
                        "repeat for several. NAME defaults to the run directory's name")
    p.add_argument("--base", default=None, help="base checkpoint dir or hub id (default: what the adapters recorded)")
    p.add_argument("--allow-base-mismatch", action="store_true", help="allow --base to differ from the recorded base")
    p.add_argument("--base-name", default="base", help="served name of the base model (adapter disabled)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 routes (401 otherwise), as vllm serve --api-key; "
                        "repeat for several keys. Default: $VLLM_API_KEY when set (as vLLM), else no key")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="as --api-key, the key read from this environment variable (kept out of the process list)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-image-bytes", type=int, default=d.max_image_bytes)
    p.add_argument("--max-image-pixels", type=int, default=d.max_image_pixels)
    p.add_argument("--max-images", type=int, default=d.max_images, help="images per request")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="largest max_tokens a request may ask")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--max-n", type=int, default=d.max_n)
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + completion tokens (default: the model's)")
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="waiting requests before 429")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the model worker (default: all cores)")
    p.add_argument("--no-reuse-sampled-ids", action="store_true",
                   help="always re-tokenize assistant messages (as vLLM does) instead of reusing the sampled ids")
    p.add_argument("--print-vllm", action="store_true",
                   help="print the equivalent vllm serve command (with --engine vllm: the command it would run) and exit")
    p.add_argument("--engine", choices=["rlkit", "vllm"], default="rlkit",
                   help="rlkit: rlkit's server in this process; vllm: vLLM's OpenAI server (CPU build, .venv-vllm)")
    p.add_argument("--vllm-python", default=None, help="--engine vllm: vLLM's interpreter (default: .venv-vllm/bin/python)")
    p.add_argument("--no-probe", action="store_true",
                   help="--engine vllm: skip the check that vLLM answers a probe prompt as rlkit's engine does")
    p.add_argument("--start-timeout", type=float, default=600.0, help="--engine vllm: seconds to wait for vLLM to start")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    from rlkit.serve.config import ConfigComposeError, compose, node
    from rlkit.serve.models import AdapterError, load_host, parse_adapter_arg

    try:
        adapters = [parse_adapter_arg(a) for a in args.adapter]
        run_dir = next((a.run_dir for a in adapters if a.run_dir is not None), None)
        cfg = compose(args.overrides, run_dir=run_dir)
        policy_cfg = node(cfg, "policy")
        limits = ServeLimits(
            max_body_bytes=args.max_body_bytes, max_image_bytes=args.max_image_bytes,
            max_image_pixels=args.max_image_pixels, max_images=args.max_images, max_tokens=args.max_tokens,
            default_max_tokens=args.default_max_tokens, max_n=args.max_n, max_model_len=args.max_model_len,
            max_queue=args.max_queue,
        )
        limits.validate()
        api_key, args.key_env, key_note = api_keys(args)
        if args.engine == "vllm":
            _check_vllm_args(args)
            if api_key is not None and len(api_key) > 1:
                raise ValueError(f"--engine vllm: {len(api_key)} API keys; rlkit hands vLLM one key (as VLLM_API_KEY, "
                                 "kept off its command line), so give one --api-key")
        if args.print_vllm:
            if key_note:
                print(f"# {key_note}")
            print(_vllm(args, adapters, policy_cfg, limits))
            return 0
        if args.engine == "vllm":
            launch = _vllm_launch(args, adapters, policy_cfg, limits, api_key[0] if api_key else None)
        host = load_host(policy_cfg, adapters, base=args.base, base_name=args.base_name,
                         max_model_len=args.max_model_len, allow_base_mismatch=args.allow_base_mismatch)
    except (AdapterError, ConfigComposeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.engine == "vllm":
        from rlkit.serve import vllm_server

        print("[rlkit] starting vLLM: " + " ".join(launch.argv), flush=True)
        expected = None if args.no_probe else (lambda: _probe_expected(args, adapters, policy_cfg, cfg, launch))
        return vllm_server.run(launch, expected, args.start_timeout, api_key[0] if api_key else None)

    import uvicorn

    from rlkit.serve.app import ServerSettings, create_app

    app = create_app(host, ServerSettings(limits=limits, api_key=api_key, num_threads=args.threads,
                                          sampled_ids_capacity=0 if args.no_reuse_sampled_ids else 16384))
    print(f"[rlkit] serving {', '.join(host.names)} on http://{args.host}:{args.port}/v1 "
          f"(max_model_len {host.max_model_len}{', API key required' if api_key else ''}"
          f"{' (from VLLM_API_KEY)' if api_key and args.key_env == 'VLLM_API_KEY' and not args.api_key else ''})",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def api_keys(args) -> tuple[tuple[str, ...] | None, str | None, str | None]:
    """The API keys the server requires, as ``vllm serve`` takes them: ``--api-key`` (repeatable) first, else
    the variable ``--api-key-env`` names, else ``VLLM_API_KEY`` when set and non-empty (vLLM's variable), else
    none.

    Returns: (keys or None, the environment variable a printed vllm command should read the key from or None,
    a note for --print-vllm or None).
    Raises: ValueError for an empty ``--api-key``, both ``--api-key`` and ``--api-key-env``, or an
    ``--api-key-env`` variable that is unset or empty.
    """
    if args.api_key is not None:
        if args.api_key_env:
            raise ValueError("--api-key and --api-key-env both given; give the key one way")
        if any(not k for k in args.api_key):
            raise ValueError("--api-key: an empty key; give the key clients must send (Authorization: Bearer KEY)")
        return tuple(args.api_key), "VLLM_API_KEY", ("vLLM reads the key from $VLLM_API_KEY: export it with the "
                                                     "value of --api-key (the key is not printed)")
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(f"--api-key-env {args.api_key_env}: the environment variable is unset or empty")
        return (key,), args.api_key_env, None
    if os.environ.get("VLLM_API_KEY"):
        return (os.environ["VLLM_API_KEY"],), "VLLM_API_KEY", None
    return None, None, None


#: rlkit's server limits that vLLM does not take (it has its own): refused with --engine vllm unless default.
_RLKIT_ONLY = ("max_body_bytes", "max_image_bytes", "max_image_pixels", "max_tokens", "default_max_tokens", "max_n",
               "max_queue", "no_reuse_sampled_ids")


def _check_vllm_args(args) -> None:
    """Refuse rlkit-server-only options with --engine vllm (they would be ignored)."""
    defaults = build_parser().parse_args([])
    set_ = [f"--{k.replace('_', '-')}" for k in _RLKIT_ONLY if getattr(args, k) != getattr(defaults, k)]
    if set_:
        raise ValueError(f"{', '.join(set_)}: rlkit's server limits, which vLLM does not take (it has its own "
                         "options); leave them out with --engine vllm, or serve with rlkit's engine")


def _vllm_plan(args, adapters, policy_cfg, limits, must_exist: bool) -> tuple[str, int, str, list[str]]:
    """(base, max_model_len, dtype, notes) of the vLLM server for these arguments."""
    import json

    from rlkit.serve.models import resolve_base

    base = resolve_base(args.base, adapters, allow_mismatch=args.allow_base_mismatch, must_exist=must_exist) \
        or policy_cfg.get("path")
    notes = []
    if base is None:
        from rlkit.policy.tiny import TinyVLSizes, tiny_checkpoint

        tiny = dict(policy_cfg["tiny"])
        tiny["deepstack_indexes"] = list(tiny.get("deepstack_indexes", [0]))
        base = str(tiny_checkpoint(TinyVLSizes(**tiny), seed=policy_cfg.get("seed", 0),
                                   cache_dir=policy_cfg.get("cache_dir")))
        if args.engine != "vllm":
            notes.append("the tiny policy is a CPU test model; vLLM is meant for Qwen3-VL checkpoints on GPUs")
    model_len = limits.max_model_len
    if model_len is None:
        model_len = 32768
        cfg_file = Path(os.path.expanduser(str(base))) / "config.json"
        if cfg_file.is_file():
            hf = json.loads(cfg_file.read_text())
            own = (hf.get("text_config") or hf).get("max_position_embeddings")
            if own:
                model_len = min(int(own), 32768)
        notes.append(f"--max-model-len {model_len}: set --max-model-len here to choose another")
    if policy_cfg.get("image_min_pixels") or policy_cfg.get("image_max_pixels"):
        notes.append("policy.image_min_pixels/image_max_pixels are not passed on: vLLM uses the checkpoint's "
                     "preprocessor_config.json bounds")
    dtype = policy_cfg.get("dtype", "auto")
    if args.engine == "vllm":  # vLLM's CPU build: the dtype rlkit's policy takes on this CPU
        from rlkit.hardware import resolve_dtype_here

        dtype = resolve_dtype_here(dtype, "cpu")[0]
    elif dtype == "auto":
        dtype = "bfloat16"
    return str(base), model_len, dtype, notes


def _vllm(args, adapters, policy_cfg, limits) -> str:
    """The vllm serve command (rlkit.serve.vllm) for these arguments, with notes as shell comments."""
    from rlkit.serve.vllm import API_SERVER_MODULE, format_command, vllm_command

    base, model_len, dtype, notes = _vllm_plan(args, adapters, policy_cfg, limits, must_exist=False)
    executable = None
    if args.engine == "vllm":
        from rlkit.serve.vllm_server import vllm_python

        executable = [str(vllm_python(args.vllm_python)), "-m", API_SERVER_MODULE]
    argv = vllm_command(base, args.base_name, adapters, model_len, limits.max_images, host=args.host,
                        port=args.port, dtype=dtype, api_key_env=getattr(args, "key_env", args.api_key_env),
                        executable=executable)
    head = [f"# {n}" for n in notes]
    return "\n".join([*head, format_command(argv)])


def _vllm_launch(args, adapters, policy_cfg, limits, api_key):
    """The vLLM server to start (rlkit.serve.vllm_server.VllmLaunch); raises ValueError / AdapterError."""
    from rlkit.serve.vllm import API_SERVER_MODULE, vllm_command
    from rlkit.serve.vllm_server import VllmLaunch, child_env, vllm_python

    python = vllm_python(args.vllm_python)
    base, model_len, dtype, notes = _vllm_plan(args, adapters, policy_cfg, limits, must_exist=True)
    argv = vllm_command(base, args.base_name, adapters, model_len, limits.max_images, host=args.host,
                        port=args.port, dtype=dtype, executable=[str(python), "-m", API_SERVER_MODULE])
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    for n in notes:
        print(f"[rlkit] {n}")
    return VllmLaunch(argv=argv, env=child_env(args.threads or os.cpu_count() or 1, api_key),
                      url=f"http://{host}:{args.port}", dtype=dtype,
                      probe_names=[args.base_name, *(a.name for a in adapters)])


def _probe_expected(args, adapters, policy_cfg, cfg, launch):
    """rlkit's answers to the probe (rlkit.serve.vllm_server.trainer_answers) plus the probe's max_tokens."""
    from rlkit.serve.config import instantiate_env
    from rlkit.serve.vllm_server import trainer_answers

    max_tokens = int(cfg.rollout.max_new_tokens)
    base = launch.argv[launch.argv.index("--model") + 1]
    answers, messages, allowed = trainer_answers(policy_cfg, adapters, base, args.base_name, launch.probe_names,
                                                 instantiate_env(cfg), max_tokens, args.allow_base_mismatch)
    return answers, messages, allowed, max_tokens


if __name__ == "__main__":
    sys.exit(main())
