"""The recipe heals a lost worker (rlkit.recipes.heal): the fast case, in one process. An executor that loses a
"worker" (a call that times out, as a hung Ray worker's does) at a given step is shut down, started again and
loaded with the latest checkpoint; the run ends with every logged value equal to an uninterrupted run's, each
row sent to the logger once. Past ``trainer.max_failures`` it stops with WorkerLostError naming the step a rerun
resumes from. The Ray cases (a SIGKILLed rollout worker and trainer rank) are tests/distributed/test_heal_ray.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.plugins import compose_train
from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.heal import WorkerLostError, lost_worker
from rlkit.recipes.local import LocalExecutor

BASE = ["experiment=smoke", "backend=native", "steps=4", "eval.num_tasks=2", "logger=console",
        "trainer.ckpt_interval=2"]


class FlakyExecutor(LocalExecutor):
    """LocalExecutor whose rollout of ``fail_at`` steps times out (once per listed step), as a hung worker's."""

    heals = True

    def __init__(self, fail_at: list[int]):
        self.fail_at, self.starts, self.shutdowns = list(fail_at), 0, 0

    def start(self, ctx):
        self.starts += 1
        super().start(ctx)

    def shutdown(self):
        self.shutdowns += 1

    def rollout(self, step, seeds, sampling, group_size):
        if step in self.fail_at:
            self.fail_at.remove(step)
            raise TimeoutError("rollout workers did not answer within 1s")
        return super().rollout(step, seeds, sampling, group_size)


def _cfg(out: Path, cache: Path, extra=()):
    return compose_train([*BASE, *extra, f"paths.output_dir={out}", f"paths.cache_dir={cache}",
                          f"paths.shared={cache / 'shared'}"])


def _run(cfg, executor):
    recipe = GRPORecipe(cfg, executor)
    recipe.setup()
    sent = []
    log = recipe.logger.log
    recipe.logger.log = lambda metrics, step: (sent.append(step), log(metrics, step))
    try:
        recipe.train()
    finally:
        recipe.logger.finish()
    return sent


def _rows(out: Path):
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and not k.endswith("_s")} for r in rows]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("heal_cache")


def test_a_lost_worker_heals_from_the_latest_checkpoint_exactly(tmp_path, cache):
    ref = tmp_path / "ref"
    sent_ref = _run(_cfg(ref, cache), LocalExecutor())
    healed = tmp_path / "healed"
    flaky = FlakyExecutor(fail_at=[4])  # after the checkpoint of step 2: steps 3-4 run again
    sent = _run(_cfg(healed, cache), flaky)
    assert flaky.starts == 2 and flaky.shutdowns == 1
    assert _rows(healed) == _rows(ref)  # one row per step, every value as uninterrupted
    assert len(_rows(ref)) == 4 + 2  # eval before training, 4 steps, the final eval
    assert sent == sent_ref  # the rows replayed after the checkpoint reached the logger once


def test_past_max_failures_the_run_stops_naming_the_step_to_resume_from(tmp_path, cache):
    out = tmp_path / "run"
    with pytest.raises(WorkerLostError, match=r"at step 3; trainer.max_failures=1 spent.*resume from step 2"):
        _run(_cfg(out, cache, ["trainer.max_failures=1"]), FlakyExecutor(fail_at=[3, 3]))


def test_a_bug_is_not_a_lost_worker():
    assert lost_worker(TimeoutError("trainer ranks (update) did not answer within 5s"))
    assert lost_worker(ValueError("a bad value")) is None
    assert lost_worker(FloatingPointError("non-finite gradient norm")) is None
