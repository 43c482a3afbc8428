"""Adapter sync latency (publish / load) and the step-time overhead of backend=native_ray on this machine.

    python -m bench.bench_sync                        # everything below (~2-3 minutes on 2 CPU cores)
    python -m bench.bench_sync --skip-steps           # only the sync latencies
    python -m bench.bench_sync --shared-dir /shared # publish/load through another filesystem

What is measured (wall clock; median and min over --reps after one warm-up):
1. tiny policy (conf/policy/tiny_vl.yaml sizes, LoRA rank 16 on the language model's 7 linears):
   - publish: rlkit.sync.publish_adapter of the adapter tensors (serialize to safetensors in memory,
     sha256, write + fsync 3 files and the manifest, rename, prune);
   - load: rlkit.sync.AdapterSubscriber.load into a second live policy (verify the manifest's
     checksums, rlkit.policy.load_adapter_inplace: read, hash again, copy into the LoRA tensors,
     compare every tensor).
2. a synthetic rank-32 LoRA of Qwen3-VL-8B's language model, built as tensors only (no model):
   36 layers x q/k/v/o/gate/up/down with hidden 4096, intermediate 12288, 32 q heads x 128 and
   8 kv heads x 128, i.e. A [32, in] and B [out, 32] per projection (87,293,952 parameters), in
   float32 and bfloat16. publish as above; load = what load_adapter_inplace does without a model to
   put it in: verify the manifest, hash the weights file again, read it (safetensors), copy every
   tensor into preallocated tensors of the same shapes and compare them.
3. step time of the main job (train.py experiment=smoke, more steps, no evaluation before training,
   one final checkpoint) with backend=native (one process) and backend=native_ray (Ray actors: 1 trainer
   rank + 1 rollout worker colocated, and 2 FSDP2 ranks + 2 rollout workers colocated): mean
   timing/step over the steps after the first, setup time, and the sync phases from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, tiny_policy_kwargs, train_env
from rlkit.sync import AdapterSubscriber, publish_adapter, verify_version, version_dir

QWEN3_VL_8B_TEXT = dict(layers=36, hidden=4096, intermediate=12288, q_heads=32, kv_heads=8, head_dim=128)


def qwen3_vl_8b_lora_shapes(rank: int = 32) -> dict[str, tuple[int, int]]:
    """PEFT-saved keys and shapes of a rank-``rank`` LoRA on every language-model linear of Qwen3-VL-8B."""
    c = QWEN3_VL_8B_TEXT
    q, kv = c["q_heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    proj = {  # name: (in_features, out_features)
        "self_attn.q_proj": (c["hidden"], q), "self_attn.k_proj": (c["hidden"], kv), "self_attn.v_proj": (c["hidden"], kv),
        "self_attn.o_proj": (q, c["hidden"]), "mlp.gate_proj": (c["hidden"], c["intermediate"]),
        "mlp.up_proj": (c["hidden"], c["intermediate"]), "mlp.down_proj": (c["intermediate"], c["hidden"]),
    }
    shapes = {}
    for layer in range(c["layers"]):
        for name, (fin, fout) in proj.items():
            base = f"base_model.model.model.language_model.layers.{layer}.{name}"
            shapes[f"{base}.lora_A.weight"] = (rank, fin)
            shapes[f"{base}.lora_B.weight"] = (fout, rank)
    return shapes


def _stats(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:8.1f} ms   min {min(xs) * 1e3:8.1f} ms"


def bench_tiny(root: Path, reps: int) -> dict:
    from rlkit.policy import load_policy
    from rlkit.policy.lora import lora_state_dict

    node = tiny_policy_kwargs()
    trainer, engine_side = load_policy(**node), load_policy(**node)
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.normal_(0, 0.02)
    cfg = trainer.model.peft_config["default"].to_dict()
    pub_t, load_t, nbytes = [], [], 0
    for v in range(reps + 1):
        tensors = lora_state_dict(trainer.model)
        t0 = time.perf_counter()
        pub = publish_adapter(root, v, tensors, cfg, base_model=trainer.checkpoint, keep_versions=2)
        t1 = time.perf_counter()
        AdapterSubscriber(root, timeout_s=5).load(engine_side.model, v)
        t2 = time.perf_counter()
        nbytes = pub.num_bytes
        if v:
            pub_t.append(t1 - t0)
            load_t.append(t2 - t1)
    return {"params": pub.num_params, "bytes": nbytes, "publish_s": pub_t, "load_s": load_t}


def _hot_swap_proxy(root: Path, version: int, live: dict[str, torch.Tensor]) -> None:
    """load_adapter_inplace's work without a model: verify, hash again, read, copy in, compare."""
    import hashlib

    from safetensors.torch import load_file

    verify_version(root, version)
    path = version_dir(root, version) / "adapter_model.safetensors"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    state = load_file(str(path))
    with torch.no_grad():
        for k, t in state.items():
            live[k].copy_(t)
            if not torch.equal(live[k], t):
                raise AssertionError(k)


def bench_8b(root: Path, reps: int, dtype: torch.dtype) -> dict:
    shapes = qwen3_vl_8b_lora_shapes(32)
    g = torch.Generator().manual_seed(0)
    tensors = {k: (torch.randn(s, generator=g) * 0.01).to(dtype) for k, s in shapes.items()}
    live = {k: torch.empty(s, dtype=dtype) for k, s in shapes.items()}
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 32, "lora_alpha": 64, "lora_dropout": 0.0, "bias": "none",
           "target_modules": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]}
    pub_t, load_t = [], []
    for v in range(reps + 1):
        t0 = time.perf_counter()
        pub = publish_adapter(root, v, tensors, cfg, base_model="Qwen/Qwen3-VL-8B-Instruct", keep_versions=2)
        t1 = time.perf_counter()
        _hot_swap_proxy(root, v, live)
        t2 = time.perf_counter()
        if v:
            pub_t.append(t1 - t0)
            load_t.append(t2 - t1)
    return {"params": pub.num_params, "bytes": pub.num_bytes, "publish_s": pub_t, "load_s": load_t}


def run_job(tmp: Path, name: str, overrides: list[str], steps: int) -> dict:
    out = tmp / name
    env = train_env(tmp, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_API_SERVER_ADDRESS", None)
    env.setdefault("RLKIT_RAY_METRICS_LINGER_S", "0")  # a private Ray instance: no end-of-job metrics wait
    args = ["experiment=smoke", "logger=console", f"steps={steps}", "trainer.eval_before_train=false",
            "trainer.ckpt_interval=0", f"hydra.run.dir={out}", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=1200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"train.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    setup = re.search(r"setup (\d+)s", proc.stdout)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step" in r][1:]  # the first step warms caches up
    keys = ("timing/step", "timing/rollout", "timing/train", "timing/publish", "timing/load", "timing/update")
    means = {k: statistics.mean(r[k] for r in rows) for k in keys if all(k in r for r in rows)}
    return {"name": name, "wall_s": wall, "setup_s": float(setup.group(1)) if setup else None, "steps_measured": len(rows), **means}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shared-dir", default=None, help="folder to publish into (default: a temp dir)")
    ap.add_argument("--steps", type=int, default=8, help="GRPO steps per job in the step-time comparison")
    ap.add_argument("--skip-steps", action="store_true", help="only the sync latencies")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    results: dict = {"threads": 1, "cpus": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory(dir=args.shared_dir) as tmp_s:
        tmp = Path(tmp_s)
        print(f"publish/load through {tmp} ({args.reps} reps after a warm-up; torch threads 1)")
        tiny = bench_tiny(tmp / "tiny", args.reps)
        print(f"tiny policy LoRA r16   {tiny['params'] / 1e6:7.2f} M params {tiny['bytes'] / 1e6:8.1f} MB   "
              f"publish {_stats(tiny['publish_s'])}   load {_stats(tiny['load_s'])}")
        results["tiny"] = tiny
        for dtype in (torch.bfloat16, torch.float32):
            r = bench_8b(tmp / f"8b_{dtype}", args.reps, dtype)
            tag = str(dtype).replace("torch.", "")
            print(f"Qwen3-VL-8B LoRA r32 {tag:8s} {r['params'] / 1e6:7.2f} M params {r['bytes'] / 1e6:8.1f} MB   "
                  f"publish {_stats(r['publish_s'])}   load* {_stats(r['load_s'])}")
            results[f"qwen3_vl_8b_r32_{tag}"] = r
        print("  * load without a model: verify + hash + read + copy into preallocated tensors + compare")
    if not args.skip_steps:
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            jobs = [("native", ["backend=native"]),
                    ("native_ray 1 rank + 1 rollout (colocated)", ["backend=native_ray"]),
                    ("native_ray 2 ranks + 2 rollout (colocated)", ["backend=native_ray", "backend.num_workers=2"])]
            rows = [run_job(tmp, f"job{i}", ov, args.steps) for i, (_, ov) in enumerate(jobs)]
            base = rows[0]["timing/step"]
            print(f"\nstep time, train.py experiment=smoke steps={args.steps} (mean over steps 2..{args.steps}; seconds)")
            print(f"{'backend':45s} {'step':>7s} {'x native':>9s} {'rollout':>8s} {'train':>7s} {'publish':>8s} "
                  f"{'load':>7s} {'setup':>6s} {'wall':>6s}")
            for (name, _), r in zip(jobs, rows):
                print(f"{name:45s} {r['timing/step']:7.3f} {r['timing/step'] / base:9.2f} {r['timing/rollout']:8.3f} "
                      f"{r['timing/train']:7.3f} {r.get('timing/publish', 0):8.3f} {r.get('timing/load', 0):7.3f} "
                      f"{r['setup_s'] or 0:6.0f} {r['wall_s']:6.1f}")
            results["steps"] = [{**r, "name": name} for (name, _), r in zip(jobs, rows)]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
