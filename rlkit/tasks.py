"""Task sampling: which task seeds a GRPO step trains on.

Training seeds come from a seeded numpy stream over [0, 2**31) that skips every seed of the env's
evaluation set (``EnvSpec.is_eval_seed``, which may hold out more than the evaluation seeds themselves, e.g.
VisGym's layout-level holdout), so a reported eval success is never on a trained-on task. The sampler's position is
part of a checkpoint (``state_dict``), so a resumed run draws exactly the tasks it would have drawn.

With ``pool_size`` N (``train_tasks: N`` in conf/train.yaml) the sampler is a fixed training set instead:
the stream's first N seeds, visited in epochs, each epoch a fresh seeded permutation (a dataset with
shuffling, as a dataloader over N prompts). A fixed pool shows whether the update can fit the tasks it
trains on at all (its training success rises towards 1) apart from whether that carries over to the
evaluation set.
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
        pool_size: None: a fresh task for every draw. N >= 1: a fixed pool of N training tasks (the
            stream's first N seeds), drawn epoch by epoch without replacement, each epoch in a new order
            seeded by (seed, epoch).

    Raises:
        ValueError: ``pool_size`` is not None or an int >= 1.
    """

    def __init__(self, seed: int, is_eval_seed: Callable[[int], bool], pool_size: int | None = None):
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"train_tasks must be null (fresh tasks) or an int >= 1, got {pool_size!r}")
        self._seed = seed
        self._rng = np.random.default_rng([seed, 0x7A5C])
        self._is_eval_seed = is_eval_seed
        self.num_drawn = 0
        self.pool: list[int] | None = None
        self._epoch_order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation of the pool)
        if pool_size is not None:
            self.pool = self._fresh(pool_size)

    def _fresh(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            s = int(self._rng.integers(SEED_SPACE))
            if not self._is_eval_seed(s):
                out.append(s)
        return out

    def _from_pool(self, i: int) -> int:
        """The i-th draw (0-based) from the pool: position i % N of epoch i // N's permutation."""
        assert self.pool is not None
        n = len(self.pool)
        if self._epoch_order is None or self._epoch_order[0] != i // n:
            self._epoch_order = (i // n, np.random.default_rng([self._seed, 0x7A5C, i // n]).permutation(n))
        return self.pool[int(self._epoch_order[1][i % n])]

    def sample(self, n: int) -> list[int]:
        """Return the next ``n`` training task seeds (distinct from every evaluation seed)."""
        if self.pool is None:
            out = self._fresh(n)
        else:
            out = [self._from_pool(i) for i in range(self.num_drawn, self.num_drawn + n)]
        self.num_drawn += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self._rng.bit_generator.state, "num_drawn": self.num_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["bit_generator"]
        self.num_drawn = int(state["num_drawn"])


def training_sampler(env_spec: Any, seed: int, pool_size: int | None = None) -> TaskSampler:
    """The ``TaskSampler`` of an env's training tasks (its evaluation check)."""
    return TaskSampler(seed, env_spec.is_eval_seed, pool_size=pool_size)
