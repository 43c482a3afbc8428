"""GPU readiness check of backend=native: one prepared run of at most 8 minutes, with numbers.

    bash bench/gpu_check.sh                   # on a CUDA machine (what it is for)
    bash bench/gpu_check.sh --dry-run         # the same phases, tiny, on CPU (~1-2 minutes; the tests run this)

Phases (each a subprocess with its own time limit, all inside one deadline, --budget-s, 450 s by default;
bench/gpu_check.sh adds a hard `timeout` of 480 s around everything):

1. train + kill: ``train.py backend=native`` with a larger tiny Qwen3-VL (~100M parameters, GPU_SIZES of
   bench/common.py) on ``policy.device=cuda policy.dtype=bfloat16 policy.attn_implementation=sdpa
   algorithm.shared_prefix=true``, LoRA r16, B x G rollouts with transformers generation on the device,
   a checkpoint every step (all kept), no SFT warm start (random weights: rewards are all 0, so a small
   ``algorithm.entropy_coef`` keeps the gradient non-zero and the adapter moving). The process is
   killed with SIGKILL inside the update of step ``steps - 1`` (rlkit.faults, RLKIT_CRASH_AT), as a
   node failure would kill it.
2. resume: the same command again in the same run folder. Checked: it says it resumes from the
   checkpoint of step ``steps - 2``; it completes ``steps``; metrics.jsonl holds steps 1..steps once
   each and its first ``steps - 2`` lines are byte-identical to those before the kill; that checkpoint's
   adapter file is unchanged (sha256) and the final adapter differs from it (training continued).
3. sync + measure: a fresh process loads the same policy on the device, loads the run's final adapter
   (PEFT files), publishes it through rlkit.sync (the native_ray / vLLM adapter-sync path: safetensors +
   sha256 manifest, atomic rename) and loads it into a second live policy on the device
   (AdapterSubscriber: verify, copy in place, compare every tensor); times both; counts the model's
   parameters for the FLOP estimate; on CPU measures an fp32 matmul peak for the MFU denominator.

Summary (printed as ``gpu_check: <key> <value>`` lines and written to <out>/summary.json; last line
``gpu_check: OK`` or ``gpu_check: FAILED: <why>``, exit status 0 / 1). Per-step numbers are medians
over the steps that are not the first of a process (the first one warms kernels and the allocator):
- generate_tokens_per_s: B*G*generate/mean_tokens / timing/rollout. timing/rollout includes the env
  (image rendering, parsing, stepping) and the engine's host-side work, so this is the rollout's
  end-to-end generation rate, a lower bound on the engine's.
- update_tokens_per_s: B*G*generate/mean_seq_len / timing/train (every position of every sequence, as a
  full-sequence forward would count them); update_processed_tokens_per_s counts what the shared-prefix
  update runs: each group's prompt once + every completion.
- update_mfu: model FLOPs / timing/train / peak. Model FLOPs = 6 x N x processed tokens (2N forward +
  4N backward, the usual convention over the whole decoder: N = decoder matmul weights incl. lm_head,
  frozen ones too, since activation gradients flow through them) + the vision tower's forward once
  per group. Attention's own FLOPs (~4 x ctx x q_dim per token and layer, a few % at these lengths) are
  left out, so this is a slight under-estimate. With LoRA the frozen weights need no weight gradient:
  the hardware does ~4N per token, so update_hfu_4n = update_mfu x 4/6 is the work actually done.
- peak: bf16 dense tensor-core peak of the device from NVIDIA's public data sheets (PEAK_TFLOPS below,
  without sparsity), or RLKIT_PEAK_TFLOPS=<TFLOP/s> to override; on CPU (dry run) a measured fp32
  matmul peak at the thread count used.
- sync_publish_ms / sync_load_ms: median of the publish / load repetitions; sync_bytes; sync_verified.
- checkpoint/resume: resumed_from_step, steps_completed, adapter hashes, resume_setup_s (setup time of
  the resumed process: model load + checkpoint restore).

Never run on a GPU so far: the CUDA path is written from the same code the CPU tests run, with the
device and dtype switched by config. On CPU, the dry run passes in float32 and in bfloat16
(``--dry-run --dtype bfloat16``), and GPU_SIZES ran one bf16 GRPO step of train.py with these
overrides (1 task x 2 samples, 8 tokens: rollout 1.1 s, update 1.8 s, grad norm 3e-3). The first GPU
run is its real test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import GPU_SIZES, ROOT, Deadline, metrics_rows, run_phase, tiny_policy_kwargs, train_env

#: bf16 dense tensor-core peak (TFLOP/s, no sparsity) from NVIDIA's data sheets, matched in order
#: against torch.cuda.get_device_name(). H100/H200 SXM: 1,979 TFLOP/s "with sparsity" -> 989.5 dense.
PEAK_TFLOPS = [("H200 NVL", 835.5), ("H200", 989.5), ("H100 NVL", 835.5), ("H100 PCIe", 756.0),
               ("H100", 989.5), ("A100", 312.0), ("L40S", 362.05), ("L4", 121.0)]


def peak_for(device_name: str) -> tuple[float | None, str]:
    """(bf16 dense peak in FLOP/s or None, where it came from) for a CUDA device name."""
    env = os.environ.get("RLKIT_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12, "RLKIT_PEAK_TFLOPS"
    for key, tflops in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops * 1e12, f"data sheet ({key} bf16 dense)"
    return None, "unknown device: set RLKIT_PEAK_TFLOPS=<bf16 dense TFLOP/s> for an MFU"


def plan(dry_run: bool, dtype: str | None = None) -> dict:
    """The workload: train.py overrides and the policy kwargs the measure phase rebuilds the same model from."""
    if dry_run:
        p = dict(device="cpu", dtype="float32", tiny={}, steps=3, B=2, G=4, new_tokens=32, micro=8, eval_tasks=2)
    else:
        p = dict(device="cuda", dtype="bfloat16", tiny=GPU_SIZES, steps=6, B=8, G=8, new_tokens=64, micro=32,
                 eval_tasks=8)
    if dtype:
        p["dtype"] = dtype
    ov = ["backend=native", "logger=console", "env=visgym", "reward=maze_exit",
          f"policy.device={p['device']}", f"policy.dtype={p['dtype']}", "policy.attn_implementation=sdpa",
          "algorithm.shared_prefix=true", "algorithm.entropy_coef=0.01", f"algorithm.micro_batch_size={p['micro']}",
          f"steps={p['steps']}", f"tasks_per_step={p['B']}", f"group_size={p['G']}",
          f"rollout.max_new_tokens={p['new_tokens']}", "sft.enabled=false", "grounding.enabled=false",
          "trainer.eval_before_train=false", "trainer.eval_interval=0", "trainer.ckpt_interval=1",
          "trainer.max_ckpts_to_keep=0", "trainer.quiet=true", f"eval.num_tasks={p['eval_tasks']}"]
    ov += [f"policy.tiny.{k}={v}" for k, v in p["tiny"].items()]
    p["overrides"] = ov
    return p


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------ measure phase
def measure(args) -> None:
    """Child process: adapter sync through rlkit.sync on the device, parameter counts, CPU peak."""
    import tempfile

    import torch

    from rlkit.policy import load_policy
    from rlkit.policy.lora import lora_state_dict
    from bench.common import decoder_matmul_params, matmul_peak, vision_flops
    from rlkit.sync import AdapterSubscriber, publish_adapter

    torch.set_num_threads(1)
    kwargs = json.loads(args.policy_kwargs)
    trainer, engine_side = load_policy(**kwargs), load_policy(**kwargs)
    trainer.load_adapter(Path(args.run) / "adapter")
    dev = next(trainer.model.parameters()).device
    out: dict = {"device": str(dev), "dtype": str(next(trainer.model.parameters()).dtype).replace("torch.", "")}
    cfg = trainer.model.peft_config["default"].to_dict()
    pub_t, load_t = [], []
    with tempfile.TemporaryDirectory(dir=args.sync_dir) as root:
        sub = AdapterSubscriber(root, timeout_s=30)
        for v in range(args.reps + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            tensors = lora_state_dict(trainer.model)  # device -> host copy is part of a publish
            pub = publish_adapter(root, v, tensors, cfg, base_model=trainer.checkpoint, keep_versions=2)
            t1 = time.perf_counter()
            loaded = sub.load(engine_side.model, v)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if v:  # the first repetition warms up
                pub_t.append(t1 - t0)
                load_t.append(t2 - t1)
    live = lora_state_dict(engine_side.model)
    ref = lora_state_dict(trainer.model)
    out["sync_verified"] = bool(live.keys() == ref.keys() and all(torch.equal(live[k], ref[k]) for k in ref)
                                and loaded.weights_sha256 == pub.weights_sha256)
    out.update(sync_publish_ms=1e3 * statistics.median(pub_t), sync_load_ms=1e3 * statistics.median(load_t),
               sync_bytes=pub.num_bytes, sync_params=pub.num_params)
    v = trainer.hf_model.config.vision_config
    n_patches = (kwargs["tiny"].get("image_max_pixels", 72 * 72) // kwargs["tiny"].get("patch_size", 4) ** 2)
    out["decoder_matmul_params"] = decoder_matmul_params(trainer)
    out["vision_flops_per_image"] = vision_flops(trainer, n_patches)
    out["patches_per_image"] = n_patches
    out["params"] = trainer.num_parameters()
    out["vision_merge"] = v.spatial_merge_size
    if dev.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(dev)
        out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    else:
        out["cpu_fp32_peak_flops"] = matmul_peak(1024, reps=5)
    print("MEASURE " + json.dumps(out))


# --------------------------------------------------------------------------------------- summary
def step_numbers(rows: list[dict], first_steps: set[int], B: int, G: int, m: dict) -> dict:
    """Medians of the per-step rates over steps not in ``first_steps`` (falls back to all steps)."""
    steps = [r for r in rows if "timing/train" in r and r.get("trainer/step") not in first_steps] or \
            [r for r in rows if "timing/train" in r]
    n_seq = B * G
    gen_tps, upd_tps, proc_tps, mfu_flops, gen_flops = [], [], [], [], []
    n_dec = m["decoder_matmul_params"]
    for r in steps:
        gen = r["generate/mean_tokens"]
        seq = r["generate/mean_seq_len"]
        prompt = max(seq - gen, 0.0)  # plan mode: one turn, the prompt is the group's shared prefix
        processed = B * prompt + n_seq * gen
        gen_tps.append(n_seq * gen / r["timing/rollout"])
        upd_tps.append(n_seq * seq / r["timing/train"])
        proc_tps.append(processed / r["timing/train"])
        mfu_flops.append((6 * n_dec * processed + B * m["vision_flops_per_image"]) / r["timing/train"])
        # generation: one prefill per group (shared by its G samples) + G x gen decode tokens, forward only
        gen_flops.append((2 * n_dec * (B * prompt + n_seq * gen) + B * m["vision_flops_per_image"]) / r["timing/rollout"])
    med = statistics.median
    return {"steps_measured": len(steps), "generate_tokens_per_s": med(gen_tps), "update_tokens_per_s": med(upd_tps),
            "update_processed_tokens_per_s": med(proc_tps), "update_model_flops_per_s": med(mfu_flops),
            "generate_model_flops_per_s": med(gen_flops),
            "step_s": med(r["timing/step"] for r in steps), "rollout_s": med(r["timing/rollout"] for r in steps),
            "update_s": med(r["timing/train"] for r in steps),
            "mean_new_tokens": med(r["generate/mean_tokens"] for r in steps),
            "mean_seq_len": med(r["generate/mean_seq_len"] for r in steps),
            "grad_norm": med(r.get("policy/grad_norm", 0.0) for r in steps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny, on CPU (also: DEVICE=cpu)")
    ap.add_argument("--out", default=None, help="output folder (default: gpu_check_out/<UTC time>)")
    ap.add_argument("--dtype", default=None, help="policy dtype (default: bfloat16 on the GPU, float32 in the dry run)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="deadline for all phases together (seconds)")
    ap.add_argument("--reps", type=int, default=5, help="adapter publish/load repetitions after a warm-up")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--policy-kwargs", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sync-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase == "measure":
        measure(args)
        return 0

    deadline = Deadline(args.budget_s)
    dry = args.dry_run or os.environ.get("DEVICE", "").lower() == "cpu"
    p = plan(dry, args.dtype)
    out = Path(args.out or ROOT / "gpu_check_out" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = out / "run"
    cache = out / "cache"
    summary: dict = {"mode": "dry-run (cpu)" if dry else "gpu", "out": str(out), "steps": p["steps"],
                     "tasks_per_step": p["B"], "group_size": p["G"], "max_new_tokens": p["new_tokens"],
                     "dtype": p["dtype"], "overrides": p["overrides"]}
    failures: list[str] = []

    import torch

    import peft
    import transformers

    summary.update(torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)
    if not dry:
        if not torch.cuda.is_available():
            print(f"gpu_check: FAILED: torch {torch.__version__} sees no CUDA device (torch.version.cuda="
                  f"{torch.version.cuda}); install a CUDA build of torch, or run --dry-run on CPU", flush=True)
            return 1
        name = torch.cuda.get_device_name(0)
        summary.update(device_name=name, cuda=torch.version.cuda, bf16_supported=torch.cuda.is_bf16_supported())
        peak, peak_src = peak_for(name)
    else:
        summary["device_name"] = "cpu"
        peak, peak_src = None, "measured fp32 matmul (1 thread)"

    env = train_env(out, OMP_NUM_THREADS="1")
    env.pop("RLKIT_CRASH_AT", None)
    train = [sys.executable, str(ROOT / "train.py"), *p["overrides"], f"hydra.run.dir={run}"]
    crash_step, resume_step = p["steps"] - 1, p["steps"] - 2

    # 1. train until SIGKILL inside the update of step steps-1
    rc, text, dt = run_phase("gpu_check", "train", train, dict(env, RLKIT_CRASH_AT=f"update@{crash_step}"), 240,
                             deadline, out)
    summary["train_phase_s"] = round(dt, 1)
    if rc != -9:
        failures.append(f"train phase: expected the injected SIGKILL (-9) in step {crash_step}, got exit {rc}: "
                        f"{text.strip()[-1500:]}")
    ck = run / "checkpoints" / f"step_{resume_step:06d}" / "adapter" / "adapter_model.safetensors"
    before = metrics_rows(run)
    lines_before = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
    ck_hash = sha256(ck) if ck.exists() else None
    if not failures and ck_hash is None:
        failures.append(f"train phase: no checkpoint {ck}")

    # 2. resume in the same folder
    if not failures:
        rc, text, dt = run_phase("gpu_check", "resume", train, env, 180, deadline, out)
        summary["resume_phase_s"] = round(dt, 1)
        if rc != 0:
            failures.append(f"resume phase: exit {rc}: {text.strip()[-1500:]}")
        else:
            result = json.loads((run / "result.json").read_text())
            rows = metrics_rows(run)
            lines = (run / "metrics.jsonl").read_text().splitlines()
            steps_logged = [r.get("trainer/step") for r in rows if "trainer/step" in r]
            final_hash = sha256(run / "adapter" / "adapter_model.safetensors")
            resumed = f"step_{resume_step:06d} at step {resume_step}" in text
            summary.update(
                resumed_from_step=resume_step if resumed else None, steps_completed=result["steps_completed"],
                steps_logged=steps_logged, resume_setup_s=result.get("setup_time_s"),
                checkpoint_adapter_sha256=ck_hash, checkpoint_adapter_unchanged=ck.exists() and sha256(ck) == ck_hash,
                final_adapter_sha256=final_hash, adapter_changed_after_resume=final_hash != ck_hash,
                metrics_kept_before_resume=lines[: len(lines_before)] == lines_before and len(lines_before) == resume_step,
                eval_success_after=result.get("eval_success_after"))
            checks = {"resumed from the checkpoint of step %d" % resume_step: resumed,
                      "steps_completed == steps": result["steps_completed"] == p["steps"],
                      "metrics.jsonl holds steps 1..steps once": steps_logged == list(range(1, p["steps"] + 1)),
                      "metrics before the kill kept byte-identical": summary["metrics_kept_before_resume"],
                      "resumed checkpoint's adapter unchanged": summary["checkpoint_adapter_unchanged"],
                      "adapter changed after resume": summary["adapter_changed_after_resume"]}
            failures += [f"resume check failed: {k}" for k, ok in checks.items() if not ok]

    # 3. adapter sync on the device + parameter counts
    m = None
    if not failures:
        kwargs = _policy_kwargs(p, cache)
        cmd = [sys.executable, "-m", "bench.gpu_check", "--phase", "measure", "--run", str(run),
               "--policy-kwargs", json.dumps(kwargs), "--reps", str(args.reps), "--sync-dir", str(out)]
        rc, text, dt = run_phase("gpu_check", "measure", cmd, env, 120, deadline, out)
        line = next((ln for ln in text.splitlines() if ln.startswith("MEASURE ")), None)
        if rc != 0 or line is None:
            failures.append(f"measure phase: exit {rc}: {text.strip()[-1500:]}")
        else:
            m = json.loads(line[len("MEASURE "):])
            summary.update({k: m[k] for k in ("sync_publish_ms", "sync_load_ms", "sync_bytes", "sync_params",
                                              "sync_verified", "params")})
            summary.update({k: m[k] for k in ("max_memory_allocated_gib",) if k in m})
            if not m["sync_verified"]:
                failures.append("adapter sync: the loaded adapter differs from the published one")
            if dry:
                peak = m["cpu_fp32_peak_flops"]

    # numbers
    if m is not None:
        rows = metrics_rows(run)
        nums = step_numbers(rows, {1, resume_step + 1}, p["B"], p["G"], m)
        summary.update(nums)
        summary["peak_flops"], summary["peak_source"] = peak, peak_src
        if peak:
            summary["update_mfu"] = nums["update_model_flops_per_s"] / peak
            summary["update_hfu_4n"] = summary["update_mfu"] * 4 / 6
            summary["generate_mfu"] = nums["generate_model_flops_per_s"] / peak
        for k in ("generate_tokens_per_s", "update_tokens_per_s", "sync_publish_ms", "sync_load_ms"):
            if not summary[k] > 0:
                failures.append(f"{k} is not positive ({summary[k]})")

    summary["wall_s"] = round(args.budget_s - deadline.left(), 1)
    summary["ok"] = not failures
    summary["failures"] = failures
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _print_summary(summary)
    if failures:
        print("gpu_check: FAILED: " + " | ".join(failures), flush=True)
        return 1
    print("gpu_check: OK", flush=True)
    return 0


def _policy_kwargs(p: dict, cache: Path) -> dict:
    """load_policy kwargs of the policy train.py builds with these overrides (conf/policy/tiny_vl.yaml + p)."""
    node = tiny_policy_kwargs(cache / "tiny_vl", tiny=p["tiny"], dtype=p["dtype"], device=p["device"],
                              attn_implementation="sdpa")
    node["lora"]["enabled"] = True  # train.py builds the GRPO policy with train_mode="lora"
    return node


def _print_summary(s: dict) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    keys = ["mode", "device_name", "torch", "transformers", "peft", "cuda", "bf16_supported", "dtype", "params", "steps", "tasks_per_step", "group_size",
            "max_new_tokens", "train_phase_s", "resume_phase_s", "resumed_from_step", "steps_completed",
            "checkpoint_adapter_unchanged", "adapter_changed_after_resume", "metrics_kept_before_resume",
            "resume_setup_s", "steps_measured", "step_s", "rollout_s", "update_s", "mean_new_tokens", "mean_seq_len",
            "generate_tokens_per_s", "update_tokens_per_s", "update_processed_tokens_per_s", "grad_norm",
            "peak_flops", "peak_source", "update_mfu", "update_hfu_4n", "generate_mfu", "sync_publish_ms",
            "sync_load_ms", "sync_bytes", "sync_verified", "max_memory_allocated_gib", "wall_s", "out"]
    for k in keys:
        if k in s:
            print(f"gpu_check: {k} {fmt(s[k])}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
