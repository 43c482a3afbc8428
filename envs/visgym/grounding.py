"""Visual grounding questions about VisGym mazes, from the env's own generator and renderer.

What a real VLM learns before it is fine-tuned on a task: to read the picture. rlkit's grounding
stage (rlkit.grounding) trains the tiny policy on these questions before the SFT warm start. Each
question is a single user turn with the maze image and a short answer whose correctness is exact.

Tasks (``GROUNDING_TASKS``):
    cell   "What is in row r, column c?" -> "wall" | "free" | "agent" | "goal", for a uniformly drawn
           interior cell (the always-wall border is never asked).
    agent  "Where is the blue dot?" -> "row r, column c".
    goal   "Where is the red square?" -> "row r, column c".
    moves  "Which moves are open from the blue dot?" -> the open directions in MOVE_NAMES order
           ("right up" ...), "none" if boxed in.
    walls  "Transcribe the walls between rooms." -> every wall bit in reading order (row by row, left
           to right), each as its letter label then ``#`` (wall) or ``.`` (open): "a#b.c#..." (12
           bits in a 7x7 maze, 24 in 9x9, 40 in 11x11; labels a-z then A-Z). The label names the
           value that follows it, so the value's query finds its cell by content (one token per label
           in the tiny tokenizer) instead of by counting positions.

Rows and columns count from 0 at the top-left cell of the full grid (border included), the same
coordinates as ``generate_maze``'s ``maze_map[row, col]``. The agent and the goal are put on two
distinct free cells drawn at random (not the env's start corners), so their positions cannot be
answered from a prior. A "wall bit" is an interior cell with row + col odd: the passage between
two adjacent rooms (rooms are the odd-odd cells, always free; even-even interior cells are always
walls). Whether a wall bit is open is the only thing about a layout that cannot be known without
looking: 24 of them in a 9x9 maze.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from envs.visgym.maze import MOVE_NAMES, VARIANT_SIZES, generate_maze, step_position
from envs.visgym.render import DEFAULT_CELL_SIZE, render_image

GROUNDING_TASKS: tuple[str, ...] = ("cell", "agent", "goal", "moves", "walls")

#: Labels of the wall bits in a ``walls`` answer, in reading order (enough for 11x11: 40 bits).
WALL_LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class GroundingExample:
    """One grounding question.

    task: one of GROUNDING_TASKS. seed: the maze's task seed. image: the rendered maze (PIL RGB).
    question: the user text. answer: the exact expected assistant text.
    wall_bit: for task "cell", True if the asked cell is a wall bit (see module doc).
    bit_offsets: for task "walls", the character offset in ``answer`` of each wall bit's value
        (``#`` or ``.``), so per-bit accuracy can be scored token by token.
    """

    task: str
    seed: int
    image: Image.Image
    question: str
    answer: str
    wall_bit: bool = False
    bit_offsets: tuple[int, ...] = ()


def _where(pos: tuple[int, int]) -> str:
    return f"row {pos[0]}, column {pos[1]}"


def cell_answer(maze_map: np.ndarray, agent: tuple[int, int], goal: tuple[int, int], cell: tuple[int, int]) -> str:
    """What the picture shows at ``cell``: "agent" (blue dot, drawn over the goal), "goal", "wall", "free"."""
    if tuple(cell) == tuple(agent):
        return "agent"
    if tuple(cell) == tuple(goal):
        return "goal"
    return "wall" if int(maze_map[cell[0], cell[1]]) == 1 else "free"


def open_moves(maze_map: np.ndarray, pos: tuple[int, int]) -> list[str]:
    """Names of the moves (MOVE_NAMES order: right, up, left, down) that leave ``pos`` for a free cell."""
    return [name for d, name in enumerate(MOVE_NAMES) if step_position(maze_map, pos, d) != tuple(pos)]


def wall_bit_cells(size: int) -> list[tuple[int, int]]:
    """The wall bits of a ``size`` x ``size`` maze in reading order: interior cells with row + col odd."""
    return [(r, c) for r in range(1, size - 1) for c in range(1, size - 1) if (r + c) % 2 == 1]


def walls_answer(maze_map: np.ndarray) -> tuple[str, tuple[int, ...]]:
    """The ``walls`` transcription of a layout and the offsets of its values.

    Returns ("a#b.c#...", (1, 3, 5, ...)): label, then ``#`` if the wall bit is a wall, ``.`` if open.
    Raises ValueError if the maze has more wall bits than WALL_LABELS (larger than 11x11).
    """
    cells = wall_bit_cells(maze_map.shape[0])
    if len(cells) > len(WALL_LABELS):
        raise ValueError(f"a {maze_map.shape[0]}x{maze_map.shape[0]} maze has {len(cells)} wall bits; "
                         f"the walls task labels at most {len(WALL_LABELS)}")
    text = "".join(f"{WALL_LABELS[k]}{'#' if maze_map[r, c] == 1 else '.'}" for k, (r, c) in enumerate(cells))
    return text, tuple(range(1, 2 * len(cells), 2))


def grounding_example(
    seed: int, task: str, rng: np.random.Generator, variant: str = "easy", cell_size: int = DEFAULT_CELL_SIZE
) -> GroundingExample:
    """Draw one grounding question on the maze of task ``seed``.

    Args:
        seed: maze task seed (``generate_maze``). task: one of GROUNDING_TASKS.
        rng: draws the agent/goal cells and the asked cell (so one maze gives many questions).
        variant: "easy" (9x9) or "hard" (11x11). cell_size: pixels per cell of the image.

    Returns:
        GroundingExample with a PIL RGB image of (size * cell_size)^2 pixels.

    Raises:
        ValueError: unknown task or variant.
    """
    if task not in GROUNDING_TASKS:
        raise ValueError(f"grounding task {task!r} is not one of {GROUNDING_TASKS}")
    if variant not in VARIANT_SIZES:
        raise ValueError(f"variant must be one of {sorted(VARIANT_SIZES)}, got {variant!r}")
    size = VARIANT_SIZES[variant]
    maze_map, _, _ = generate_maze(seed, size)
    free = np.argwhere(maze_map == 0)
    i, j = rng.choice(len(free), size=2, replace=False)
    agent, goal = tuple(int(v) for v in free[i]), tuple(int(v) for v in free[j])
    image = render_image(maze_map, agent, goal, cell_size)
    wall_bit, bit_offsets = False, ()
    if task == "cell":
        r, c = (int(v) for v in rng.integers(1, size - 1, size=2))
        question, answer = f"What is in row {r}, column {c}?", cell_answer(maze_map, agent, goal, (r, c))
        wall_bit = (r + c) % 2 == 1
    elif task == "agent":
        question, answer = "Where is the blue dot?", _where(agent)
    elif task == "goal":
        question, answer = "Where is the red square?", _where(goal)
    elif task == "moves":
        question = "Which moves are open from the blue dot?"
        answer = " ".join(open_moves(maze_map, agent)) or "none"
    else:
        question = "Transcribe the walls between rooms."
        answer, bit_offsets = walls_answer(maze_map)
    return GroundingExample(task, seed, image, question, answer, wall_bit, bit_offsets)
