"""The 9x9 recipe with a larger tiny Qwen3-VL on one GPU: warm start + GRPO inside one time budget.

    python -m bench.gpu_9x9 --budget-s 480             # on a CUDA machine (what it is for)
    python -m bench.gpu_9x9 --dry-run                  # the same phases, tiny, on CPU (~3 minutes)
    bash bench/gpu_interactive.sh [--sizes 8b_shapes] # the interactive setting (--mode interactive), <= 10 minutes
    python -m bench.gpu_9x9 --dry-run --mode interactive --budget-s 420 --threads 1     # its CPU dry run (~6 minutes)

It answers issue 19's GPU question: with a GPU's speed, does a larger tiny policy (bench/common.py's
GPU_SIZES, ~106M parameters) learn VisGym maze_2d/easy (``env=visgym``, 9x9, evaluated on upstream's
visgym_easy_64) from scratch inside one prepared run of a few minutes? Everything goes through
``train.py`` (the product path), in three subprocesses sharing one cache folder:

1. probe: a 20-step warm start (one 8-task validation) and 3 GRPO steps (interactive: 2), to time an SFT step and a
   GRPO step on this device (the first steps include CUDA warm-up, so the estimates are high, not low).
2. warm start: ``steps=0``, the SFT stage sized from the probe to ``--sft-share`` of the time left
   (max_steps; it stops earlier at ``sft.target_success``); its checkpoint is cached by config hash.
3. GRPO: the same SFT config (a cache hit), the step count sized from the probe to what is left, the
   7x7 recipe's algorithm (conf/recipe/tiny_vl_visgym_small.yaml: cosine lr, 16 tasks x 8, dynamic
   sampling, demonstrations on all-fail groups, LoRA on the vision tower), a greedy evaluation of the
   64 held-out mazes and of the first 64 trained-on mazes (``eval.seen_tasks``) every ~10% of the run.

Writes <out>/summary.json (printed as ``gpu_9x9: <key> <value>`` lines) with the SFT curve (steps,
validation success on 64 held-out training mazes), the GRPO curve (held-out and trained-on greedy
success over steps), per-phase wall times and the device; plus each phase's log, the run's
metrics.jsonl, result.json and sft_summary.json. Exit status 0 when every phase completed.

No blind control runs here (the budget fits one run); on CPU the 7x7 default's fixed-image control
ends at 7.8% (docs/experiments.md).

Measured on one H200 (2026-12-04, torch 2.11.0+cu130 of the machine's image, rlkit's pinned transformers
5.8.1 / peft 0.18.1 / hydra 1.3.8 carried as wheels; docs/experiments.md, "The 9x9 recipe on a GPU"):
the whole CUDA path of ``backend=native`` ran (bf16, SDPA, the shared-prefix update, LoRA on the vision
tower, dynamic sampling, demonstrations, greedy and trained-on evaluations). A warm-start step took
0.31 s (32 demonstrations, mostly host-side rendering and preprocessing); a GRPO step 3.1 s (64 groups
of 8 sampled, rollout 1.7 s; update 1.4 s for ~7 informative groups and ~15 demonstrations, about 1% of
the chip's bf16 peak). The 106M policy did not learn 9x9 routes from scratch at ``--sft-lr 5e-4``: 4.7%
validation success after 700 warm-start steps (loss flat at ~0.18 from step 375), where the 2.3M CPU
policy reaches 45% in ~1,100.

``--mode`` picks the setting (MODES): ``plan`` (the default, as above: one turn, the whole route out) or
``interactive`` (issue 65): ``env=visgym_interactive``, one ``('move', d)`` per turn with a new picture and
feedback each turn, 18 turns (they admit all 64 evaluation mazes), the tuple parser, 16 new tokens a turn; the
warm start trains on the env's multi-turn demonstrations (rlkit.demonstrations.demonstration_trajectory), a fresh
batch every step as in plan mode; GRPO is the same recipe. Its probe times 2 GRPO steps (limit 240 s) and its
default budget is 540 s. **The interactive mode has not run on a GPU yet**: only its CPU dry run (tiny sizes,
2 demonstrations and 2 x 2 episodes a step, one sampling round, float32 on a CPU without native bf16) has run to
the end (its probe measured 3.2 s a warm-start step and 14 s a GRPO step on one loaded core; 335 s in all).

``--sizes`` picks the policy of a GPU run (SIZES): ``gpu`` (GPU_SIZES, ~106M, the default) or ``8b_shapes``
(QWEN3_VL_8B_SHAPES, ~506M): the 8B config's shapes "where they fit" means the per-layer widths and heads of
conf/policy/qwen3_vl_8b.yaml's Qwen3-VL-8B-Instruct are kept (text hidden 4096, 32 query / 8 KV heads of 128,
mrope_section [24, 20, 20], SwiGLU 12288; vision hidden 1152, 16 heads, MLP 4304, merger out 4096; LoRA r32 /
alpha 64 as that config) and the depth is cut to 2 of 36 decoder layers and 2 of 27 vision blocks (one DeepStack
level of three), with the tiny tokenizer (1,024 tokens, not 151,936), the tiny image geometry (4 px patches,
one image token per maze cell, not 16 px patches) and rope_theta 1e4 (not 5e6): so a step's matmuls have the 8B's
shapes per layer, the weights and a bf16 full fine-tuning fit one H100 (~506M parameters: ~1 GB of bf16 weights,
~4 GB with gradients and AdamW state, plus activations of 32 interactive demonstrations of ~1,700 tokens, an
estimate, not measured), and a step costs ~1/18 of the 8B decoder's work per token (2 of 36 layers), so the
probe should leave the warm start and GRPO tens of steps each in the 10 minutes (the step counts are sized from the
probe, whatever they turn out to be). Its learning rates are the 106M policy's, untuned. The dry run builds
conf/policy/tiny_vl.yaml's defaults whatever ``--sizes`` says. The overrides of ``--mode interactive`` and
``--sizes 8b_shapes`` compose with the train schema (tests/backends/test_gpu_9x9.py); neither has run on a GPU.

Bounded: each phase is a subprocess killed at its limit, and every limit ends by the deadline (--budget-s, from the
script's start), so the script ends within the budget plus its start (a few seconds) and the summary;
bench/gpu_interactive.sh adds a hard ``timeout`` (590 s + 10 s to kill) around it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.common import GPU_SIZES, ROOT, Deadline, metrics_rows, run_phase, train_env

#: The 7x7 recipe's GRPO settings (conf/recipe/tiny_vl_visgym_small.yaml) as of the H200 run, applied to 9x9. The
#: recipe has since added ``algorithm.entropy_coef=0.01`` (session 14, measured on CPU only): pass it through
#: ``--extra`` to try it here.
RECIPE = ["tasks_per_step=16", "group_size=8", "optim.lr_schedule=cosine",
          "sampling=dapo", "sampling.max_rounds=3", "sampling.adaptive_batch=true",
          "algorithm.filter_zero_variance_groups=true", "aux_loss.demo_coef=0.3",
          "policy.lora.include_vision=true"]


#: The widths and heads of conf/policy/qwen3_vl_8b.yaml's model (Qwen/Qwen3-VL-8B-Instruct's config.json) with a few
#: layers, as policy.tiny sizes (rlkit/policy/tiny.py TinyVLSizes). Kept from the 8B: text hidden 4096, 32 query heads
#: and 8 KV heads of head_dim 128 (so mrope_section [24, 20, 20], as the 8B's), SwiGLU 12288; vision hidden 1152, 16
#: heads (head dim 72), MLP 4304, out_hidden_size 4096 (= text hidden, which the builder sets). Cut: 2 of 36 decoder
#: layers, 2 of 27 vision blocks, one DeepStack level (block 0 -> decoder layer 0; the 8B adds blocks 8/16/24 to
#: layers 0-2), the tiny tokenizer's 1,024-token vocabulary (the 8B: 151,936), the tiny image geometry (4 px
#: patches, 81 image tokens per 9x9 maze, one per cell; the 8B: 16 px patches), rope_theta 1e4 (the 8B: 5e6).
#: ~506M parameters (vision tower 111M, mostly its two 4608 -> 4096 patch mergers; decoder 394M).
QWEN3_VL_8B_SHAPES = dict(text_hidden=4096, text_layers=2, text_heads=32, text_kv_heads=8, head_dim=128,
                          text_intermediate=12288, vision_hidden=1152, vision_depth=2, vision_heads=16,
                          vision_intermediate=4304)

#: --sizes: the policy.tiny sizes of the GPU run (the dry run builds conf/policy/tiny_vl.yaml's defaults).
SIZES = {"gpu": GPU_SIZES, "8b_shapes": QWEN3_VL_8B_SHAPES}
#: --sizes 8b_shapes also takes the 8B config's adapter shape (conf/policy/qwen3_vl_8b.yaml: LoRA r32, alpha 64).
SIZES_POLICY = {"gpu": {}, "8b_shapes": {"policy.lora.rank": "32", "policy.lora.alpha": "64"}}

#: --mode: plan = conf/env/visgym.yaml (one turn, the whole route out); interactive = conf/env/visgym_interactive.yaml
#: (one ('move', d) per turn, a new picture each turn, 18 turns). A move is 5-6 tokens + <|im_end|>, so 16 new tokens
#: a turn. Both warm starts stream (conf/train.yaml's sft.num_demos=0: a fresh batch of tasks every step); an
#: interactive demonstration renders and encodes one picture a turn (~45 ms on a loaded CPU core, 9x a plan's).
MODES = {"plan": {"env": "visgym"},
         "interactive": {"env": "visgym_interactive", "rollout.max_new_tokens": "16"}}

#: Default --budget-s per mode (seconds, all phases together). Both fit bench/gpu_interactive.sh's 10-minute
#: backstop (590 s + 10 s) with the process start and the summary.
DEFAULT_BUDGET_S = {"plan": 480.0, "interactive": 540.0}

#: The probe per mode: GRPO steps it times (the first warms up; the max of the others is the estimate) and its time
#: limit. An interactive step runs 18 turns per rollout round, up to sampling.max_rounds=3 rounds.
PROBE = {"plan": {"grpo_steps": 3, "limit_s": 150.0}, "interactive": {"grpo_steps": 2, "limit_s": 240.0}}


def common(dry: bool, sft_lr: float, lr: float, mode: str = "plan", sizes: str = "gpu") -> dict[str, str]:
    """Overrides shared by every phase (the SFT cache key must match between phases 2 and 3).

    Args: dry: the CPU dry run (conf/policy/tiny_vl.yaml's sizes, small batches, no CUDA settings); sft_lr / lr:
        the warm start's and GRPO's learning rates; mode: a MODES key; sizes: a SIZES key (not read by the dry run).
    Returns: {override key: value} for train.py (``key=value`` each).
    Raises: ValueError for an unknown mode or sizes.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {sorted(MODES)}")
    if sizes not in SIZES:
        raise ValueError(f"sizes {sizes!r} is not one of {sorted(SIZES)}")
    ov = dict(a.split("=", 1) for a in RECIPE)
    ov.update({"env": "visgym", "reward": "maze_exit", "backend": "native", "logger": "console",
               "grounding.enabled": "false", "policy.attn_implementation": "sdpa", "policy.dtype": "bfloat16",
               "sft.lr": str(sft_lr), "sft.batch_size": "32", "sft.val_tasks": "64", "lr": str(lr),
               "trainer.quiet": "true", "trainer.ckpt_interval": "0"})
    ov.update(MODES[mode])
    if dry:
        ov.update({"policy.device": "cpu", "sft.val_tasks": "8", "eval.num_tasks": "8", "tasks_per_step": "2",
                   "group_size": "4"})
        if mode == "interactive":
            # 18-turn episodes (~1,700 tokens with their 18 pictures; plan: ~210): 2 demonstrations and 2 x 2
            # episodes a step in one sampling round, float32 where the CPU has no native bf16 matmuls (in emulated
            # bf16 the probe's 20 warm-start steps of 4 did not finish in 240 s on an AVX2 core)
            ov.update({"sft.batch_size": "2", "group_size": "2", "sampling.max_rounds": "1", "policy.dtype": "auto"})
    else:
        ov.update({"policy.device": "cuda", "algorithm.shared_prefix": "true"})
        ov.update({f"policy.tiny.{k}": str(v) for k, v in SIZES[sizes].items()})
        ov.update(SIZES_POLICY[sizes])
    return ov


def newest_sft_summary(cache: Path) -> Path | None:
    """The newest sft_summary.json under the cache (None if no warm start was saved): the probe's and the
    warm start's builds share the cache, so the last one written is the phase that just ran."""
    found = sorted((cache / "sft").glob("*/sft_summary.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny, on CPU")
    ap.add_argument("--mode", choices=sorted(MODES), default="plan",
                    help="plan: one turn, the whole route (env=visgym); interactive: one move a turn, 18 turns "
                         "(env=visgym_interactive)")
    ap.add_argument("--sizes", choices=sorted(SIZES), default="gpu",
                    help="gpu: ~106M (bench/common.py GPU_SIZES); 8b_shapes: Qwen3-VL-8B's widths and heads, "
                         "2 decoder layers, 2 vision blocks (~506M). Not read by --dry-run")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="deadline for all phases together (seconds; default: 480 plan, 540 interactive)")
    ap.add_argument("--threads", type=int, default=4,
                    help="OMP_NUM_THREADS of the train.py phases (the warm start's build threads)")
    ap.add_argument("--sft-share", type=float, default=0.4, help="share of the time after the probe for the warm start")
    ap.add_argument("--sft-lr", type=float, default=5e-4, help="warm start learning rate (full fine-tuning)")
    ap.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate (LoRA)")
    ap.add_argument("--sft-steps", type=int, default=None, help="warm start max_steps (default: sized from the probe)")
    ap.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: sized from the probe)")
    ap.add_argument("--extra", nargs="*", default=[], help="more train.py overrides for every phase (key=value)")
    ap.add_argument("--out", default=None, help="output folder (default: gpu_9x9_out/<UTC time>)")
    args = ap.parse_args()
    bad = [kv for kv in args.extra if "=" not in kv]
    if bad:
        print(f"gpu_9x9: FAILED: --extra {bad} not key=value (e.g. --extra algorithm.entropy_coef=0.01)", flush=True)
        return 2
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S[args.mode]
    if not args.budget_s > 0 or args.threads < 1:
        print(f"gpu_9x9: FAILED: --budget-s {args.budget_s} and --threads {args.threads} must be positive", flush=True)
        return 2
    deadline = Deadline(args.budget_s)
    t_start = time.monotonic()
    out = Path(args.out or ROOT / "gpu_9x9_out" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())).resolve()
    if out.exists() and any(out.iterdir()):
        # its run folders would hold another run's checkpoints, and train.py refuses to resume across a
        # changed warm start (seen on a GPU machine kept warm between two calls)
        print(f"gpu_9x9: FAILED: {out} is not empty (an earlier run's folders); pass a new --out", flush=True)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"

    import torch

    # "mode" is the setting (--mode); "run" says where it ran (before interactive mode, "mode" held that)
    summary: dict = {"mode": args.mode, "run": "dry-run (cpu)" if args.dry_run else "gpu", "budget_s": args.budget_s,
                     "torch": torch.__version__, "sizes_name": "tiny_vl defaults" if args.dry_run else args.sizes,
                     "sizes": {} if args.dry_run else SIZES[args.sizes], "sft_lr": args.sft_lr, "lr": args.lr}
    if not args.dry_run:
        if not torch.cuda.is_available():
            print(f"gpu_9x9: FAILED: torch {torch.__version__} sees no CUDA device; run --dry-run on CPU", flush=True)
            return 1
        summary["device_name"] = torch.cuda.get_device_name(0)
    env = train_env(out, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    shared = common(args.dry_run, args.sft_lr, args.lr, args.mode, args.sizes)
    shared.update(kv.split("=", 1) for kv in args.extra)
    summary["extra"] = args.extra

    def train_cmd(**phase: object) -> list[str]:
        """train.py with the shared overrides, then this phase's (keys with '.' written as '__')."""
        ov = dict(shared, **{k.replace("__", "."): str(v) for k, v in phase.items()})
        return [sys.executable, str(ROOT / "train.py"), *(f"{k}={v}" for k, v in ov.items())]
    failures: list[str] = []

    def finish() -> int:
        summary["total_s"] = round(time.monotonic() - t_start, 1)
        summary["failures"] = failures
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        for k, v in summary.items():
            if k not in ("sft_curve", "grpo_curve"):
                print(f"gpu_9x9: {k} {json.dumps(v)}", flush=True)
        for row in summary.get("sft_curve", []):
            print(f"gpu_9x9: sft step {row['step']:5d}  val success {100 * row['val_success']:5.1f}%  loss {row['loss']:.3f}")
        for row in summary.get("grpo_curve", []):
            seen = f"  trained-on {100 * row['seen']:5.1f}%" if row.get("seen") is not None else ""
            print(f"gpu_9x9: grpo step {row['step']:4d}  held-out {100 * row['eval']:5.1f}%{seen}  t {row['t']:.0f} s")
        print("gpu_9x9: " + ("OK" if not failures else "FAILED: " + "; ".join(failures)), flush=True)
        return 0 if not failures else 1

    # 1. probe: time an SFT step (20 steps, an 8-task validation) and a GRPO step (PROBE's steps); skipped when
    #    both step counts are given
    setup_s, sft_step_s, grpo_step_s = 30.0, 1.0, 5.0
    if args.sft_steps is None or args.grpo_steps is None:
        probe_sft = 20
        probe = train_cmd(sft__max_steps=probe_sft, sft__eval_every=probe_sft, sft__val_tasks=8,
                          sft__target_success=1.0, steps=PROBE[args.mode]["grpo_steps"],
                          trainer__eval_before_train="false", trainer__eval_interval=0, eval__num_tasks=8,
                          hydra__run__dir=out / "probe")
        rc, text, dt = run_phase("gpu_9x9", "probe", probe, env, PROBE[args.mode]["limit_s"], deadline, out)
        summary["probe_s"] = round(dt, 1)
        ps_path = newest_sft_summary(cache)
        ps = json.loads(ps_path.read_text()) if ps_path else None
        rows = [r for r in metrics_rows(out / "probe") if "timing/step" in r]
        if rc != 0 or ps is None or not rows:
            failures.append(f"probe: exit {rc}: {text.strip()[-2000:]}")
            return finish()
        sft_step_s = ps["wall_time_s"] / ps["steps"]  # includes warm-up and the validation: an over-estimate
        grpo_step_s = max(r["timing/step"] for r in rows[1:]) if len(rows) > 1 else rows[0]["timing/step"]
        # a phase's own cost beside its loops (process start, imports, model loads, the final evaluation): the
        # probe's wall time less its warm start and its GRPO loop (result.json's setup_time_s holds the probe's
        # warm-start build, which the later phases' starts do not repeat)
        probe_wall = float(json.loads((out / "probe" / "result.json").read_text()).get("wall_time_s", 0.0))
        setup_s = max(10.0, dt - ps["wall_time_s"] - probe_wall)
        summary.update(probe_sft_step_s=round(sft_step_s, 3), probe_grpo_step_s=round(grpo_step_s, 3),
                       probe_setup_s=round(setup_s, 1))

    # 2. warm start, sized to its share of what is left (two process starts and the evaluations kept aside)
    left = deadline.left() - 2 * setup_s - 30
    sft_steps = args.sft_steps or max(25, int(args.sft_share * left / sft_step_s) // 25 * 25)
    sft_eval_every = max(25, sft_steps // 8 // 25 * 25)
    warm = train_cmd(sft__max_steps=sft_steps, sft__eval_every=sft_eval_every, steps=0, hydra__run__dir=out / "warm")
    rc, text, dt = run_phase("gpu_9x9", "warm_start", warm, env, deadline.left() - setup_s - 20, deadline, out)
    summary["warm_start_phase_s"] = round(dt, 1)
    ws_path = newest_sft_summary(cache)
    ws = json.loads(ws_path.read_text()) if ws_path else None
    if ws is not None:
        summary.update(sft_max_steps=sft_steps, sft_steps=ws["steps"], sft_val_success=ws["val_success"],
                       sft_wall_s=round(ws["wall_time_s"], 1),
                       sft_curve=[{k: h[k] for k in ("step", "val_success", "loss")} for h in ws["history"]])
        shutil.copy(ws_path, out / "sft_summary.json")
    if rc != 0 or ws is None:
        failures.append(f"warm start: exit {rc}: {text.strip()[-2000:]}")
        return finish()
    warm_result = json.loads((out / "warm" / "result.json").read_text())
    summary["warm_start_eval_success"] = warm_result.get("eval_success_before")

    # 3. GRPO on what is left: evaluations (held-out 64 + trained-on 64) ~every 10% of the steps
    eval_s = next((r["timing/eval"] for r in metrics_rows(out / "warm") if "timing/eval" in r), 5.0)
    left = deadline.left() - setup_s - 15
    steps = args.grpo_steps or max(4, int((left - 12 * 2 * eval_s) / grpo_step_s))
    interval = max(2, math.ceil(steps / 10))
    grpo = train_cmd(sft__max_steps=sft_steps, sft__eval_every=sft_eval_every, steps=steps,
                     trainer__eval_interval=interval, eval__seen_tasks=8 if args.dry_run else 64,
                     hydra__run__dir=out / "grpo")
    summary.update(grpo_steps_planned=steps, grpo_eval_interval=interval)
    rc, text, dt = run_phase("gpu_9x9", "grpo", grpo, env, deadline.left(), deadline, out)
    summary["grpo_phase_s"] = round(dt, 1)
    rows = metrics_rows(out / "grpo")
    wall = {r["step"]: r["trainer/wall_time_s"] for r in rows if "trainer/wall_time_s" in r}
    curve = [{"step": r["step"], "eval": r["eval/success_rate"], "seen": r.get("eval_seen/success_rate"),
              "distinct": r.get("eval/distinct_outputs"), "t": wall.get(r["step"], 0.0)}
             for r in rows if "eval/success_rate" in r]
    steps_rows = [r for r in rows if "timing/step" in r]
    summary["grpo_curve"] = curve
    if steps_rows:
        summary.update(grpo_step_s_median=round(statistics.median(r["timing/step"] for r in steps_rows), 3),
                       grpo_rollout_s_median=round(statistics.median(r["timing/rollout"] for r in steps_rows), 3),
                       grpo_update_s_median=round(statistics.median(r["timing/train"] for r in steps_rows), 3),
                       grpo_steps_done=len(steps_rows))
    for name in ("metrics.jsonl", "result.json"):
        if (out / "grpo" / name).exists():
            shutil.copy(out / "grpo" / name, out / name)
    if rc != 0:
        failures.append(f"grpo: exit {rc}: {text.strip()[-2000:]}")
    else:
        result = json.loads((out / "grpo" / "result.json").read_text())
        summary.update(eval_success_before=result.get("eval_success_before"),
                       eval_success_after=result.get("eval_success_after"),
                       eval_seen_success_after=result.get("eval_seen_success_after"))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
