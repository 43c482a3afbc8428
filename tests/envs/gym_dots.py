"""A small gymnasium env for the adapter's tests (envs/gym_text.py): count the dots.

``Dots-v0``: a 56 x 56 RGB picture of 1 to 4 white dots on black (uint8 [56, 56, 3]), one of ``Discrete(4)``
actions back (action a answers a + 1 dots). One step: the answer ends the episode, reward 1.0 when right. Info on
reset and step: ``count`` (the dots), ``expected`` (the right answer as a string); on step also ``is_success``. Registered on import as
``rlkit-test/Dots-v0``. ``parse_count`` and ``solve`` are its text parser and solver; ``count_reward`` a TRL-style
reward function for it. tests/envs/test_out_of_tree.py copies this file out of the clone as an out-of-tree env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "rlkit-test/Dots-v0"
SIDE, CELL = 56, 8  # 7 x 7 cells of 8 px, a dot fills 6 x 6 px of one


def draw(seed: int) -> tuple[int, list[int]]:
    """Task ``seed``: the number of dots (1..4) and the cells (0..48) they fill."""
    rng = np.random.default_rng(int(seed))
    count = int(rng.integers(1, 5))
    return count, sorted(int(c) for c in rng.choice(49, size=count, replace=False))


class Dots(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(0, 255, shape=(SIDE, SIDE, 3), dtype=np.uint8)
        self.action_space = spaces.Discrete(4)
        self.count = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count, cells = draw(seed if seed is not None else int(self.np_random.integers(2**31 - 1)))
        image = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
        for c in cells:
            r, k = divmod(c, 7)
            image[r * CELL + 1:r * CELL + 7, k * CELL + 1:k * CELL + 7] = 255
        return image, {"count": self.count, "expected": str(self.count)}

    def step(self, action):
        right = int(action) + 1 == self.count
        info = {"count": self.count, "expected": str(self.count), "is_success": right}
        return np.zeros((SIDE, SIDE, 3), dtype=np.uint8), float(right), True, False, info


def parse_count(text: str) -> int:
    """The action of a text that is one digit 1-4 (surrounding spaces ignored): the digit minus 1. Raises ValueError
    on anything else (the adapter turns that into an invalid action)."""
    return int(text.strip()) - 1


def solve(seed: int) -> list[str]:
    """The right answer of task ``seed``, as the one policy turn's text."""
    return [str(draw(seed)[0])]


def count_reward(prompts, completions, expected, **kwargs):
    """A TRL-style reward function: 1.0 where the completion, stripped, is the expected count."""
    return [float(c.strip() == e) for c, e in zip(completions, expected)]


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=Dots)
