"""RGB rendering of a VisGym maze_2d state.

Colour rules follow upstream VisGym maze_2d: white background, walls filled gray (169, 169, 169),
the goal cell filled red (255, 0, 0), the agent a filled blue (0, 0, 255) disc of radius
cell_size / 4 centred in its cell, no grid lines; 25 pixels per cell by default
(225x225 for easy, 275x275 for hard).

Difference from upstream, on purpose: upstream draws incrementally and leaves a white disc on the
goal cell once the agent has stepped on it and off again; here every frame is drawn from the
state (maze, agent, goal) alone, so the goal is always a full red cell.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

WHITE = (255, 255, 255)
WALL_GRAY = (169, 169, 169)
GOAL_RED = (255, 0, 0)
AGENT_BLUE = (0, 0, 255)
DEFAULT_CELL_SIZE = 25


def render_array(
    maze_map: np.ndarray,
    agent: tuple[int, int],
    goal: tuple[int, int],
    cell_size: int = DEFAULT_CELL_SIZE,
) -> np.ndarray:
    """Draw the maze state as an RGB array.

    Args:
        maze_map: int [H, W], 1 wall / 0 free.
        agent, goal: ``(row, col)`` cells.
        cell_size: pixels per cell side (>= 4).

    Returns:
        uint8 [H * cell_size, W * cell_size, 3]. The agent disc covers the pixels whose centre lies
        within cell_size / 4 pixels of the agent cell's centre; it is drawn over the goal colour.

    Raises:
        ValueError: ``cell_size`` < 4 or not an int.
    """
    if not isinstance(cell_size, (int, np.integer)) or isinstance(cell_size, bool) or cell_size < 4:
        raise ValueError(f"cell_size must be an int >= 4 pixels, got {cell_size!r}")
    cell_size = int(cell_size)
    walls = np.asarray(maze_map) == 1
    h, w = walls.shape
    img = np.empty((h, w, 3), dtype=np.uint8)
    img[:] = WHITE
    img[walls] = WALL_GRAY
    img[int(goal[0]), int(goal[1])] = GOAL_RED
    img = np.repeat(np.repeat(img, cell_size, axis=0), cell_size, axis=1)

    # Agent disc: pixel centres (y + 0.5, x + 0.5) within radius of the cell centre.
    centre = (cell_size / 2.0) - 0.5  # offset, in pixel indices, of the cell centre
    yy, xx = np.mgrid[0:cell_size, 0:cell_size]
    disc = (yy - centre) ** 2 + (xx - centre) ** 2 <= (cell_size / 4.0) ** 2
    r0, c0 = int(agent[0]) * cell_size, int(agent[1]) * cell_size
    img[r0 : r0 + cell_size, c0 : c0 + cell_size][disc] = AGENT_BLUE
    return img


def render_image(
    maze_map: np.ndarray,
    agent: tuple[int, int],
    goal: tuple[int, int],
    cell_size: int = DEFAULT_CELL_SIZE,
) -> Image.Image:
    """``render_array`` as a PIL RGB image (width = W * cell_size, height = H * cell_size pixels)."""
    return Image.fromarray(render_array(maze_map, agent, goal, cell_size))
