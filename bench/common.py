"""What the benchmarks, GPU scripts and probes of bench/ share: the checkout's root, the model sizes they measure,
the tiny policy they build, the maze-like workload, the FLOP counts and matmul peak behind an MFU, and the bounded
subprocess phases of the GPU scripts.

No torch import at module level: bench_vs_trl.py's TRL worker reads ISSUE15_SIZES before it sets its thread count,
and the GPU scripts' orchestrators start before they know which torch they run on.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

#: The checkout's root (train.py, conf/); benchmarks run from here as ``python -m bench.<name>``.
ROOT = Path(__file__).resolve().parents[1]

#: issue 15's measured workload: text 256 x 4 layers (head_dim 64), vision 128 x 2, patch 16, so a
#: 224x224 image is 49 image tokens (159-token prompt).
ISSUE15_SIZES = dict(
    text_hidden=256, text_layers=4, text_heads=4, text_kv_heads=2, head_dim=64, text_intermediate=768,
    vision_hidden=128, vision_depth=2, vision_heads=2, vision_intermediate=256, patch_size=16,
    image_min_pixels=224 * 224, image_max_pixels=224 * 224,
)

#: A larger tiny Qwen3-VL for the GPU (~100M parameters: 8 decoder layers of 1024, GQA 16/4 heads of
#: 64, SwiGLU 3072; vision 4 blocks of 256). Image geometry as conf/policy/tiny_vl.yaml (81 image
#: tokens per 9x9 maze), vocabulary 1024 (the locally trained tokenizer).
GPU_SIZES = dict(text_hidden=1024, text_layers=8, text_heads=16, text_kv_heads=4, head_dim=64,
                 text_intermediate=3072, vision_hidden=256, vision_depth=4, vision_heads=4,
                 vision_intermediate=1024)

#: Where the benchmarks cache their tiny checkpoints unless told otherwise.
BENCH_CACHE = Path(tempfile.gettempdir()) / "rlkit_bench_cache"


# ------------------------------------------------------------------------------------------ the tiny policy
def tiny_policy_kwargs(cache_dir: str | os.PathLike | None = None, sizes: str = "conf", **overrides) -> dict:
    """``rlkit.policy.load_policy`` keyword arguments of conf/policy/tiny_vl.yaml on the CPU.

    ``cache_dir``: where its checkpoint is built and cached (default: BENCH_CACHE). ``sizes``: ``conf`` (the
    file's sizes) or ``issue15`` (ISSUE15_SIZES on top). ``overrides``: any other keyword on top; a ``tiny`` dict
    is merged into the sizes. Raises ValueError on an unknown ``sizes``."""
    from omegaconf import OmegaConf

    if sizes not in ("conf", "issue15"):
        raise ValueError(f"sizes must be 'conf' or 'issue15', not {sizes!r}")
    node = OmegaConf.load(ROOT / "conf" / "policy" / "tiny_vl.yaml")
    node.cache_dir = str(cache_dir or BENCH_CACHE)
    kwargs = OmegaConf.to_container(node, resolve=True)
    kwargs.pop("_target_")
    kwargs["device"] = "cpu"
    tiny = {**kwargs["tiny"], **(ISSUE15_SIZES if sizes == "issue15" else {}), **overrides.pop("tiny", {})}
    return {**kwargs, **overrides, "tiny": tiny}


def tiny_policy(args):
    """The tiny policy of ``args.sizes`` (``conf`` / ``issue15``) cached in ``args.cache_dir`` (None: BENCH_CACHE)."""
    from rlkit.policy import load_policy

    return load_policy(**tiny_policy_kwargs(args.cache_dir, args.sizes))


def randomise_lora_b(model, seed: int, std: float) -> None:
    """Set every LoRA B matrix of ``model`` to N(0, std^2) entries drawn from a generator seeded with ``seed``
    (parameters in name order), so the adapter changes outputs as a trained one does (B = 0 at init leaves the base
    model's outputs). Used by bench_vllm_rollout.py and the vLLM parity tests (tests/vllm/)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


# ------------------------------------------------------------------------------------- maze-like workload
SYSTEM = "You are an agent in a 2D maze. Reach the green goal."
PROMPT = (
    "The image shows the maze: walls are black, free cells are white, you are the red cell. "
    "Choose one action: ('move', 0) right, ('move', 1) up, ('move', 2) left, ('move', 3) down, "
    "('stop', 'stop'). Answer inside <answer></answer>."
)


def maze_image(seed: int, cells: int = 9, px: int = 25):
    """A random ``cells`` x ``cells`` maze-like PIL image of ``cells * px`` pixels a side: black walls (30%), one
    red and one green cell, drawn from ``seed``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    grid = rng.random((cells, cells)) < 0.3
    img = np.where(grid[..., None], 0, 255).astype(np.uint8).repeat(3, axis=2)
    img[rng.integers(cells), rng.integers(cells)] = [255, 0, 0]
    img[rng.integers(cells), rng.integers(cells)] = [0, 255, 0]
    return Image.fromarray(img.repeat(px, axis=0).repeat(px, axis=1))


# ------------------------------------------------------------------------------------------- FLOPs and peak
def matmul_peak(n: int = 2048, reps: int = 5, dtype=None) -> float:
    """``torch.matmul`` FLOP/s of two n x n matrices in ``dtype`` (default float32; best of ``reps``) at the
    current torch thread count."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def decoder_matmul_params(policy) -> int:
    """Weights used as matmuls once per token: decoder layers + lm_head (not the embedding lookup, not LoRA)."""
    return sum(
        p.numel()
        for name, p in policy.hf_model.named_parameters()
        if p.dim() >= 2 and "lora_" not in name and (".language_model.layers." in name or name.startswith("lm_head"))
    )


def vision_flops(policy, patches: int) -> float:
    """Forward FLOPs of the vision tower on one image of ``patches`` patches (full attention inside the image)."""
    v = policy.hf_model.config.vision_config
    visual = policy.hf_model.model.visual
    blocks = sum(p.numel() for p in visual.blocks.parameters() if p.dim() >= 2)
    mergers = sum(p.numel() for n, p in visual.named_parameters() if "merger" in n and p.dim() >= 2)
    return (
        2 * visual.patch_embed.proj.weight.numel() * patches
        + 2 * blocks * patches
        + v.depth * 4 * v.hidden_size * patches**2
        + 2 * mergers * patches / v.spatial_merge_size**2
    )


# ------------------------------------------------------------------------- bounded train.py subprocesses
def train_env(out: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``train.py`` subprocess writing under ``out``: its own cache (``out/cache``) and shared
    folder (``out/shared``), W&B offline, this checkout first on PYTHONPATH, full Hydra errors; ``extra`` on top."""
    return dict(os.environ, RLKIT_CACHE_DIR=str(out / "cache"), RLKIT_SHARED_DIR=str(out / "shared"),
                WANDB_MODE="offline", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                HYDRA_FULL_ERROR="1", **extra)


class Deadline:
    """A point ``budget_s`` seconds from now (monotonic clock)."""

    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        """Seconds until the deadline (negative past it)."""
        return self.end - time.monotonic()


def run_phase(tag: str, name: str, cmd: list[str], env: dict, limit_s: float, deadline: Deadline,
              log_dir: Path) -> tuple[int, str, float]:
    """Run phase ``name`` of the GPU script ``tag`` (``cmd`` in ROOT; announced as ``<tag>: phase <name>``); returns
    (returncode, stdout + stderr, seconds). Output goes to <log_dir>/<name>.log too. A phase past its limit (or the
    deadline) is killed and returns 124."""
    limit = max(1.0, min(limit_s, deadline.left()))
    t0 = time.monotonic()
    print(f"{tag}: phase {name} (limit {limit:.0f} s)", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + f"\n[timed out after {limit:.0f} s]"
    dt = time.monotonic() - t0
    (log_dir / f"{name}.log").write_text(out + "\n--- stderr ---\n" + err)
    return rc, out + err, dt


def metrics_rows(run: Path) -> list[dict]:
    """The rows of ``run``/metrics.jsonl ([] when the run wrote none)."""
    path = run / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
