"""backend.one_step_off_policy (RayNativeRun._pipelined_step) against a scripted cluster: what is sampled
with which adapter version, in which order against the updates, where it stops sampling ahead, and that
the batches and task draws are the synchronous loop's, step for step."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from rlkit.backends.ray_native import RayNativeRun
from rlkit.distributed.runtime import RaySettings
from rlkit.policy import SamplingParams
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

    def start_update(self, trajectories, advantages, algo, temperature, generator, lr, version, demonstrations=None,
                     route_questions=None):
        shuffle = int(torch.randint(0, 1 << 30, (1,), generator=generator))  # as plan_update draws its shuffle
        self.events.append(("start_update", version, tuple(t.episode.seed for t in trajectories[:: 2]),
                            tuple(advantages.tolist()), shuffle))
        if route_questions is not None:
            self.events.append(("update_routes", version, tuple(route_questions)))
        return [version]

    def route_questions(self, seed, step, n):
        self.events.append(("route_questions", seed, step, n))
        return [f"route {seed}/{step}/{i}" for i in range(n)]

    def finish_update(self, pending):
        self.events.append(("finish_update", pending[0]))
        if getattr(self, "update_error", None):
            raise self.update_error
        return {"policy/loss": 0.0, "sync/published_version": float(pending[0]), "timing/publish": 0.0}


def scripted_run(one_step_off_policy: bool, steps: int = 5, ckpt_interval: int = 3) -> RayNativeRun:
    run = RayNativeRun.__new__(RayNativeRun)
    run.cfg = SimpleNamespace(tasks_per_step=2, group_size=2, steps=steps, seed=0, get=lambda k, d=None: d)
    run.algo = SimpleNamespace(dynamic_sampling_max_rounds=0, dynamic_sampling_adaptive_batch=False, screening_samples=0, demo_coef=0.0, route_coef=0.0,
                               norm_adv_by_std=True, adv_eps=1e-6, mask_unexecuted=False)
    run.trainer = SimpleNamespace(ckpt_interval=ckpt_interval)
    run.settings = SimpleNamespace(one_step_off_policy=one_step_off_policy)
    run.rollout_cfg = SimpleNamespace(temperature=1.0)
    counter = iter(range(10_000))
    run.sampler = SimpleNamespace(sample=lambda n: [next(counter) for _ in range(n)])
    run.sampling = SamplingParams(temperature=1.0, seed=0)
    run.progress = SimpleNamespace(phase=lambda *a, **kw: contextlib.nullcontext())
    run.reward_fn = lambda episode: RewardOutput(total=float(episode.success))
    run.cluster = ScriptedCluster()
    run.shuffle_gen = torch.Generator().manual_seed(0)
    run.optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: 1.0)
    run._prefetched, run._sample_version, run.published_version = None, None, None
    return run


def run_steps(run: RayNativeRun) -> list[dict]:
    return [run.train_step(step) for step in range(1, run.cfg.steps + 1)]


def test_samples_the_next_step_with_the_previous_version_while_the_update_runs():
    run = scripted_run(True)
    metrics = run_steps(run)
    ev = [e[0] if e[0] != "rollout" else ("rollout", e[3]) for e in run.cluster.events]
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
    assert run.published_version == 5


def test_the_batches_and_task_draws_are_the_synchronous_loops():
    sync, pipelined = scripted_run(False), scripted_run(True)
    m_sync, m_pipe = run_steps(sync), run_steps(pipelined)

    def draws(run):  # (tasks, sampling seed) of every rollout; each update's tasks, advantages, shuffle draw
        return ([e[1:3] for e in run.cluster.events if e[0] == "rollout"],
                [e[1:] for e in run.cluster.events if e[0] == "start_update"])

    assert draws(sync) == draws(pipelined)
    for a, b in zip(m_sync, m_pipe):
        assert a["reward/mean"] == b["reward/mean"] and a["reward/success_rate"] == b["reward/success_rate"]
    assert [m["sync/version"] for m in m_sync] == [0.0, 1.0, 2.0, 3.0, 4.0]  # on-policy: step - 1


def test_route_questions_are_the_updated_steps_as_in_the_synchronous_loop():
    """algorithm.route_coef with the lag: each update trains the route questions of its own step (drawn from the
    run's seed and that step, rlkit.sft.draw_route_questions), not of the step being sampled ahead, exactly as the
    synchronous loop does."""
    runs = [scripted_run(False), scripted_run(True)]
    for run in runs:
        run.cfg.seed = 7  # not the sampling seed (0): the questions follow the run's seed
        run.algo.route_coef, run.algo.route_batch = 1.0, 3
        metrics = run_steps(run)
        assert all(m["timing/route"] >= 0.0 for m in metrics)
    asked, trained = ([[e[1:] for e in run.cluster.events if e[0] == kind] for run in runs]
                      for kind in ("route_questions", "update_routes"))
    assert asked[0] == asked[1] == [(7, step, 3) for step in range(1, 6)]
    assert trained[0] == trained[1] == [(step, tuple(f"route 7/{step}/{i}" for i in range(3))) for step in range(1, 6)]


def test_a_resumed_run_starts_from_what_the_checkpoint_step_left():
    """At a checkpoint step nothing is sampled ahead, so a run resumed there (a fresh RayNativeRun with no
    prefetched batch, the sampler where the checkpoint left it) samples step 4 as the uninterrupted run did."""
    full = scripted_run(True)
    run_steps(full)
    resumed = scripted_run(True)
    for _ in range(3):
        resumed.sampler.sample(2)  # the checkpoint's sampler state after steps 1-3's draws
    resumed.cluster.live = 3
    for step in (4, 5):
        resumed.train_step(step)
    tail = [e for e in full.cluster.events if e[0] == "rollout"][-2:]
    assert [e for e in resumed.cluster.events if e[0] == "rollout"] == tail


def test_a_failed_sampling_ahead_waits_for_the_update_in_flight_and_is_the_error_raised(caplog):
    run = scripted_run(True)
    rollout = run.cluster.rollout
    calls = []

    def failing(seeds, group_size, sampling, version):
        calls.append(version)
        if len(calls) == 2:  # the first sampling ahead
            raise RuntimeError("rollout worker died")
        return rollout(seeds, group_size, sampling, version)

    run.cluster.rollout = failing
    run.cluster.update_error = FloatingPointError("non-finite gradient norm")
    with pytest.raises(RuntimeError, match="rollout worker died"):
        run.train_step(1)
    assert [e[0] for e in run.cluster.events] == ["rollout", "start_update", "finish_update"]
    assert "non-finite gradient norm" in caplog.text  # the update's own error is logged, not lost
    assert run._prefetched is None and run._sample_version is None


@pytest.mark.parametrize("kw, needle", [
    (dict(colocate=True), "backend.colocate=false"),
    (dict(colocate=False, keep_versions=1), "keep at least 2"),
])
def test_refuses_layouts_it_cannot_overlap(kw, needle):
    with pytest.raises(ValueError, match=needle):
        RaySettings(one_step_off_policy=True, **kw).validate()
    RaySettings(one_step_off_policy=True, colocate=False).validate()
