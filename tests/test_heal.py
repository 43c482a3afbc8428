"""The recipe heals a lost worker (rlkit.recipes.heal): the fast case, in one process. An executor that loses a
"worker" (a call that times out, as a hung Ray worker's does) at a given step is shut down, started again and
loaded with the latest checkpoint; the run ends with every logged value equal to an uninterrupted run's, each
row sent to the logger once. Past ``trainer.max_failures`` it stops with WorkerLostError naming the step a rerun
resumes from. Issue 74: a lost worker heals wherever it happens (the evaluation before training, a restart whose
resources appear late); an error raised in a worker that is not a lost worker (a bug) stops the run at once, without a
restart, whatever its class. The Ray cases (a SIGKILLed rollout worker and trainer rank) are
tests/distributed/test_heal_ray.py and tests/distributed/test_worker_faults.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray.exceptions as rex

from rlkit.distributed.runtime import PlacementGroupTimeout, WorkersHungError
from rlkit.plugins import compose_train
from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.heal import WorkerError, WorkerLostError, lost_worker, worker_error
from rlkit.recipes.local import LocalExecutor

BASE = ["experiment=smoke", "backend=native", "steps=4", "eval.num_tasks=2", "logger=console",
        "trainer.ckpt_interval=2"]


def _task_error(cause: BaseException, where: str = "envs/visgym/episode.py", line: int = 190) -> BaseException:
    """The exception ray.get raises for ``cause`` raised in RolloutWorker.rollout: a RayTaskError that is also an
    instance of the cause's class (as Ray 2.x builds it), its text the worker's traceback."""
    tb = (f'Traceback (most recent call last):\n  File "{where}", line {line}, in step\n    raise\n'
          f"{type(cause).__name__}: {cause}")
    return rex.RayTaskError("RolloutWorker.rollout", tb, cause, proctitle="ray::RolloutWorker.rollout()", pid=1,
                            ip="127.0.0.1").as_instanceof_cause()


class FlakyExecutor(LocalExecutor):
    """LocalExecutor whose rollout of ``fail_at`` steps raises ``error`` (once per listed step; by default a time-out,
    as a hung worker's), whose evaluation at the versions in ``fail_eval_at`` raises it likewise, and whose starts
    after the first raise a placement-group time-out ``late_starts`` times (resources appearing late). ``dead``:
    what ``dead_workers`` reports (the workers found gone)."""

    heals = True

    def __init__(self, fail_at: list[int], error: BaseException | None = None, fail_eval_at: list[int] = (),
                 late_starts: int = 0, dead: list[str] = ()):
        super().__init__()
        self.fail_at, self.fail_eval_at = list(fail_at), list(fail_eval_at)
        self.error = error or WorkersHungError("rollout workers did not answer within 1s")
        self.late_starts, self.dead = late_starts, list(dead)
        self.starts, self.shutdowns, self.tries, self.waits = 0, 0, 0, []

    def start(self, ctx, wait_s=None):
        self.tries += 1
        self.waits.append(wait_s)
        if self.starts and self.late_starts:
            self.late_starts -= 1
            raise PlacementGroupTimeout("the placement group rlkit-x (2 bundles of {'CPU': 1.0}, strategy PACK) could "
                                        "not be scheduled within 1s; the cluster has {'CPU': 0.0} available")
        self.starts += 1
        super().start(ctx)

    def shutdown(self):
        self.shutdowns += 1

    def dead_workers(self):
        return list(self.dead)

    def rollout(self, step, seeds, sampling, group_size):
        if step in self.fail_at:
            self.fail_at.remove(step)
            raise self.error
        return super().rollout(step, seeds, sampling, group_size)

    def evaluate(self, seeds, greedy, version, **kw):
        if version in self.fail_eval_at:
            self.fail_eval_at.remove(version)
            raise self.error
        return super().evaluate(seeds, greedy, version, **kw)


def _cfg(out: Path, cache: Path, extra=()):
    return compose_train([*BASE, *extra, f"paths.output_dir={out}", f"paths.cache_dir={cache}",
                          f"paths.shared={cache / 'shared'}"])


def _run(cfg, executor, said=None):
    recipe = GRPORecipe(cfg, executor)
    recipe.RESTART_POLL_S = 0.01
    recipe.setup()
    if said is not None:
        recipe.progress.say = said.append
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


def test_a_lost_worker_heals_from_the_latest_checkpoint_exactly(tmp_path, cache, reference):
    rows_ref, sent_ref = reference
    healed = tmp_path / "healed"
    flaky = FlakyExecutor(fail_at=[4])  # after the checkpoint of step 2: steps 3-4 run again
    sent = _run(_cfg(healed, cache), flaky)
    assert flaky.starts == 2 and flaky.shutdowns == 1
    assert _rows(healed) == rows_ref  # one row per step, every value as uninterrupted
    assert len(rows_ref) == 4 + 2  # eval before training, 4 steps, the final eval
    assert sent == sent_ref  # the rows replayed after the checkpoint reached the logger once


def test_past_max_failures_the_run_stops_naming_the_step_to_resume_from(tmp_path, cache):
    out = tmp_path / "run"
    with pytest.raises(WorkerLostError, match=r"at step 3; trainer.max_failures=1 spent.*resume from step 2"):
        _run(_cfg(out, cache, ["trainer.max_failures=1"]), FlakyExecutor(fail_at=[3, 3]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """An uninterrupted run's rows and the steps whose rows reached the logger."""
    ref = tmp_path_factory.mktemp("heal_ref") / "ref"
    sent = _run(_cfg(ref, cache), LocalExecutor())
    return _rows(ref), sent


def test_a_worker_lost_during_the_evaluation_before_training_heals(tmp_path, cache, reference):
    out = tmp_path / "run"
    flaky = FlakyExecutor(fail_at=[], fail_eval_at=[0], error=rex.ActorDiedError())
    said = []
    sent = _run(_cfg(out, cache), flaky, said)
    assert flaky.starts == 2 and flaky.shutdowns == 1
    assert any("a worker died (ActorDiedError" in ln and "at step 0: restarting the workers and going on from step 0"
               in ln for ln in said), said
    assert _rows(out) == reference[0]  # the step-0 eval once, every value as uninterrupted
    assert sent == reference[1]


def test_a_restart_waits_for_resources_that_appear_late(tmp_path, cache, reference):
    out = tmp_path / "run"
    flaky = FlakyExecutor(fail_at=[3], late_starts=2)
    said = []
    sent = _run(_cfg(out, cache, ["trainer.restart_wait_s=60"]), flaky, said)
    assert flaky.tries == 4 and flaky.starts == 2  # setup, then a restart tried 3 times: 2 timed out
    waiting = [ln for ln in said if ln.startswith("waiting for the new worker group's resources")]
    assert len(waiting) == 2 and "trainer.restart_wait_s=60" in waiting[0] and "2 bundles of" in waiting[0], said
    assert flaky.waits[0] is None and all(0 < w <= 60 for w in flaky.waits[1:]), flaky.waits
    assert _rows(out) == reference[0] and sent == reference[1]


def test_a_restart_whose_resources_never_appear_stops_naming_the_wait(tmp_path, cache):
    out = tmp_path / "run"
    with pytest.raises(WorkerLostError, match=r"did not appear within trainer.restart_wait_s=0.05s.*2 bundles"):
        _run(_cfg(out, cache, ["trainer.restart_wait_s=0.05"]), FlakyExecutor(fail_at=[3], late_starts=10**6))


def test_a_runtime_error_raised_in_a_worker_stops_the_run_without_a_restart(tmp_path, cache):
    out = tmp_path / "run"
    flaky = FlakyExecutor(fail_at=[3], error=_task_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied")))
    said = []
    with pytest.raises(WorkerError) as info:
        _run(_cfg(out, cache), flaky, said)
    assert flaky.starts == 1 and flaky.shutdowns == 0
    assert not any("restarting the workers" in ln for ln in said), said
    assert str(info.value).startswith("RolloutWorker.rollout raised RuntimeError: mat1 and mat2 shapes cannot be "
                                      "multiplied (at envs/visgym/episode.py:190 in step)")


def test_a_runtime_error_from_a_collective_whose_peer_is_gone_heals(tmp_path, cache, reference):
    out = tmp_path / "run"
    gloo = _task_error(RuntimeError("[gloo] Connection closed by peer"), "torch/distributed/c10d.py", 7)
    flaky = FlakyExecutor(fail_at=[4], error=gloo, dead=["trainer rank 1"])
    said = []
    sent = _run(_cfg(out, cache), flaky, said)
    assert flaky.starts == 2
    assert any("a worker's peer died (trainer rank 1 gone" in ln for ln in said), said
    assert _rows(out) == reference[0] and sent == reference[1]


@pytest.mark.parametrize("cause", [
    RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), RuntimeError("mat1 and mat2 shapes"),
    FileNotFoundError(2, "No such file or directory"), ConnectionError("refused"), OSError(28, "No space left"),
    TimeoutError("a worker's own time limit"), ValueError("a bad value"), FloatingPointError("non-finite grad"),
], ids=lambda c: type(c).__name__)
def test_an_error_raised_in_a_worker_is_lost_only_when_a_worker_is_gone(cause):
    err = _task_error(cause)
    assert lost_worker(err) is None
    assert lost_worker(err, lambda: []) is None
    assert lost_worker(err, lambda: ["rollout worker 1"]).startswith("a worker's peer died (rollout worker 1 gone")
    bug = worker_error(err)
    assert isinstance(bug, WorkerError) and f"raised {type(cause).__name__}: " in str(bug)


def test_what_is_lost_and_what_is_not():
    assert lost_worker(WorkersHungError("trainer ranks (update) did not answer within 5s")).startswith("a worker hung")
    assert lost_worker(rex.ActorDiedError()).startswith("a worker died (ActorDiedError")
    assert lost_worker(rex.NodeDiedError("node 1")).startswith("a worker died (NodeDiedError")
    assert lost_worker(TimeoutError("the driver's own time limit")) is None  # not a call of the workers
    assert lost_worker(RuntimeError("a driver bug")) is None
    assert lost_worker(ValueError("a bad value")) is None
    assert lost_worker(FloatingPointError("non-finite gradient norm")) is None
    assert worker_error(RuntimeError("a driver bug")) is None  # the driver's own errors propagate as they are
