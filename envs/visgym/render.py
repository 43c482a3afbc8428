"""RGB rendering of a VisGym maze_2d state.

Colour rules follow upstream VisGym maze_2d (commit 0289034, ``RandomMaze2DEnv._render_frame``),
checked frame by frame against upstream's own images in tests/envs/test_visgym_parity.py:
white background, walls filled gray (169, 169, 169), the goal cell filled red (255, 0, 0), the agent
a filled blue (0, 0, 255) disc, no grid lines; 25 pixels per cell by default (225x225 for easy,
275x275 for hard).

The disc is pixel-identical to upstream's ``pygame.draw.circle(surface, blue,
((col + 0.5) * cell, (row + 0.5) * cell), cell / 4)`` for every cell size, without pygame: pygame
truncates the centre and the radius to ints (centre ``cell // 2`` pixels into the cell, radius
``cell // 4``) and fills the rows of a midpoint-circle rasterisation around the pixel corner at that
centre (``agent_disc_mask``). For a 25-pixel cell that is 104 pixels, rows and columns 6..17.
tests/envs/test_visgym_render.py compares it with pygame's own drawing for many cell sizes.

Difference from upstream, on purpose (envs/visgym/README.md lists all): upstream draws incrementally
and leaves a white disc on the goal cell once the agent has stepped on it and off again; here every
frame is drawn from the state (maze, agent, goal) alone, so the goal is always a full red cell.
"""

from __future__ import annotations

from functools import lru_cache

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
        uint8 [H * cell_size, W * cell_size, 3]. The agent disc (``agent_disc_mask``) is drawn over
        the goal colour when the agent stands on the goal.

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

    disc = agent_disc_mask(cell_size)
    r0, c0 = int(agent[0]) * cell_size, int(agent[1]) * cell_size
    img[r0 : r0 + cell_size, c0 : c0 + cell_size][disc] = AGENT_BLUE
    return img


@lru_cache(maxsize=64)
def agent_disc_mask(cell_size: int) -> np.ndarray:
    """The agent disc inside one cell, as upstream VisGym draws it with pygame.

    Upstream calls ``pygame.draw.circle(canvas, colour, ((col + 0.5) * cell_size,
    (row + 0.5) * cell_size), cell_size / 4)`` (filled). pygame (2.x, ``draw.c``) truncates the
    centre and radius to ints, so within the cell the centre is the pixel corner ``(c, c)`` with
    ``c = cell_size // 2`` and the radius is ``r = cell_size // 4``. It walks one octant of the circle
    with the integer midpoint rule and fills, for every point ``(x, y)`` it visits, the rows
    ``c - x`` and ``c + x - 1`` over columns ``c - y .. c + y - 1`` (and the rows at ``y`` over
    ``x`` columns when the walk is about to step ``y`` down): a disc of 2r rows and columns,
    symmetric about that corner. This function finds the same half-widths per row offset with its
    own walk and fills them.

    Args:
        cell_size: pixels per cell side (>= 4, so that r >= 1).

    Returns:
        bool [cell_size, cell_size], True on the disc's pixels (row, col within the cell);
        read-only (cached per cell size).
    """
    r, c = cell_size // 4, cell_size // 2
    mask = np.zeros((cell_size, cell_size), dtype=bool)

    def fill(k: int, w: int) -> None:
        # Rows c - k and c + k - 1 (the pair mirrored about the centre corner), columns
        # c - w .. c + w - 1; pygame draws a span given end-first in order, so w = 0 gives 2 pixels.
        a, b = sorted((c - w, c + w - 1))
        for row in (c - k, c + k - 1):
            mask[row, a : b + 1] = True

    x, y = 0, r
    d = 1 - r  # midpoint decision value: >= 0 when the next midpoint lies outside the circle
    while x < y:
        if d >= 0:
            y -= 1
            d -= 2 * y
        x += 1
        d += 2 * x + 1
        if d >= 0:  # y steps down next: (x, y) is the last, widest span on row offset y
            fill(y, x)
        fill(x, y)
    mask.flags.writeable = False
    return mask


def render_image(
    maze_map: np.ndarray,
    agent: tuple[int, int],
    goal: tuple[int, int],
    cell_size: int = DEFAULT_CELL_SIZE,
) -> Image.Image:
    """``render_array`` as a PIL RGB image (width = W * cell_size, height = H * cell_size pixels)."""
    return Image.fromarray(render_array(maze_map, agent, goal, cell_size))
