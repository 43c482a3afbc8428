"""Shared fixtures: one small tiny-Qwen3-VL checkpoint per test session (built offline, ~1 s)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import TEST_DTYPE
from tests.conftest import TINY_TEST_SIZES as TEST_SIZES  # noqa: E402,F401  (re-exported for tests)


@pytest.fixture(scope="session")
def tiny_dir(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture
def make_policy(tiny_dir):
    """load_policy on the session checkpoint (fresh model each call)."""
    from rlkit.policy import load_policy

    def _make(**kw):
        kw.setdefault("lora", {"rank": 4, "alpha": 8})
        kw.setdefault("device", "cpu")
        kw.setdefault("dtype", TEST_DTYPE)
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
