"""The shapes tasks: one small picture per integer seed, a question about it, and its one-word answer.

A task seed draws (with ``numpy.random.default_rng([seed, SALT])``) ``num_shapes`` shapes of distinct
kinds (square, circle, triangle) and distinct colours (red, green, blue, yellow), each in its own cell of
a 3x3 grid with a small jitter of position and size, on a black background. The question names one of
the shapes ("What colour is the circle?"); the answer is its colour, one word.

The asked shape's colour is ``COLOURS[seed % 4]``, so every run of 4 consecutive seeds holds each
answer once: the evaluation set 0..63 has 16 of each, and a policy that ignores the picture (always
"red", or any fixed mix) solves exactly 25% of it. The other draws come from the rng.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

#: Answer words, in the order ``seed % 4`` picks the asked shape's colour.
COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow")
#: RGB of each colour word (0-255).
RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 90, 235),
    "yellow": (235, 215, 40),
}
KINDS: tuple[str, ...] = ("square", "circle", "triangle")
BACKGROUND = (0, 0, 0)
#: Mixed into every seed's rng, so the shapes draws differ from other uses of the same seed.
SALT = 0x5A4E5


@dataclass(frozen=True)
class Shape:
    """One shape: ``kind`` in KINDS, ``colour`` in COLOURS, its bounding box's top-left corner
    (``x``, ``y``, px) and side ``size`` (px), inside an image of the task's size."""

    kind: str
    colour: str
    x: int
    y: int
    size: int


@dataclass(frozen=True)
class Task:
    """A drawn task: ``shapes`` (the asked one first) in an ``image_size`` x ``image_size`` picture."""

    seed: int
    image_size: int
    shapes: tuple[Shape, ...]

    @property
    def asked(self) -> Shape:
        return self.shapes[0]

    @property
    def question(self) -> str:
        return f"What colour is the {self.asked.kind}?"

    @property
    def answer(self) -> str:
        return self.asked.colour

    def key(self) -> bytes:
        """The task's identity (what the picture and question are): equal keys, equal tasks."""
        parts = [str(self.image_size)] + [f"{s.kind}:{s.colour}:{s.x}:{s.y}:{s.size}" for s in self.shapes]
        return "|".join(parts).encode()


def draw_task(seed: int, num_shapes: int = 1, image_size: int = 56) -> Task:
    """Task ``seed`` (any int >= 0) with ``num_shapes`` shapes (1..3) in an ``image_size`` px square
    picture (>= 24 px). Deterministic in its arguments.

    Raises:
        ValueError: num_shapes outside 1..3, image_size < 24, or a negative seed.
    """
    if not 1 <= int(num_shapes) <= len(KINDS):
        raise ValueError(f"env.num_shapes must be in 1..{len(KINDS)} (distinct kinds), got {num_shapes!r}")
    if int(image_size) < 24:
        raise ValueError(f"env.image_size must be >= 24 px (a 3x3 grid of shapes), got {image_size!r}")
    if int(seed) < 0:
        raise ValueError(f"task seeds are >= 0, got {seed!r}")
    seed, n, size = int(seed), int(num_shapes), int(image_size)
    rng = np.random.default_rng([seed, SALT])
    kinds = [KINDS[i] for i in rng.permutation(len(KINDS))[:n]]
    answer = COLOURS[seed % len(COLOURS)]
    others = [c for c in COLOURS if c != answer]
    colours = [answer] + [others[i] for i in rng.permutation(len(others))[: n - 1]]
    cells = rng.permutation(9)[:n]
    cell = size // 3
    shapes = []
    for kind, colour, c in zip(kinds, colours, cells):
        side = int(rng.integers(cell * 5 // 8, cell * 7 // 8 + 1))  # 10..14 px in a 56 px picture
        room = cell - side
        x = (c % 3) * cell + int(rng.integers(0, room + 1)) + (size - 3 * cell) // 2
        y = (c // 3) * cell + int(rng.integers(0, room + 1)) + (size - 3 * cell) // 2
        shapes.append(Shape(kind, colour, x, y, side))
    return Task(seed, size, tuple(shapes))


def render(task: Task) -> Image.Image:
    """The task's picture: RGB, ``task.image_size`` px square, the shapes on a black background."""
    img = Image.new("RGB", (task.image_size, task.image_size), BACKGROUND)
    d = ImageDraw.Draw(img)
    for s in task.shapes:
        box = (s.x, s.y, s.x + s.size - 1, s.y + s.size - 1)
        if s.kind == "square":
            d.rectangle(box, fill=RGB[s.colour])
        elif s.kind == "circle":
            d.ellipse(box, fill=RGB[s.colour])
        else:  # triangle, apex up
            d.polygon([(s.x + (s.size - 1) / 2, s.y), (s.x, s.y + s.size - 1), (s.x + s.size - 1, s.y + s.size - 1)],
                      fill=RGB[s.colour])
    return img
