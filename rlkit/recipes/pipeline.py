"""How a step's update runs against the sampling: in turn, or pipelined (``backend.one_step_off_policy``).

A pipelined executor (``Executor.pipelined``: RayExecutor with one_step_off_policy) samples step s + 1 with adapter
s - 1 while step s's update runs, so the rollout workers never wait for the trainer; the batch sampled ahead is
the one step s + 1 trains on (its advantages are computed then, by the recipe). Nothing is sampled ahead after
the last step, nor after a step that ends at a checkpoint, so a checkpoint never holds a half-made batch and a run
resumed from it samples what the uninterrupted run sampled. Any other executor runs the update in turn: this
module then only times it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rlkit.recipes.executor import Executor
from rlkit.sampling import SampledBatch


class StepPipeline:
    """The update of each step, with the next step's batch sampled meanwhile when ``executor.pipelined``.

    Args:
        executor: the run's executor (``pipelined``, ``sample_with``, ``finish_update``, ``settle``).
        steps: the run's step count. ckpt_interval: trainer.ckpt_interval (0: only the final checkpoint).
        progress: the console's (``phase``).
    """

    def __init__(self, executor: Executor, steps: int, ckpt_interval: int, progress: Any):
        self.executor, self.steps, self.ckpt_interval, self.progress = executor, steps, ckpt_interval, progress
        self.ahead: SampledBatch | None = None  # the batch sampled during the last update

    def take(self, step: int) -> SampledBatch | None:
        """The batch sampled ahead for ``step`` (1-based), or None: sample it now. Forgets it either way."""
        batch, self.ahead = self.ahead, None
        return batch if batch is not None and batch.step == step else None

    def drop(self) -> None:
        """Forget a batch sampled ahead (a healed run goes on from a checkpoint, which holds none)."""
        self.ahead = None

    def update(self, step: int, batch: SampledBatch, start: Callable[[], Any],
               sample: Callable[[int], SampledBatch]) -> dict[str, float]:
        """Step ``step``'s update on ``batch``: ``start()`` (the executor's start_update, what finish_update takes),
        step + 1 sampled meanwhile with ``sample`` when pipelined, then ``executor.finish_update``.

        Returns the update's metrics, plus timing/train (seconds in the update, not counting sampling ahead) and,
        when pipelined, sync/staleness (how many updates behind the batch's sampling weights were: 1 for a batch
        sampled ahead) and timing/prefetch (seconds spent sampling ahead; 0 when nothing was).
        Raises what the update raises; when sampling ahead raises, that error, after the update in flight settled
        (``executor.settle``: its own error logged, not lost)."""
        if not self.executor.pipelined:
            t0 = time.time()
            with self.progress.phase("update", step, self.steps):
                update = self.executor.finish_update(step, start())
            return {**update, "timing/train": time.time() - t0}
        pending = start()
        prefetch_s = self._sample_ahead(step, pending, sample)
        t0 = time.time()
        with self.progress.phase("update", step, self.steps):
            update = self.executor.finish_update(step, pending)
        return {**update, "sync/staleness": float(step - 1 - batch.metrics.get("sync/version", step - 1)),
                "timing/prefetch": prefetch_s, "timing/train": time.time() - t0}

    def _sample_ahead(self, step: int, pending: Any, sample: Callable[[int], SampledBatch]) -> float:
        """Sample step ``step`` + 1 with adapter ``step`` - 1 while the update ``pending`` runs (not after the last
        step, nor after one that ends at a checkpoint). Seconds."""
        if step >= self.steps or (self.ckpt_interval and step % self.ckpt_interval == 0):
            return 0.0
        t1 = time.time()
        try:
            with self.executor.sample_with(step - 1):
                self.ahead = sample(step + 1)
        except BaseException:
            self.executor.settle(pending)  # the update in flight: its own error is logged, not lost
            raise
        return time.time() - t1
