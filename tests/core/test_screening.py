"""SPEED screening in the native loop (NativeRun._screened_sampling, algorithm.screening_samples) with a
scripted rollout: which tasks are screened, which are continued, how their groups are put together, and
what reaches the metrics and the demonstration loss."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from rlkit.backends.native import NativeRun
from rlkit.policy import SamplingParams
from rlkit.types import RewardOutput


def scripted_run(outcome, tasks_per_step=2, group_size=4, k=2, max_rounds=3):
    """A NativeRun (no policy) whose rollouts draw tasks 0, 1, 2, ... in order; sample j of task s (counted
    over every rollout of that task) succeeds iff outcome(s, j)."""
    run = NativeRun.__new__(NativeRun)
    run.cfg = SimpleNamespace(tasks_per_step=tasks_per_step, group_size=group_size, steps=1)
    run.algo = SimpleNamespace(dynamic_sampling_max_rounds=max_rounds, screening_samples=k)
    counter = iter(range(10_000))
    run.sampler = SimpleNamespace(sample=lambda n: [next(counter) for _ in range(n)])
    run.progress = SimpleNamespace(phase=lambda *a, **kw: contextlib.nullcontext())
    run.calls = []
    drawn: dict[int, int] = {}

    def rollout(step, seeds, sampling, n=None):
        n = n or group_size
        run.calls.append((list(seeds), n, sampling.seed))
        trajs = []
        for g, s in enumerate(seeds):
            for _ in range(n):
                j = drawn.get(s, 0)
                drawn[s] = j + 1
                trajs.append(SimpleNamespace(group=g, sample=j, episode=SimpleNamespace(seed=s, success=outcome(s, j))))
        return trajs, {"timing/load": 0.5} if len(run.calls) == 1 else {"timing/load": 9.0}

    run._rollout = rollout
    run.reward_fn = lambda episode: RewardOutput(total=float(episode.success))
    return run


def screen(run):
    timing: dict[str, float] = {}
    out = run._screened_sampling(1, SamplingParams(temperature=1.0, seed=100), timing)
    return out, timing


def test_screens_the_plain_rounds_budget_and_completes_the_groups_that_differ():
    # task s: its first sample succeeds iff s % 3 == 0, every later one fails
    run = scripted_run(lambda s, j: s % 3 == 0 and j == 0)
    (kept, rewards, screened, screened_out, extra, m), timing = screen(run)
    # round 1 screens ceil(2 x 4 / 2) = 4 tasks x 2 samples; tasks 0 and 3 differ -> 2 more samples each
    assert [(seeds, n) for seeds, n, _ in run.calls] == [([0, 1, 2, 3], 2), ([0, 3], 2)]
    assert run.calls[0][2] != run.calls[1][2]  # the continuation samples with its own seed
    assert [(t.episode.seed, t.sample) for t in kept] == [(0, 0), (0, 1), (0, 2), (0, 3), (3, 0), (3, 1), (3, 2), (3, 3)]
    groups = [t.group for t in kept]
    assert groups[:4] == [groups[0]] * 4 and groups[4:] == [groups[4]] * 4 and groups[0] != groups[4]
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0] * 2
    # what describes the policy is the screening alone: 4 tasks x 2, in groups of 2
    assert [t.episode.seed for t in screened] == [0, 0, 1, 1, 2, 2, 3, 3] and len(screened_out) == 8
    assert m == {"dynamic/rounds": 1.0, "dynamic/informative_groups": 2.0, "dynamic/sampled_groups": 4.0,
                 "screening/tasks": 4.0, "screening/solved": 0.0, "screening/continued": 0.5}
    assert extra == {"timing/load": 0.5}  # the first rollout's (native_ray's adapter load happens once)
    assert timing["timing/rollout"] >= 0 and "timing/reward" in timing


def test_agreeing_tasks_are_not_continued_and_solved_ones_are_counted():
    # tasks 0-3 all solved in screening, 4-7 never, task 9 would differ: 4 rounds end before it
    run = scripted_run(lambda s, j: s < 4 or (s == 9 and j == 1), tasks_per_step=1, group_size=4, k=2)
    # tasks_per_step 1: ceil(1 x 4 / 2) = 2 tasks a round
    (kept, rewards, screened, _, _, m), _ = screen(run)
    assert [(seeds, n) for seeds, n, _ in run.calls] == [([0, 1], 2), ([2, 3], 2), ([4, 5], 2), ([6, 7], 2)]
    assert kept == [] and rewards.numel() == 0  # max_rounds 3: 4 rounds, none differed
    assert m["dynamic/rounds"] == 4.0 and m["screening/tasks"] == 8.0 and m["screening/solved"] == 0.5
    assert m["screening/continued"] == 0.0 and len(screened) == 16


def test_a_round_continues_only_as_many_tasks_as_are_missing():
    run = scripted_run(lambda s, j: j == 0, tasks_per_step=2, group_size=4, k=2)  # every task differs
    (kept, _, _, _, _, m), _ = screen(run)
    assert [(seeds, n) for seeds, n, _ in run.calls] == [([0, 1, 2, 3], 2), ([0, 1], 2)]
    assert len(kept) == 8 and m["dynamic/informative_groups"] == 2.0 and m["screening/continued"] == 0.5


def test_group_sizes_that_do_not_divide_round_the_screening_up():
    run = scripted_run(lambda s, j: j == 1, tasks_per_step=3, group_size=5, k=4, max_rounds=0)
    (kept, rewards, screened, _, _, m), _ = screen(run)
    assert run.calls[0][:2] == ([0, 1, 2, 3], 4)  # ceil(3 x 5 / 4) = 4 tasks
    assert run.calls[1][:2] == ([0, 1, 2], 1)  # 3 of them were needed; one more sample each
    assert len(kept) == 15 and rewards.view(3, 5).sum(1).tolist() == [1.0, 1.0, 1.0]
    assert m["dynamic/rounds"] == 1.0
