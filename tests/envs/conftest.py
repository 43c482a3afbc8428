"""Shared fixtures for the env tests."""

import json
from pathlib import Path

import pytest

# The upstream VisGym layouts recorded with reset(seed=s) (its "source" field says how), kept in the repository so
# that a plain clone runs the env tests.
MAZE_VECTORS = Path(__file__).resolve().parent / "data" / "visgym_maze2d_seeds0-7.json"


@pytest.fixture(scope="session")
def maze_vectors() -> dict:
    """{"maze_2d/easy": [records], "maze_2d/hard": [records]} recorded from upstream VisGym."""
    return json.loads(MAZE_VECTORS.read_text())["envs"]
