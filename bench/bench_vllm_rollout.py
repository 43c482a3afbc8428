"""One training step's rollout with rlkit's engine and with vLLM's CPU engine (``rollout.engine=vllm``), on a warm start.

    RLKIT_CACHE_DIR=... python -m bench.bench_vllm_rollout --base .cache/sft/<key>          # ~2 minutes
    python -m bench.bench_vllm_rollout --base CKPT --tasks 16 --group 8 --reps 3 --json out.json

What is measured (wall clock, median and min over ``--reps`` after one warm-up call, one thread a process):
- the engines' start-up: rlkit's engine needs none beyond the policy; vLLM's from spawn to ready (rlkit.policy.vllm_engine);
- ``rlkit.rollout.rollout`` of ``--tasks`` plan-mode 7x7 mazes x ``--group`` samples at temperature 0.7 (the default
  recipe's step without its DAPO rounds), with the base weights (LoRA B = 0 as at the start of a run: vLLM still runs
  its LoRA kernels) and with a trained-looking adapter (random B, seeded) loaded into both: rlkit's in place, vLLM's
  as a new LoRA id; for vLLM also the seconds the vLLM process itself spent (the rest is the pipe, PNG encoding, the
  per-call check of the expanded ids and decoding).

The machine is named in the output (CPU model and flags: rlkit.hardware.cpu_record).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.common import randomise_lora_b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a warm-start checkpoint directory (e.g. .cache/sft/<key>)")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (the tiny policy's default)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)

    import torch

    from envs.visgym import VisGymMaze
    from rlkit.hardware import cpu_record
    from rlkit.policy import SamplingParams, load_policy, make_engine
    from rlkit.policy.vllm_engine import VllmEngine, max_images_for
    from rlkit.rollout import rollout

    torch.set_num_threads(1)
    spec = VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")
    pol = load_policy(name="bench", path=args.base, dtype="float32", device="cpu",
                      lora={"rank": args.rank, "alpha": 2 * args.rank}, seed=0)
    seeds = list(range(1000, 1000 + args.tasks))
    sampling = SamplingParams(temperature=0.7, max_new_tokens=48, seed=0, stop=tuple(spec.stop_strings))
    out: dict = {"machine": cpu_record(), "tasks": args.tasks, "group": args.group, "reps": args.reps}

    def timed(engine, label: str) -> None:
        rollout(spec, pol, engine, seeds, args.group, sampling, policy_version=0)  # warm-up
        wall, inner = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            trajs = rollout(spec, pol, engine, seeds, args.group, sampling, policy_version=0)
            wall.append(time.perf_counter() - t0)
            inner.append(engine.last_stats.extra.get("vllm_s"))
        row = {"median_s": statistics.median(wall), "min_s": min(wall),
               "tokens": sum(t.num_policy_tokens for t in trajs)}
        if inner[0] is not None:
            row["vllm_process_s"] = statistics.median(inner)
        out[label] = row
        print(f"{label:28s} {row['median_s']:6.2f} s median, {row['min_s']:6.2f} s min"
              + (f", vLLM process {row['vllm_process_s']:.2f} s" if "vllm_process_s" in row else "")
              + f" ({row['tokens']} policy tokens)", flush=True)

    rl = make_engine(pol)
    timed(rl, "rlkit, LoRA B=0")  # before vLLM starts: its start-up would share the core
    vl = VllmEngine(pol, max_images=max_images_for(spec), probe=False)
    out["vllm_startup_s"] = vl.wait_ready()
    print(f"vLLM ready after {out['vllm_startup_s']:.1f} s ({vl.versions})", flush=True)
    tmp = Path(vl.log_path).with_suffix("")
    pol.save_adapter(tmp / "v0", version=0)
    vl.load_adapter(tmp / "v0")
    timed(vl, "vllm, LoRA B=0")
    randomise_lora_b(pol.model, 1, 0.05)
    pol.save_adapter(tmp / "v1", version=1)
    t0 = time.perf_counter()
    vl.load_adapter(tmp / "v1")
    out["vllm_adapter_load_s"] = time.perf_counter() - t0
    timed(rl, "rlkit, trained-looking LoRA")
    timed(vl, "vllm, trained-looking LoRA")
    vl.close()
    print(json.dumps({"machine": out["machine"]}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
