"""Time of one supervised warm-start step (rlkit.stages.sft.train_sft's forward + backward + AdamW) by dtype and
by whether the batch's common prefix (the system prompt) runs once.

    python -m bench.bench_sft                    # conf/policy/tiny_vl.yaml sizes, 32 VisGym 9x9 demonstrations
    python -m bench.bench_sft --reps 7 --batch 16

Workload: ``--batch`` solver demonstrations of conf/env/visgym.yaml (training seeds 1000..), encoded
as train_sft encodes them; full fine-tuning of a freshly built tiny Qwen3-VL (as the warm start
does) in float32 and in bfloat16 (weights and compute; AdamW on the bf16 weights), each with the
plain full-sequence forward and with the shared-prefix forward. One torch thread. The variants
alternate round by round (the first round is a warm-up and not timed); medians are reported, plus
each variant's loss on the first round (equal across the prefix modes; bf16 within ~1e-2 of fp32).

Last line: ``sft step: bf16+shared X s vs fp32 plain Y s (Zx)``.
Not a test: timings depend on the machine and its load (alternate, and keep the core to yourself).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from bench.common import BENCH_CACHE, ROOT, tiny_policy_kwargs
from rlkit.demonstrations import demonstration_trajectories
from rlkit.policy import load_policy

VARIANTS = [("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)]


def build(dtype: str, cache_dir: str):
    kwargs = tiny_policy_kwargs(cache_dir, dtype=dtype)
    kwargs["lora"]["enabled"] = False  # the warm start trains all weights
    policy = load_policy(**kwargs)
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-3)
    return policy, opt


def step(policy, opt, demos, shared: bool) -> float:
    lp, _ = policy.logprobs(demos, temperature=1.0, with_entropy=False, shared_prefix=shared)
    mask = torch.zeros_like(lp, dtype=torch.float32)
    for i, d in enumerate(demos):
        mask[i, : len(d.loss_mask)] = torch.tensor(d.loss_mask, dtype=torch.float32)
    loss = -(lp.float() * mask).sum() / mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=str(BENCH_CACHE))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = instantiate(OmegaConf.load(ROOT / "conf" / "env" / "visgym.yaml"))
    runs = {}
    for dtype, shared in VARIANTS:
        policy, opt = build(dtype, args.cache_dir)
        demos = demonstration_trajectories(spec, policy, range(1000, 1000 + 2 * args.batch))[: args.batch]
        runs[(dtype, shared)] = {"policy": policy, "opt": opt, "demos": demos, "times": [], "loss": None}
    tokens = sum(len(d.input_ids) for d in next(iter(runs.values()))["demos"])
    print(f"workload: {args.batch} demonstrations, {tokens} tokens, {args.threads} thread(s)")
    for rnd in range(args.reps + 1):
        order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
        for key in order:
            r = runs[key]
            t0 = time.perf_counter()
            loss = step(r["policy"], r["opt"], r["demos"], key[1])
            if rnd == 0:
                r["loss"] = loss
            else:
                r["times"].append(time.perf_counter() - t0)
    med = {key: statistics.median(r["times"]) for key, r in runs.items()}
    base = med[("float32", False)]
    for key in VARIANTS:
        name = f"{key[0]}{'+shared' if key[1] else ' plain'}"
        print(f"  {name:<18} {med[key]:6.2f} s/step  ({base / med[key]:.2f}x)  first-round loss {runs[key]['loss']:.4f}")
    best = med[("bfloat16", True)]
    print(f"sft step: bf16+shared {best:.2f} s vs fp32 plain {base:.2f} s ({base / best:.1f}x)")


if __name__ == "__main__":
    main()
