"""Shared fixtures: one small tiny-Qwen3-VL checkpoint per test session (built offline, ~1 s)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

#: Smaller than conf/policy/tiny_vl.yaml so the suite stays fast on 2 CPU cores.
TEST_SIZES = dict(
    text_hidden=64,
    text_layers=2,
    text_heads=2,
    text_kv_heads=1,
    head_dim=32,
    text_intermediate=128,
    vision_hidden=32,
    vision_depth=2,
    vision_heads=1,
    vision_intermediate=64,
    deepstack_indexes=[1],
)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    # One intra-op thread: the models here are tiny, and on a shared 2-core machine a 2-thread
    # OpenMP pool waiting for a busy core makes a small matmul ~100x slower than one thread.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "ckpt", TinyVLSizes(**TEST_SIZES), seed=0)


@pytest.fixture
def make_policy(tiny_dir):
    """load_policy on the session checkpoint (fresh model each call)."""
    from rlkit.policy import load_policy

    def _make(**kw):
        kw.setdefault("lora", {"rank": 4, "alpha": 8})
        kw.setdefault("device", "cpu")
        return load_policy(name="test_tiny", path=str(tiny_dir), **kw)

    return _make


def maze_image(seed: int, cells: int = 9, px: int = 25) -> Image.Image:
    """A maze-like picture: random black/white cells, a red agent cell and a green goal cell."""
    rng = np.random.default_rng(seed)
    grid = rng.random((cells, cells)) < 0.3
    img = np.where(grid[..., None], 0, 255).astype(np.uint8).repeat(3, axis=2)
    img[rng.integers(cells), rng.integers(cells)] = [255, 0, 0]
    img[rng.integers(cells), rng.integers(cells)] = [0, 255, 0]
    return Image.fromarray(img.repeat(px, axis=0).repeat(px, axis=1))


def perturb_lora(model, seed: int, scale: float = 0.5) -> None:
    """Give every LoRA tensor random values (a trained-looking adapter)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
