"""Grounding accuracy over steps, beside its blind control (issue 19).

Trains the tiny policy's grounding stage (rlkit.stages.grounding) twice from the same initial weights:
once on the real images, once with every image replaced by one fixed image (the blind control,
which can learn only the questions' prior). Writes per-task held-out exact-match accuracy vs step
for both to ``<out>/grounding_curve.json`` and ``<out>/grounding_curve.png`` and prints the table.

    .venv/bin/python -m bench.bench_grounding --steps 600 --out bench_out/grounding
    .venv/bin/python -m bench.bench_grounding --tasks cell --steps 200        # one task
    .venv/bin/python -m bench.bench_grounding --env visgym_small --tasks walls --steps 300     # 7x7 wall bits

Give it a core of its own (it sets 1 torch thread); a run of 600 steps takes about 10 minutes
per arm on one core of the 2-core dev machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.common import ROOT
from envs.visgym.spec import VisGymMaze
from rlkit.config import GroundingConfig
from rlkit.policy import load_policy
from rlkit.policy.tiny import default_cache_dir
from rlkit.stages.grounding import format_table, train_grounding


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tasks", default="", help="comma-separated task names (default: grounding.tasks' default)")
    p.add_argument("--seed", type=int, default=0, help="weight-init seed of the tiny policy")
    p.add_argument("--env", default="visgym", help="a VisGym config of conf/env/ (its variant and cell size; the "
                   "tiny policy's image grid for it from conf/image_grid/ when there is one)")
    p.add_argument("--tiny", default="{}", help="JSON overrides of conf/policy/tiny_vl.yaml's tiny sizes")
    p.add_argument("--dtype", default=None, help="policy dtype (default: conf/policy/tiny_vl.yaml's, auto: bfloat16 with native bf16 matmuls, else float32)")
    p.add_argument("--cache-dir", default=str(default_cache_dir()), help="tiny checkpoints (default: a job's, rlkit/cache_dir.py)")
    p.add_argument("--out", default=str(ROOT / "bench_out" / "grounding"))
    p.add_argument("--arms", default="image,blind")
    args = p.parse_args()
    torch.set_num_threads(1)
    policy_cfg = OmegaConf.load(ROOT / "conf/policy/tiny_vl.yaml")
    sizes = OmegaConf.to_container(policy_cfg.tiny)
    args.dtype = args.dtype or policy_cfg.dtype
    env_cfg = OmegaConf.load(ROOT / "conf/env" / f"{args.env}.yaml")
    grid = ROOT / "conf/image_grid" / f"tiny_vl_{args.env}.yaml"
    if grid.is_file():
        sizes.update(OmegaConf.to_container(OmegaConf.load(grid)))
    sizes.update(json.loads(args.tiny))
    cfg = GroundingConfig(max_steps=args.steps, eval_every=args.eval_every, batch_size=args.batch_size, lr=args.lr,
                          tasks=[t for t in args.tasks.split(",") if t] if args.tasks else GroundingConfig().tasks, target_accuracy=2.0)  # never stop early
    env = VisGymMaze(variant=env_cfg.variant, cell_size=env_cfg.get("cell_size", 25))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for arm in args.arms.split(","):
        policy = load_policy(tiny=sizes, lora={"enabled": False}, cache_dir=args.cache_dir, seed=args.seed,
                             dtype=args.dtype)
        t0 = time.time()

        def progress(step, total, loss, table, arm=arm):
            if step % args.eval_every == 0 or step == total:
                acc = " ".join(f"{k} {v:.1%}" for k, v in (table or {}).items())
                print(f"[{arm}] step {step}/{total} loss {loss:.4f} | {acc} | {time.time() - t0:.0f}s", flush=True)

        results[arm] = train_grounding(env, policy, cfg, blind=(arm == "blind"), progress=progress)
    record = {"config": vars(args), "sizes": sizes, "arms": results}
    (out / "grounding_curve.json").write_text(json.dumps(record, indent=1))
    print(format_table({arm: r["final"] for arm, r in results.items()}))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: wrote the JSON only")
        return
    tasks = sorted({k for r in results.values() for h in r["history"] for k in h["accuracy"]})
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm, r in results.items():
            xs = [h["step"] for h in r["history"] if task in h["accuracy"]]
            ys = [h["accuracy"][task] for h in r["history"] if task in h["accuracy"]]
            ax.plot(xs, ys, marker="o", ms=3, label=arm, linestyle="-" if arm == "image" else "--")
        ax.set_title(task)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out accuracy (wall_bits: per bit)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(out / "grounding_curve.png", dpi=110)
    print(f"wrote {out / 'grounding_curve.json'} and {out / 'grounding_curve.png'}")


if __name__ == "__main__":
    main()
