"""GRESO's selective rollout, easy side (algorithm.selective_rollout_explore; rlkit.tasks.SolvedTaskFilter):
tasks whose last groups all succeeded are skipped before rollout with probability 1 - explore**k."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from rlkit.backends.native import NativeRun
from rlkit.policy import SamplingParams
from rlkit.tasks import SolvedTaskFilter, TaskSampler
from rlkit.types import RewardOutput


def test_streaks_and_admit_probabilities():
    f = SolvedTaskFilter(seed=0, explore=0.5, key=lambda s: s % 10)  # tasks 3 and 13 are one task
    assert all(f.admit(3) for _ in range(50)) and f.skipped == 0  # never seen: always admitted, no draw
    f.record(3, solved=True)
    f.record(13, solved=True)  # same key: streak 2
    assert f.streaks == {"3": 2}
    n = 4000
    rate = sum(f.admit(23) for _ in range(n)) / n
    assert abs(rate - 0.25) < 0.03, rate  # explore ** 2
    assert f.skipped == n - round(rate * n)
    f.record(3, solved=False)  # one failure resets the streak
    assert f.streaks["3"] == 0 and all(f.admit(3) for _ in range(50))
    for _ in range(10):
        f.record(7, solved=True)
    rate = sum(f.admit(7) for _ in range(n)) / n
    assert abs(rate - 0.125) < 0.03, rate  # k capped at max_streak = 3
    with pytest.raises(ValueError, match="explore"):
        SolvedTaskFilter(seed=0, explore=0.0)
    with pytest.raises(ValueError, match="explore_hard"):
        SolvedTaskFilter(seed=0, explore=1.0, explore_hard=1.5)


def test_all_fail_tasks_are_skipped_only_with_explore_hard():
    easy_only = SolvedTaskFilter(seed=0, explore=0.5)
    both = SolvedTaskFilter(seed=0, explore=1.0, explore_hard=0.5)
    for f in (easy_only, both):
        f.record(4, solved=False, failed=True)
        f.record(4, solved=False, failed=True)
        assert f.streaks == {"4": -2}
    n = 4000
    assert all(easy_only.admit(4) for _ in range(200)) and easy_only.skipped == 0
    rate = sum(both.admit(4) for _ in range(n)) / n
    assert abs(rate - 0.25) < 0.03, rate
    both.record(4, solved=True)  # a solved group ends the all-fail streak and starts an all-success one
    assert both.streaks["4"] == 1 and all(both.admit(4) for _ in range(200))  # explore=1.0: never skipped
    both.record(4, solved=False)  # rewards differed
    assert both.streaks["4"] == 0


def test_layout_keys_are_bytes_and_state_round_trips():
    f = SolvedTaskFilter(seed=1, explore=0.3, key=lambda s: bytes([s % 4]))
    for s in range(8):
        f.record(s, solved=s % 2 == 0)
    state = f.state_dict()
    g = SolvedTaskFilter(seed=99, explore=0.3, key=lambda s: bytes([s % 4]))
    g.load_state_dict(state)
    assert g.streaks == f.streaks == {"00": 2, "01": 0, "02": 2, "03": 0}
    assert [f.admit(s) for s in range(200)] == [g.admit(s) for s in range(200)]  # the same draws after resume


def test_draw_skips_solved_tasks_and_terminates_when_all_are_solved():
    sampler = TaskSampler(0, lambda s: False, pool_size=4)  # 4 tasks, epoch after epoch
    f = SolvedTaskFilter(seed=0, explore=1e-9)
    first = f.draw(sampler, 4)
    assert sorted(first) == sorted(sampler.pool)
    f.record(first[0], solved=True)
    f.record(first[1], solved=True)
    nxt = f.draw(sampler, 4)  # only the two unsolved tasks come back
    assert set(nxt) == {first[2], first[3]} and f.skipped > 0
    for s in sampler.pool:
        f.record(s, solved=True)
    assert len(f.draw(sampler, 3, max_draws=5)) == 3  # everything solved: the cap still fills the batch


def _scripted_run(explore):
    """A NativeRun (no policy) with a filter; task s's group succeeds entirely when s is even."""
    run = NativeRun.__new__(NativeRun)
    run.cfg = SimpleNamespace(tasks_per_step=4, group_size=2, steps=1)
    run.algo = SimpleNamespace(dynamic_sampling_max_rounds=0, dynamic_sampling_adaptive_batch=False)
    run.sampler = TaskSampler(0, lambda s: False, pool_size=8)
    run.task_filter = SolvedTaskFilter(0, explore)
    run.progress = SimpleNamespace(phase=lambda *a, **k: contextlib.nullcontext())
    run.rolled_out: list[int] = []

    def rollout(step, seeds, sampling, n=None):
        run.rolled_out += list(seeds)
        return [SimpleNamespace(group=g, episode=SimpleNamespace(seed=s, success=s % 2 == 0 or j == 0))
                for g, s in enumerate(seeds) for j in range(n or 2)], {}
    # (odd tasks: one success, one failure, so their rewards differ)

    run._rollout = rollout
    run.reward_fn = lambda episode: RewardOutput(total=float(episode.success))
    return run


def test_native_rounds_record_outcomes_and_skip_solved_tasks():
    run = _scripted_run(explore=1e-9)
    sampling = SamplingParams(temperature=1.0, seed=5)
    for _ in range(2):  # one epoch of the 8-task pool: every task seen once
        run._sample_round(1, sampling, {})
    assert sorted(run.rolled_out) == sorted(run.sampler.pool)
    even = {s for s in run.sampler.pool if s % 2 == 0}
    assert {k for k, v in run.task_filter.streaks.items() if v == 1} == {str(s) for s in even}
    run.rolled_out.clear()
    for _ in range(3):
        run._sample_round(1, sampling, {})
    assert run.rolled_out and not even & set(run.rolled_out)  # solved tasks are no longer rolled out
    # the same rounds without the filter roll the solved tasks out again
    plain = _scripted_run(explore=1.0)
    for _ in range(5):
        plain._sample_round(1, sampling, {})
    assert even & set(plain.rolled_out[8:])


def test_visgym_task_key_is_the_layout():
    from envs.visgym import VisGymMaze
    from envs.visgym.maze import VARIANT_SIZES, layout_key

    spec = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    keys = {s: spec.task_key(s) for s in range(400)}
    assert keys[5] == layout_key(5, VARIANT_SIZES["small"])
    assert len(set(keys.values())) < len(keys)  # 7x7 has 768 layouts: seeds share them

