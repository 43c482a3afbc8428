"""Headline benchmark: greedy success of the main job over GRPO steps, for several seeds, against the target.

Runs ``train.py`` (the default config unless overrides are given) once per seed in a subprocess,
then reads each run's metrics.jsonl and prints the evaluation curve: greedy success on the fixed
evaluation set vs GRPO step and vs training wall time (seconds, SFT excluded: it is cached and
reported separately), the first step/time at which the target is reached, and writes
``headline.json`` (+ ``headline.png`` when matplotlib is available) in the output folder.

    .venv/bin/python -m bench.bench_headline --seeds 0 1 2 --out runs/headline
    .venv/bin/python -m bench.bench_headline --out runs/headline_interactive -- env=visgym_interactive
    .venv/bin/python -m bench.bench_headline --seeds 0 --out runs/gap -- eval.seen_tasks=64     # + trained-on tasks

With ``eval.seen_tasks`` the runs also evaluate the tasks they trained on: a ``trained-on`` column and dotted
curves beside the held-out ones (the generalisation gap; on 7x7 the warm start has seen every training layout).

Each seed also runs its control (``--control``, default ``fixed_image``: the same job fed one fixed
image, rlkit/controls.py) from the same warm start, plotted dashed beside it, and prints
``control fixed_image: warm start X% -> Z% after N steps (seed S)``: a rise that the control
shows too is the answer prior being learned, not the mazes being read. ``--control none`` skips it;
``--control-seeds 0`` runs it beside seed 0 only.

The seeds run one after another. The default job already uses two cores (``backend=native_ray_ddp``:
two replicated ranks, one torch thread each), so on a 2-core machine run its seeds one at a time.
Single-process recipes (``backend=native``) can run one per core: start them yourself
(``OMP_NUM_THREADS=1 taskset -c N .venv/bin/python train.py seed=S logger=console <overrides>
hydra.run.dir=<out>/seed<S>``, and ``control=fixed_image`` into ``<out>/seed<S>_fixed_image``), then
collect them with ``--reuse``.

Every printed summary line ends with the machine and the policy's dtype, e.g.
``[AMD EPYC; avx2; no native bf16; float32]``, and headline.json keeps them per run (``machine``: the CPU
model, arch, the flags avx2 / avx512f / avx512_bf16 / amx_bf16 / amx_tile it has and whether bf16 matmuls
are native, rlkit.hardware.cpu_record; ``dtype``: the run's resolved ``policy.dtype``). A run trained here
writes ``bench_machine.json`` into its folder, so a ``--reuse`` later, on any machine, names the machine that
trained it ("machine unknown" for a folder from before). The dtype is result.json's ``policy_dtype`` when
it has one, else the run's ``.hydra/config.yaml`` (where train.py writes the resolved value).

Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT
from rlkit.hardware import cpu_record

MACHINE_FILE = "bench_machine.json"


def run_machine(run_dir: Path) -> dict | None:
    """The machine that trained ``run_dir`` (its ``bench_machine.json``), or None when unrecorded."""
    f = run_dir / MACHINE_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def run_dtype(run_dir: Path, result: dict) -> str | None:
    """The policy dtype ``run_dir`` trained in: result.json's ``policy_dtype``, else ``policy.dtype`` of its
    ``.hydra/config.yaml`` (train.py records the resolved value there); None when neither says."""
    if result.get("policy_dtype"):
        return str(result["policy_dtype"])
    f = run_dir / ".hydra" / "config.yaml"
    if not f.is_file():
        return None
    from omegaconf import OmegaConf

    return OmegaConf.select(OmegaConf.load(f), "policy.dtype", default=None)


def machine_tag(machine: dict | None, dtype: str | None) -> str:
    """``[<CPU model>; <flags>; native bf16 | no native bf16; <dtype>]`` for the end of a printed line."""
    if machine is None:
        where = "machine unknown"
    else:
        where = (f"{machine.get('cpu') or 'unknown CPU'}; {' '.join(machine.get('flags') or []) or 'no avx2'}; "
                 f"{'native bf16' if machine.get('native_bf16') else 'no native bf16'}")
    return f"[{where}; {dtype or 'dtype unknown'}]"


def curve(run_dir: Path) -> list[dict]:
    """[{step, wall_time_s, success[, seen]}] for every evaluation of a run (step 0 = before training);
    ``seen``: greedy success on the tasks the run trained on, when it ran with ``eval.seen_tasks``."""
    rows, wall = [], {0: 0.0}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "trainer/wall_time_s" in m:
            wall[m["step"]] = m["trainer/wall_time_s"]
        if "eval/success_rate" in m:
            rows.append({"step": m["step"], "success": m["eval/success_rate"],
                         **({"seen": m["eval_seen/success_rate"]} if "eval_seen/success_rate" in m else {})})
    for r in rows:
        r["wall_time_s"] = wall.get(r["step"], max(wall.values()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds to run (default: 0 1 2)")
    ap.add_argument("--out", default="runs/headline",
                    help="folder for the runs (seed<S>/, seed<S>_<control>/), headline.json and headline.png "
                         "(default: runs/headline)")
    ap.add_argument("--target", type=float, default=0.95,
                    help="success rate whose first evaluation at or above it is reported (default: 0.95)")
    ap.add_argument("--control", default="fixed_image", choices=["fixed_image", "shuffled_reward", "none"],
                    help="the control run beside each seed (rlkit/controls.py); none = no control")
    ap.add_argument("--control-seeds", type=int, nargs="+", default=None,
                    help="run the control beside these seeds only (default: every seed); for long jobs, where "
                         "one control shows what the task's prior gives at a fraction of the cost")
    ap.add_argument("--reuse", action="store_true",
                    help="a run folder that already holds a result.json is read, not trained again (re-plot a "
                         "finished benchmark, or fill it with runs made side by side on other cores)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for train.py (after --)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = {"overrides": args.overrides, "target": args.target, "machine": cpu_record(), "runs": []}
    def train(run_dir: Path, seed: int, extra: list[str]) -> float | None:
        """Run train.py into run_dir; its wall time in seconds (None for a reused run)."""
        if args.reuse and (run_dir / "result.json").is_file():
            print(f"reusing {run_dir}", flush=True)
            return None
        cmd = [sys.executable, str(ROOT / "train.py"), f"seed={seed}", "logger=console", *args.overrides, *extra,
               f"hydra.run.dir={run_dir}"]
        print("+", " ".join(cmd), flush=True)
        t0 = time.time()
        subprocess.run(cmd, cwd=ROOT, check=True, env=dict(os.environ, WANDB_MODE="offline"))
        (run_dir / MACHINE_FILE).write_text(json.dumps(cpu_record()))
        return time.time() - t0

    for seed in args.seeds:
        run_dir = out / f"seed{seed}"
        total = train(run_dir, seed, [])
        result = json.loads((run_dir / "result.json").read_text())
        rows = curve(run_dir)
        control = None
        if args.control != "none" and (args.control_seeds is None or seed in args.control_seeds):
            c_dir = out / f"seed{seed}_{args.control}"
            train(c_dir, seed, [f"control={args.control}"])
            c_result = json.loads((c_dir / "result.json").read_text())
            control = {"control": args.control, "result": c_result, "curve": curve(c_dir),
                       "machine": run_machine(c_dir), "dtype": run_dtype(c_dir, c_result)}
        hit = next((r for r in rows if r["success"] >= args.target), None)
        sft = None  # the warm start this run started from (result.json names it), not whichever cache entry sorts last
        summary_path = result.get("warm_start_dir") and Path(result["warm_start_dir"]) / "sft_summary.json"
        if summary_path and summary_path.is_file():
            sft = json.loads(summary_path.read_text())
        machine, dtype = run_machine(run_dir), run_dtype(run_dir, result)
        tag = machine_tag(machine, dtype)
        report["runs"].append({"seed": seed, "machine": machine, "dtype": dtype, "result": result, "curve": rows,
                               "process_wall_s": total,
                               "reached_target_at": hit, "sft": sft and {k: sft[k] for k in ("steps", "val_success", "wall_time_s")},
                               "control": control})
        before = result["eval_success_before"]
        print(f"\nheadline: warm start {'-' if before is None else f'{before:.1%}'} -> {result['eval_success_after']:.1%} "
              f"after {result['steps_completed']} steps in {result['wall_time_s']:.0f} s (seed {seed}; "
              + ("reused)" if total is None else f"{total:.0f} s with the one-time builds of a first run)") + f" {tag}")
        if control is not None:
            c_res = control["result"]
            print(f"control {args.control}: warm start {c_res['eval_success_before']:.1%} -> "
                  f"{c_res['eval_success_after']:.1%} after {c_res['steps_completed']} steps (seed {seed}) "
                  f"{machine_tag(control['machine'], control['dtype'])}")
        c_by_step = {r["step"]: r["success"] for r in control["curve"]} if control else {}
        has_seen = any("seen" in r for r in rows)  # eval.seen_tasks: success on trained-on tasks beside the held-out
        print(f"{'step':>6} {'train s':>8} {'success':>8}" + (f" {'trained-on':>10}" if has_seen else "")
              + (f" {'control':>8}" if control else "") + f"  {tag}")
        for r in rows:
            s = (f" {r['seen']:>10.1%}" if "seen" in r else " " * 11) if has_seen else ""
            c = f" {c_by_step[r['step']]:>8.1%}" if r["step"] in c_by_step else ""
            print(f"{r['step']:>6} {r['wall_time_s']:>8.0f} {r['success']:>8.1%}{s}{c}")
        print("target reached:", f"step {hit['step']} at {hit['wall_time_s']:.0f}s" if hit else "no", tag)
    (out / "headline.json").write_text(json.dumps(report, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for run in report["runs"]:
            steps = [r["step"] for r in run["curve"]]
            walls = [r["wall_time_s"] / 60 for r in run["curve"]]
            succ = [100 * r["success"] for r in run["curve"]]
            line = axes[0].plot(steps, succ, marker="o", label=f"seed {run['seed']}")[0]
            axes[1].plot(walls, succ, marker="o", label=f"seed {run['seed']}", color=line.get_color())
            seen = [r for r in run["curve"] if "seen" in r]
            if seen:  # eval.seen_tasks: the same policy on tasks it trained on, dotted
                label = f"seed {run['seed']}, trained-on tasks"
                axes[0].plot([r["step"] for r in seen], [100 * r["seen"] for r in seen], ls=":",
                             color=line.get_color(), label=label)
                axes[1].plot([r["wall_time_s"] / 60 for r in seen], [100 * r["seen"] for r in seen], ls=":",
                             color=line.get_color(), label=label)
            if run["control"]:
                c = run["control"]["curve"]
                label = f"seed {run['seed']}, control {run['control']['control']}"
                axes[0].plot([r["step"] for r in c], [100 * r["success"] for r in c], ls="--", marker="x",
                             color=line.get_color(), label=label)
                axes[1].plot([r["wall_time_s"] / 60 for r in c], [100 * r["success"] for r in c], ls="--",
                             marker="x", color=line.get_color(), label=label)
        for ax, xl in zip(axes, ["GRPO step", "training wall time (min)"]):
            ax.axhline(100 * args.target, color="gray", ls="--", lw=1)
            ax.set_xlabel(xl)
            ax.set_ylabel("greedy success (%): the eval set; dotted: trained-on tasks"
                          if any("seen" in r for run in report["runs"] for r in run["curve"])
                          else "greedy success on the eval set (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        tags = sorted({machine_tag(run["machine"], run["dtype"]) for run in report["runs"]})
        fig.suptitle(" / ".join(tags), fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "headline.png", dpi=110)
    except ImportError:
        pass
    print(f"\nwritten: {out / 'headline.json'}")


if __name__ == "__main__":
    main()
