"""Task sampling: which task seeds a GRPO step trains on.

Training seeds come from a seeded numpy stream over [0, 2**31) that skips every seed of the env's
evaluation set, so a reported eval success is never on a trained-on task. An env may map each stream
seed to the task it trains on (``EnvSpec.training_task``, e.g. VisGym's room-endpoint tasks); the
evaluation check applies to the mapped task. The sampler's position is
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
        to_task: maps a stream seed in [0, 2**31) to the task seed drawn (None: the seed itself); use
            ``training_sampler`` to take it from the env.

    Raises:
        ValueError: ``pool_size`` is not None or an int >= 1.
    """

    def __init__(self, seed: int, is_eval_seed: Callable[[int], bool], pool_size: int | None = None,
                 to_task: Callable[[int], int] | None = None):
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"train_tasks must be null (fresh tasks) or an int >= 1, got {pool_size!r}")
        self._seed = seed
        self._rng = np.random.default_rng([seed, 0x7A5C])
        self._is_eval_seed = is_eval_seed
        self._to_task = to_task
        self.num_drawn = 0
        self.pool: list[int] | None = None
        self._epoch_order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation of the pool)
        if pool_size is not None:
            self.pool = self._fresh(pool_size)

    def _fresh(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            s = int(self._rng.integers(SEED_SPACE))
            if self._to_task is not None:
                s = int(self._to_task(s))
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


class SolvedTaskFilter:
    """Pre-rollout filter of tasks whose groups keep carrying no signal (GRESO's selective rollout, Zheng et
    al. 2025, "Act Only When It Pays", section 4: a prompt whose groups had zero reward variance in its last
    k samplings is likely to again, so it is skipped before rollout with probability 1 - p^k).

    A group has zero reward variance either because every sample succeeded (*easy*) or because none did
    (*hard*). A task whose last ``k`` groups were all easy is admitted with probability ``explore ** k``;
    one whose last ``k`` groups were all hard with ``explore_hard ** k`` (``explore_hard`` None: never
    skipped, e.g. when the demonstration term learns from all-fail tasks); k counts up to ``max_streak``;
    a group with differing rewards resets k. Under DAPO dynamic sampling such a group would be drawn,
    rolled out and then filtered out: skipping it first saves its rollout. A task skipped by mistake is
    one that would have carried signal again, hence the exploration probabilities.

    Tasks are identified by ``key(seed)`` (the env's ``task_key``: the maze layout for VisGym, whose 7x7
    variant has only 768 layouts drawn again and again under fresh seeds; else the seed itself).

    Args:
        seed: the stream seed of the admit draws (the run's seed).
        explore: p for all-success tasks, in (0, 1]; 1 admits them all.
        explore_hard: p for all-fail tasks, in (0, 1], or None (never skipped).
        key: seed -> hashable task identity.
        max_streak: k is capped here (the smallest admit probability is p ** max_streak).

    State (``state_dict``): the per-task streaks (+k all-success, -k all-fail, 0 otherwise) and the admit
    stream, saved in checkpoints so a resumed run draws what it would have drawn.

    Raises: ValueError for an exploration probability outside (0, 1].
    """

    def __init__(self, seed: int, explore: float, key: Callable[[int], Any] | None = None, max_streak: int = 3,
                 explore_hard: float | None = None):
        for name, p in (("explore", explore), ("explore_hard", 1.0 if explore_hard is None else explore_hard)):
            if not 0.0 < p <= 1.0:
                raise ValueError(f"{name}={p} must be in (0, 1]")
        self.explore = float(explore)
        self.explore_hard = None if explore_hard is None else float(explore_hard)
        self.max_streak = int(max_streak)
        self._key = key or (lambda s: s)
        self._rng = np.random.default_rng([seed, 0x6E550])
        self.streaks: dict[str, int] = {}  # str(key) -> +k (k all-success groups running), -k (all-fail), 0
        self.skipped = 0  # draws refused so far

    def _id(self, seed: int) -> str:
        k = self._key(int(seed))
        return k.hex() if isinstance(k, bytes) else str(k)

    def admit(self, seed: int) -> bool:
        """Whether to roll out task ``seed`` now (one uniform draw when it has a streak that can skip)."""
        v = self.streaks.get(self._id(seed), 0)
        p = self.explore if v > 0 else self.explore_hard if v < 0 else None
        if p is None or float(self._rng.random()) < p ** min(abs(v), self.max_streak):
            return True
        self.skipped += 1
        return False

    def record(self, seed: int, solved: bool, failed: bool = False) -> None:
        """After a group of task ``seed`` whose rewards were all equal: ``solved`` = every sample succeeded,
        ``failed`` = none did; both False = the group carried signal (the streak resets)."""
        key = self._id(seed)
        v = self.streaks.get(key, 0)
        self.streaks[key] = max(v, 0) + 1 if solved else min(v, 0) - 1 if failed else 0

    def draw(self, sampler: "TaskSampler", n: int, max_draws: int = 64) -> list[int]:
        """``n`` task seeds from ``sampler``, skipping refused ones; after ``max_draws`` x n candidates the
        rest are taken unfiltered (a policy that solves every task still gets its batch)."""
        out: list[int] = []
        tried = 0
        while len(out) < n:
            for s in sampler.sample(n - len(out)):
                tried += 1
                if tried > max_draws * n or self.admit(s):
                    out.append(s)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"bit_generator": self._rng.bit_generator.state, "streaks": dict(self.streaks), "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["bit_generator"]
        self.streaks = {str(k): int(v) for k, v in state["streaks"].items()}
        self.skipped = int(state.get("skipped", 0))


def training_sampler(env_spec: Any, seed: int, pool_size: int | None = None) -> TaskSampler:
    """The ``TaskSampler`` of an env's training tasks: its evaluation check and, if the env has one, its
    ``training_task`` mapping (VisGym: ``env.train_room_endpoints``)."""
    return TaskSampler(seed, env_spec.is_eval_seed, pool_size=pool_size, to_task=getattr(env_spec, "training_task", None))
