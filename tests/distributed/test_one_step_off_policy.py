"""backend.one_step_off_policy (GRPORecipe.train_step with a pipelined RayExecutor) against a scripted cluster: what is sampled
with which adapter version, in which order against the updates, where it stops sampling ahead, and that
the batches and task draws are the synchronous loop's, step for step."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.config import AlgorithmConfig, AuxLossConfig
from rlkit.distributed.runtime import RaySettings
from rlkit.policy import SamplingParams
from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.pipeline import StepPipeline
from rlkit.recipes.ray import RayExecutor
from rlkit.sampling import PlainSampling, StepSampler
from rlkit.types import RewardOutput


class ScriptedCluster:
    """Rollouts succeed on odd task seeds' first sample; every call is appended to ``events``."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.live = -1  # the rollout workers' loaded version (they refuse to go back)

    def rollout(self, seeds, group_size, sampling, version):
        assert version >= self.live, f"version {version} after {self.live}: workers only move forward"
        self.live = version
        self.events.append(("rollout", tuple(seeds), sampling.seed, version))
        trajs = []
        for g, s in enumerate(seeds):
            for j in range(group_size):
                ep = SimpleNamespace(seed=s, success=(s % 2 == 1 and j == 0), turns=[1], parse_failures=0,
                                     truncated=False)
                trajs.append(SimpleNamespace(group=g, episode=ep, num_policy_tokens=3, num_episode_tokens=3, num_truncated_turns=0,
                                             input_ids=[0] * 5, policy_version=version))
        return trajs, {"sync/version": float(version), "timing/load": 0.0}

    def start_update(self, trajectories, advantages, algo, temperature, generator, lr, version, aux_terms=None):
        shuffle = int(torch.randint(0, 1 << 30, (1,), generator=generator))  # as plan_update draws its shuffle
        self.events.append(("start_update", version, tuple(t.episode.seed for t in trajectories[:: 2]),
                            tuple(advantages.tolist()), shuffle))
        for term in aux_terms or []:
            if term.coef > 0:
                self.events.append(("update_terms", version, term.name, tuple(term.sequences)))
        return [version]

    def demonstrations(self, seeds):
        self.events.append(("demonstrations", tuple(seeds)))
        return [f"demo {s}" for s in seeds]

    def finish_update(self, pending):
        self.events.append(("finish_update", pending[0]))
        if getattr(self, "update_error", None):
            raise self.update_error
        return {"policy/loss": 0.0, "sync/published_version": float(pending[0]), "timing/publish": 0.0}


def scripted_run(one_step_off_policy: bool, steps: int = 5, ckpt_interval: int = 3, demo_coef: float = 0.0) -> GRPORecipe:
    """The recipe's train loop (no setup) on a RayExecutor whose cluster is scripted; ``run.tasks`` draws 0, 1, ..."""
    ex = RayExecutor(SimpleNamespace(one_step_off_policy=one_step_off_policy), Path("unused"))
    ex.cluster = ScriptedCluster()
    ex.ctx = SimpleNamespace(algo=AlgorithmConfig(), temperature=1.0)
    ex.optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    run = GRPORecipe.__new__(GRPORecipe)
    run.cfg = SimpleNamespace(tasks_per_step=2, group_size=2, steps=steps, seed=0, get=lambda k, d=None: d)
    run.executor = ex
    run.trainer = SimpleNamespace(ckpt_interval=ckpt_interval)
    run.aux = AuxLossConfig(demo_coef=demo_coef)
    run.progress = SimpleNamespace(phase=lambda *a, **kw: contextlib.nullcontext())
    counter = iter(range(10_000))
    run.tasks = SimpleNamespace(sample=lambda n: [next(counter) for _ in range(n)])
    run.sampler = StepSampler(
        rollout=ex.rollout, reward_fn=lambda episode: RewardOutput(total=float(episode.success)), tasks=run.tasks,
        demonstrations=ex.demonstrations, sampling=PlainSampling(), aux=run.aux, group_size=2, tasks_per_step=2,
        seed=0, steps=steps, base_sampling=SamplingParams(temperature=1.0, seed=0), progress=run.progress)
    run.algo = AlgorithmConfig(norm_adv_by_std=True, adv_eps=1e-6)
    run.shuffle_gen = torch.Generator().manual_seed(0)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(ex.optimizer, lambda s: 1.0)
    run.pipeline = StepPipeline(ex, steps, ckpt_interval, run.progress)
    return run


def run_steps(run: GRPORecipe) -> list[dict]:
    return [run.train_step(step) for step in range(1, run.cfg.steps + 1)]


def test_samples_the_next_step_with_the_previous_version_while_the_update_runs():
    run = scripted_run(True)
    metrics = run_steps(run)
    ev = [e[0] if e[0] != "rollout" else ("rollout", e[3]) for e in run.executor.cluster.events]
    assert ev == [
        ("rollout", 0), "start_update", ("rollout", 0), "finish_update",  # step 1, then step 2's batch with v0
        "start_update", ("rollout", 1), "finish_update",                  # step 2; step 3's batch with v1
        "start_update", "finish_update",                                  # step 3 ends at a checkpoint: no sampling ahead
        ("rollout", 3), "start_update", ("rollout", 3), "finish_update",  # step 4 on-policy; step 5's batch with v3
        "start_update", "finish_update",                                  # step 5 is the last
    ]
    assert [m["sync/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert [m["sync/version"] for m in metrics] == [0.0, 0.0, 1.0, 3.0, 3.0]
    assert [m["timing/prefetch"] == 0.0 for m in metrics] == [False, False, True, False, True]
    assert run.executor.published_version == 5


def test_the_batches_and_task_draws_are_the_synchronous_loops():
    sync, pipelined = scripted_run(False), scripted_run(True)
    m_sync, m_pipe = run_steps(sync), run_steps(pipelined)

    def draws(run):  # (tasks, sampling seed) of every rollout; each update's tasks, advantages, shuffle draw
        return ([e[1:3] for e in run.executor.cluster.events if e[0] == "rollout"],
                [e[1:] for e in run.executor.cluster.events if e[0] == "start_update"])

    assert draws(sync) == draws(pipelined)
    for a, b in zip(m_sync, m_pipe):
        assert a["reward/mean"] == b["reward/mean"] and a["reward/success_rate"] == b["reward/success_rate"]
    assert [m["sync/version"] for m in m_sync] == [0.0, 1.0, 2.0, 3.0, 4.0]  # on-policy: step - 1


def test_each_update_trains_the_demonstrations_of_its_own_step_as_in_the_synchronous_loop():
    """aux_loss.demo_coef with the lag: each update's demo term holds the demonstrations of the all-fail tasks of
    the batch it trains on (sampled a step ahead), not of the batch being sampled meanwhile, exactly as the
    synchronous loop does. The scripted rollouts solve odd tasks: step s draws tasks 2s - 2 (all fail) and 2s - 1."""
    runs = [scripted_run(False, demo_coef=0.5), scripted_run(True, demo_coef=0.5)]
    for run in runs:
        metrics = run_steps(run)
        assert [m["demo/tasks"] for m in metrics] == [1.0] * 5
    asked, trained = ([[e[1:] for e in run.executor.cluster.events if e[0] == kind] for run in runs]
                      for kind in ("demonstrations", "update_terms"))
    assert asked[0] == asked[1] == [((2 * step - 2,),) for step in range(1, 6)]
    assert trained[0] == trained[1] == [(step, "demo", (f"demo {2 * step - 2}",)) for step in range(1, 6)]


def test_a_resumed_run_starts_from_what_the_checkpoint_step_left():
    """At a checkpoint step nothing is sampled ahead, so a run resumed there (a fresh recipe with no
    prefetched batch, the sampler where the checkpoint left it) samples step 4 as the uninterrupted run did."""
    full = scripted_run(True)
    run_steps(full)
    resumed = scripted_run(True)
    for _ in range(3):
        resumed.tasks.sample(2)  # the checkpoint's sampler state after steps 1-3's draws
    resumed.executor.cluster.live = 3
    for step in (4, 5):
        resumed.train_step(step)
    tail = [e for e in full.executor.cluster.events if e[0] == "rollout"][-2:]
    assert [e for e in resumed.executor.cluster.events if e[0] == "rollout"] == tail


def test_a_failed_sampling_ahead_waits_for_the_update_in_flight_and_is_the_error_raised(caplog):
    run = scripted_run(True)
    rollout = run.executor.cluster.rollout
    calls = []

    def failing(seeds, group_size, sampling, version):
        calls.append(version)
        if len(calls) == 2:  # the first sampling ahead
            raise RuntimeError("rollout worker died")
        return rollout(seeds, group_size, sampling, version)

    run.executor.cluster.rollout = failing
    run.executor.cluster.update_error = FloatingPointError("non-finite gradient norm")
    with pytest.raises(RuntimeError, match="rollout worker died"):
        run.train_step(1)
    assert [e[0] for e in run.executor.cluster.events] == ["rollout", "start_update", "finish_update"]
    assert "non-finite gradient norm" in caplog.text  # the update's own error is logged, not lost
    assert run.pipeline.ahead is None and run.executor._sample_version is None


@pytest.mark.parametrize("kw, needle", [
    (dict(colocate=True), "backend.colocate=false"),
    (dict(colocate=False, keep_versions=1), "keep at least 2"),
])
def test_refuses_layouts_it_cannot_overlap(kw, needle):
    with pytest.raises(ValueError, match=needle):
        RaySettings(one_step_off_policy=True, **kw).validate()
    RaySettings(one_step_off_policy=True, colocate=False).validate()
