"""Task sampling: which task seeds a GRPO step trains on.

Training seeds come from a seeded numpy stream over [0, 2**31) that skips every seed of the env's
evaluation set, so a reported eval success is never on a trained-on task. The sampler's position is
part of a checkpoint (``state_dict``), so a resumed run draws exactly the tasks it would have drawn.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

SEED_SPACE = 2**31


class TaskSampler:
    """Draws training task seeds, never evaluation ones.

    Args:
        seed: stream seed (the run's ``seed``).
        is_eval_seed: predicate from the EnvSpec; True seeds are skipped.
    """

    def __init__(self, seed: int, is_eval_seed: Callable[[int], bool]):
        self._rng = np.random.default_rng([seed, 0x7A5C])
        self._is_eval_seed = is_eval_seed
        self.num_drawn = 0

    def sample(self, n: int) -> list[int]:
        """Return the next ``n`` training task seeds (distinct from every evaluation seed)."""
        out: list[int] = []
        while len(out) < n:
            s = int(self._rng.integers(SEED_SPACE))
            if not self._is_eval_seed(s):
                out.append(s)
        self.num_drawn += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self._rng.bit_generator.state, "num_drawn": self.num_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["bit_generator"]
        self.num_drawn = int(state["num_drawn"])
