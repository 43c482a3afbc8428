"""Shared fixtures for the env tests."""

import json
from pathlib import Path

import pytest

# The repo root's sibling folder `shared/` holds the recorded upstream VisGym layouts.
TESTDATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "testdata"
MAZE_VECTORS = TESTDATA / "visgym_maze2d_seeds0-7.json"


@pytest.fixture(scope="session")
def maze_vectors() -> dict:
    """{"maze_2d/easy": [records], "maze_2d/hard": [records]} recorded from upstream VisGym."""
    if not MAZE_VECTORS.is_file():
        pytest.skip(f"upstream maze test vectors not found at {MAZE_VECTORS.resolve()} (../shared/testdata)")
    return json.loads(MAZE_VECTORS.read_text())["envs"]
