"""VisGym maze_2d: maze generation, shortest-path solver and text rendering.

Reproduces the upstream VisGym ``maze_2d`` task layouts exactly (checked against layouts recorded
from upstream ``reset(seed=s)``, see tests/envs). A maze is a square grid with a wall border:
``maze_2d/easy`` is 9x9 cells, ``maze_2d/hard`` 11x11. ``maze_map[row, col]`` is 1 for a wall and 0
for a free cell; positions are ``(row, col)`` with row 0 at the top. ``small`` (7x7, a 3x3 tree of
corridor nodes) is rlkit's own variant from the same generator, for fast CPU experiments; it has 768
distinct layouts (192 spanning trees x 4 corner pairs), so held-out sets must be kept apart by
layout, not by seed (``layout_key``).

Generation (upstream order of random draws, which is what makes the layouts identical):
Wilson's algorithm (loop-erased random walks, a uniform spanning tree) on the cells of the inner
grid whose row and column are both even, followed by a draw of one of four corner-to-corner
(start, goal) pairs.

Two direction numberings exist upstream and both are kept here:
- generator directions (internal): 0 right, 1 down, 2 left, 3 up;
- action directions (what the policy emits, ``MOVE_DELTAS``): 0 right, 1 up, 2 left, 3 down.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

#: Grid side length (cells, wall border included) per variant: upstream's easy and hard, rlkit's small.
VARIANT_SIZES: dict[str, int] = {"easy": 9, "hard": 11, "small": 7}

#: Action direction -> (d_row, d_col). Upstream action numbering: 0 right, 1 up, 2 left, 3 down.
MOVE_DELTAS: tuple[tuple[int, int], ...] = ((0, 1), (-1, 0), (0, -1), (1, 0))

#: Action direction -> word, as used by the keyword and plan formats.
MOVE_NAMES: tuple[str, ...] = ("right", "up", "left", "down")

# Generator direction -> (d_row, d_col). Upstream generator numbering: 0 right, 1 down, 2 left, 3 up.
_GEN_DELTAS: tuple[tuple[int, int], ...] = ((0, 1), (1, 0), (0, -1), (-1, 0))

Pos = tuple[int, int]


def _wilson_carve(rows: int, cols: int, py: random.Random) -> np.ndarray:
    """Carve a perfect maze on a rows x cols inner grid with Wilson's algorithm.

    Returns an int array [rows, cols], 1 = carved (free), 0 = not carved. The draws from ``py``
    follow upstream exactly: see ``generate_maze``.
    """
    carved = np.zeros((rows, cols), dtype=np.int64)
    cells: list[Pos] = [(r, c) for r in range(0, rows, 2) for c in range(0, cols, 2)]
    in_maze: set[Pos] = set()

    first = cells.pop(py.randint(0, len(cells) - 1))
    in_maze.add(first)
    carved[first] = 1

    while cells:
        start = cells[py.randint(0, len(cells) - 1)]
        # Random walk until it hits the maze; the last direction recorded per cell erases loops.
        walk_dir: dict[Pos, int] = {}
        cur = start
        while cur not in in_maze:
            while True:
                d = py.randint(0, 3)
                nr, nc = cur[0] + 2 * _GEN_DELTAS[d][0], cur[1] + 2 * _GEN_DELTAS[d][1]
                if 0 <= nr < rows and 0 <= nc < cols:
                    break
            walk_dir[cur] = d
            cur = (nr, nc)
        # Retrace the loop-erased path from the start and add it to the maze.
        cur = start
        while cur not in in_maze:
            in_maze.add(cur)
            cells.remove(cur)
            carved[cur] = 1
            dr, dc = _GEN_DELTAS[walk_dir[cur]]
            carved[cur[0] + dr, cur[1] + dc] = 1
            cur = (cur[0] + 2 * dr, cur[1] + 2 * dc)
    return carved


def generate_maze(seed: int, size: int) -> tuple[np.ndarray, Pos, Pos]:
    """Generate the upstream VisGym maze_2d layout for task ``seed``.

    Args:
        seed: task seed (any int accepted by ``numpy.random.default_rng``), as in upstream
            ``env.reset(seed=seed)``.
        size: grid side length in cells, wall border included: 9 (maze_2d/easy), 11 (maze_2d/hard) or
            7 (rlkit's ``small``: the same generator on a 5x5 inner grid).

    Returns:
        ``(maze_map, start, goal)``: ``maze_map`` int64 [size, size], 1 wall / 0 free;
        ``start`` (agent) and ``goal`` (target) as ``(row, col)`` tuples of free cells.

    Raises:
        ValueError: ``size`` is not 7, 9 or 11.

    Source: upstream VisGym maze_2d. ``rng = numpy.random.default_rng(seed)`` seeds a
    ``random.Random(int(rng.integers(2**32)))`` that drives Wilson's algorithm on the inner
    (size-2)x(size-2) grid; then ``rng.integers(0, 4)`` picks the (start, goal) corner pair:
    top-left->bottom-right, bottom-right->top-left, bottom-left->top-right, top-right->bottom-left.
    """
    if size not in VARIANT_SIZES.values():
        raise ValueError(
            f"maze size must be 7 (small), 9 (maze_2d/easy) or 11 (maze_2d/hard), got {size!r}"
        )
    rng = np.random.default_rng(seed)
    py = random.Random(int(rng.integers(2**32)))
    inner = size - 2
    carved = _wilson_carve(inner, inner, py)

    maze_map = np.ones((size, size), dtype=np.int64)
    maze_map[1:-1, 1:-1] = 1 - carved

    lo, hi = 1, size - 2
    top_left, bottom_right = (lo, lo), (hi, hi)
    bottom_left, top_right = (hi, lo), (lo, hi)
    pairs = (
        (top_left, bottom_right),
        (bottom_right, top_left),
        (bottom_left, top_right),
        (top_right, bottom_left),
    )
    start, goal = pairs[int(rng.integers(0, 4))]
    return maze_map, start, goal


def layout_key(seed: int, size: int) -> bytes:
    """What makes task ``seed`` the task it is: its walls, start and goal, as bytes.

    Two seeds with the same key are the same maze (same picture, same solution). Small grids repeat
    layouts often (7x7: 768 distinct layouts), and even 9x9 does over a long run (401,408 layouts: a
    25,600-maze warm start draws about 4 of 64 given layouts on average), so evaluation sets exclude
    training seeds by this key, not by seed number.

    Raises:
        ValueError: as ``generate_maze``.
    """
    return maze_key(*generate_maze(seed, size))


def maze_key(maze_map: np.ndarray, start: Pos, goal: Pos) -> bytes:
    """``layout_key`` of a maze given as ``(maze_map [size, size], start, goal)`` rather than by seed: the walls
    as uint8 bytes in row order, then the start's and the goal's (row, col)."""
    return np.asarray(maze_map).astype(np.uint8).tobytes() + bytes((*start, *goal))


def dihedral_keys(maze_map: np.ndarray, start: Pos, goal: Pos) -> set[bytes]:
    """``maze_key`` of the maze and of its images under the 8 symmetries of the square (4 rotations, each
    with and without a left-right mirror): the same maze seen turned or mirrored, whose route is the
    original's with its moves turned the same way. Symmetric mazes give fewer than 8 distinct keys.

    Every image of a corner-to-corner tree is itself a corner-to-corner tree of the same size, so on 7x7
    (768 layouts) every one of the 64 evaluation mazes has turned or mirrored
    twins among the training layouts; ``VisGymMaze(holdout="dihedral")`` keeps them out of training.

    Args:
        maze_map: int [size, size], 1 wall / 0 free (square).
        start, goal: ``(row, col)``.

    Returns:
        A set of 1 to 8 keys, the maze's own among them.

    Raises:
        ValueError: ``maze_map`` is not square.
    """
    grid = np.asarray(maze_map)
    n = grid.shape[0]
    if grid.ndim != 2 or grid.shape[1] != n:
        raise ValueError(f"dihedral_keys needs a square maze, got shape {grid.shape}")
    cells = np.arange(n * n).reshape(n, n)  # where each cell of the original lands, transformed alongside
    keys = set()
    for turns in range(4):
        for mirror in (False, True):
            g, c = np.rot90(grid, turns), np.rot90(cells, turns)
            if mirror:
                g, c = g[:, ::-1], c[:, ::-1]
            where = {int(v): (int(r), int(k)) for (r, k), v in np.ndenumerate(c)}
            keys.add(maze_key(np.ascontiguousarray(g), where[start[0] * n + start[1]], where[goal[0] * n + goal[1]]))
    return keys


def step_position(maze_map: np.ndarray, pos: Pos, direction: int) -> Pos:
    """Position after one move in action direction ``direction`` (0 right, 1 up, 2 left, 3 down).

    A move into a wall (or off the grid) leaves the agent in place, as upstream.

    Raises:
        ValueError: ``direction`` is not 0..3.
    """
    if direction not in (0, 1, 2, 3):
        raise ValueError(f"move direction must be 0, 1, 2 or 3, got {direction!r}")
    dr, dc = MOVE_DELTAS[direction]
    r, c = pos[0] + dr, pos[1] + dc
    h, w = maze_map.shape
    if 0 <= r < h and 0 <= c < w and maze_map[r, c] == 0:
        return (r, c)
    return (int(pos[0]), int(pos[1]))


def distance_map(maze_map: np.ndarray, goal: Pos) -> np.ndarray:
    """Shortest-path distance (moves) from every cell to ``goal`` by BFS.

    Returns int64 [H, W]; -1 for walls and cells that cannot reach the goal.
    """
    h, w = maze_map.shape
    dist = np.full((h, w), -1, dtype=np.int64)
    goal = (int(goal[0]), int(goal[1]))
    dist[goal] = 0
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVE_DELTAS:
            nr, nc = r + dr, c + dc
            if 0 <= nr < h and 0 <= nc < w and maze_map[nr, nc] == 0 and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def solve(maze_map: np.ndarray, start: Pos, goal: Pos) -> list[Pos]:
    """Shortest path from ``start`` to ``goal`` by breadth-first search.

    Returns the list of ``(row, col)`` cells from ``start`` to ``goal`` inclusive, so its length
    is the number of moves + 1 (mazes from ``generate_maze`` are perfect, so the path is unique; in a
    map with loops shortest paths may tie, and the first in action order wins).
    Neighbours are expanded in action order (right, up, left, down).

    Raises:
        ValueError: ``start`` or ``goal`` is a wall, or the goal cannot be reached.
    """
    start = (int(start[0]), int(start[1]))
    goal = (int(goal[0]), int(goal[1]))
    for name, p in (("start", start), ("goal", goal)):
        if maze_map[p] != 0:
            raise ValueError(f"{name} {p} is a wall cell")
    dist = distance_map(maze_map, goal)
    if dist[start] < 0:
        raise ValueError(f"goal {goal} is not reachable from {start}")
    path = [start]
    cur = start
    while cur != goal:
        for d in range(4):
            nxt = step_position(maze_map, cur, d)
            if nxt != cur and dist[nxt] == dist[cur] - 1:
                cur = nxt
                break
        path.append(cur)
    return path


def path_to_moves(path: list[Pos]) -> list[int]:
    """Action directions (0 right, 1 up, 2 left, 3 down) that walk along ``path``.

    Raises:
        ValueError: two consecutive cells of ``path`` are not 4-neighbours.
    """
    moves = []
    for a, b in zip(path, path[1:]):
        delta = (b[0] - a[0], b[1] - a[1])
        if delta not in MOVE_DELTAS:
            raise ValueError(f"cells {a} -> {b} are not neighbours")
        moves.append(MOVE_DELTAS.index(delta))
    return moves


def solve_moves(maze_map: np.ndarray, start: Pos, goal: Pos) -> list[int]:
    """Shortest move sequence (action directions, stop not included) from ``start`` to ``goal``.

    Used for SFT demonstrations and tests; see ``solve`` for the errors raised.
    """
    return path_to_moves(solve(maze_map, start, goal))


def render_text(maze_map: np.ndarray, agent: Pos, goal: Pos) -> str:
    """Text picture of the maze for logs and text-only baselines.

    One line per row, top row first: ``#`` wall, ``.`` free, ``G`` goal, ``A`` agent (drawn over
    the goal when the agent stands on it).
    """
    chars = np.where(np.asarray(maze_map) == 1, "#", ".").astype("<U1")
    chars[int(goal[0]), int(goal[1])] = "G"
    chars[int(agent[0]), int(agent[1])] = "A"
    return "\n".join("".join(row) for row in chars)
