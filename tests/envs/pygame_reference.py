"""Upstream VisGym maze_2d frames drawn with pygame itself, for pixel-exact comparisons in tests.

Follows upstream ``RandomMaze2DEnv._render_frame`` (VisGym commit 0289034) draw call by draw call:
fill white, a gray rect per wall cell, a red rect on the target, a white circle on the previous agent
cell (only after a successful move), a blue circle on the agent, circles centred at
``(cell + 0.5) * cell_size`` with radius ``cell_size / 4``. pygame is a dev dependency (pyproject's
[dev] extra, the version upstream pins), never a run-time one.
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
import pygame  # noqa: E402  (dev dependency: pip install -e ".[dev]")


def _centre(cell, cell_size: int) -> np.ndarray:
    # upstream passes (location[::-1] + 0.5) * size: a float64 (x, y) pair
    return (np.asarray(cell, dtype=np.int64)[::-1] + 0.5) * cell_size


class PygameCanvas:
    """An upstream canvas: ``draw(agent, prev)`` adds what one upstream ``_render_frame`` call adds
    to the canvas it keeps between steps; ``array()`` is upstream's rgb_array (uint8 [H, W, 3])."""

    def __init__(self, maze_map, goal, cell_size: int = 25):
        maze_map = np.asarray(maze_map)
        h, w = maze_map.shape
        self.cell_size = cell_size
        self.surface = pygame.Surface((w * cell_size, h * cell_size))
        self.surface.fill((255, 255, 255))
        for r in range(h):
            for c in range(w):
                if maze_map[r, c] == 1:
                    pygame.draw.rect(self.surface, (169, 169, 169),
                                     pygame.Rect(np.array([c, r]) * cell_size, (cell_size, cell_size)))
        pygame.draw.rect(self.surface, (255, 0, 0),
                         pygame.Rect(np.asarray(goal)[::-1] * cell_size, (cell_size, cell_size)))

    def draw(self, agent, prev=None) -> "PygameCanvas":
        if prev is not None:
            pygame.draw.circle(self.surface, (255, 255, 255), _centre(prev, self.cell_size), self.cell_size / 4)
        pygame.draw.circle(self.surface, (0, 0, 255), _centre(agent, self.cell_size), self.cell_size / 4)
        return self

    def array(self) -> np.ndarray:
        return np.transpose(np.array(pygame.surfarray.pixels3d(self.surface)), axes=(1, 0, 2))


def pygame_frame(maze_map, agent, goal, cell_size: int = 25) -> np.ndarray:
    """Upstream's frame of a fresh canvas (what ``reset`` + ``render()`` shows): uint8 [H, W, 3]."""
    return PygameCanvas(maze_map, goal, cell_size).draw(agent).array()
