"""DAPO dynamic sampling (sampling=dapo; rlkit.sampling.dynamic) through the step's sampler
(rlkit.sampling.StepSampler) with a scripted rollout: which groups are kept, how many rounds run, and what
the metrics say."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from rlkit.config import AuxLossConfig
from rlkit.policy import SamplingParams
from rlkit.sampling import DapoSampling, StepSampler
from rlkit.sampling.dynamic import round_size
from rlkit.types import RewardOutput


def _traj(group, sample, seed):
    ep = SimpleNamespace(seed=seed, success=False, turns=[], parse_failures=0, truncated=False)
    return SimpleNamespace(group=group, sample=sample, episode=ep, num_policy_tokens=1, num_truncated_turns=0,
                           input_ids=[0])


def scripted_run(tasks_per_step=2, group_size=2, max_rounds=3, adaptive=False):
    """A StepSampler (no policy) whose rollouts draw tasks 0, 1, 2, ... in order; ``rollout_seeds`` records
    each round's (task seeds, sampling seed)."""
    counter = iter(range(10_000))
    rollout_seeds, rolled = [], []

    def rollout(step, seeds, sampling, n):
        rollout_seeds.append((list(seeds), sampling.seed))
        trajs = [_traj(g, j, s) for g, s in enumerate(seeds) for j in range(n)]
        rolled.extend(trajs)
        return trajs, {}

    sampler = StepSampler(
        rollout=rollout, reward_fn=None, tasks=SimpleNamespace(sample=lambda n: [next(counter) for _ in range(n)]),
        demonstrations=lambda seeds: [], sampling=DapoSampling(max_rounds=max_rounds, adaptive_batch=adaptive),
        aux=AuxLossConfig(), group_size=group_size, tasks_per_step=tasks_per_step, seed=0,
        steps=1, base_sampling=SamplingParams(temperature=1.0, seed=100),
        progress=SimpleNamespace(phase=lambda *a, **k: contextlib.nullcontext()))
    sampler.rollout_seeds, sampler.rolled = rollout_seeds, rolled
    return sampler


def call(run, informative):
    """One step's sampling (first round and dynamic sampling); the group on task s gets rewards [1, 0, ...]
    when informative(s), else all 0. Returns ((kept, their rewards, every sampled trajectory, every reward
    output, dynamic/* metrics), the step's timing/* metrics)."""
    seen: dict[int, int] = {}
    reward_of: dict[int, float] = {}
    outs = []

    def reward(episode):
        j = seen.get(episode.seed, 0)
        seen[episode.seed] = j + 1
        out = RewardOutput(total=1.0 if informative(episode.seed) and j == 0 else 0.0)
        reward_of[id(episode)] = out.total
        outs.append(out)
        return out

    run.reward_fn = reward
    first = len(run.rolled)
    batch = run.sample(1)
    sampled = run.rolled[first:]
    kept = batch.trajectories
    rewards = torch.tensor([reward_of[id(t.episode)] for t in kept])
    # the batch's rewards are the kept groups' own, in order (the recipe's group advantages normalise each group)
    assert torch.equal(batch.rewards, rewards)
    m = {k: v for k, v in batch.metrics.items() if k.startswith("dynamic/")}
    timing = {k: v for k, v in batch.metrics.items() if k.startswith("timing/")}
    # reward/* describe everything sampled, not only the kept groups
    assert batch.metrics["reward/mean"] == pytest.approx(sum(o.total for o in outs) / len(outs))
    return (kept, rewards, sampled, outs, m), timing

def test_fills_the_batch_with_informative_groups_from_later_rounds():
    run = scripted_run()
    (kept, rewards, sampled, sampled_out, m), timing = call(run, lambda s: s % 3 == 0)
    # round 1: tasks 0, 1 (0 informative); round 2: tasks 2, 3 (3 informative) -> full, stop
    assert [t.episode.seed for t in kept] == [0, 0, 3, 3]
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert [t.group for t in kept] == [0, 0, 3, 3]  # group ids stay unique across rounds
    assert m == {"dynamic/rounds": 2.0, "dynamic/informative_groups": 2.0, "dynamic/sampled_groups": 4.0}
    assert len(sampled) == len(sampled_out) == 8
    assert [s for s, _ in run.rollout_seeds] == [[0, 1], [2, 3]]
    assert run.rollout_seeds[0][1] != run.rollout_seeds[1][1]  # each round samples with its own seed
    assert timing["timing/rollout"] >= 0 and "timing/reward" in timing


def test_stops_after_max_rounds_and_keeps_what_it_found():
    run = scripted_run(max_rounds=1)
    (kept, rewards, sampled, _, m), _ = call(run, lambda s: s == 0)
    assert [t.episode.seed for t in kept] == [0, 0] and rewards.tolist() == [1.0, 0.0]
    assert m["dynamic/rounds"] == 2.0 and m["dynamic/sampled_groups"] == 4.0 and len(sampled) == 8


def test_no_informative_group_trains_on_round_one_with_zero_rewards():
    run = scripted_run(max_rounds=2)
    (kept, rewards, sampled, _, m), _ = call(run, lambda s: False)
    assert [t.episode.seed for t in kept] == [0, 0, 1, 1] and rewards.tolist() == [0.0] * 4
    assert m == {"dynamic/rounds": 3.0, "dynamic/informative_groups": 0.0, "dynamic/sampled_groups": 6.0}


def test_more_informative_groups_than_needed_keeps_the_first_ones():
    run = scripted_run(tasks_per_step=2, max_rounds=3)
    (kept, _, _, _, m), _ = call(run, lambda s: True)
    assert [t.episode.seed for t in kept] == [0, 0, 1, 1] and m["dynamic/rounds"] == 1.0


@pytest.mark.parametrize("value", [-1])
def test_negative_max_rounds_is_refused(value, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "train.py"), "experiment=smoke", "logger=console",
                           "sampling=dapo", f"sampling.max_rounds={value}", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "RLKIT_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode != 0 and "max_rounds=-1" in proc.stdout + proc.stderr


def test_adaptive_rounds_are_sized_from_the_last_steps_informative_share():
    run = scripted_run(tasks_per_step=2, group_size=2, max_rounds=3, adaptive=True)  # budget: 8 tasks a step
    # step 1, no share known yet: plain rounds of tasks_per_step: [0, 1] -> 0 informative, [2, 3], [4, 5] -> 4
    (kept, _, _, _, m), _ = call(run, lambda s: s % 4 == 0)
    assert [seeds for seeds, _ in run.rollout_seeds] == [[0, 1], [2, 3], [4, 5]]
    assert [t.episode.seed for t in kept] == [0, 0, 4, 4] and m["dynamic/rounds"] == 3.0
    assert run.informative_counts == (2, 6)
    # step 2 at share 2/6: round 1 draws ceil(2 / (1/3)) = 6 tasks (6..11: 8 informative); the next would be
    # ceil(1 / (1/3)) = 3 tasks, cut to the 2 left of the budget (12, 13: 12 informative)
    run.rollout_seeds.clear()
    (kept, _, _, _, m), _ = call(run, lambda s: s % 4 == 0)
    assert [seeds for seeds, _ in run.rollout_seeds] == [[6, 7, 8, 9, 10, 11], [12, 13]]
    assert [t.episode.seed for t in kept] == [8, 8, 12, 12] and m["dynamic/sampled_groups"] == 8.0


def test_adaptive_round_size_is_an_exact_integer_ceiling():
    def size(missing, drawn, counts):  # tasks_per_step=2, max_rounds=63
        return round_size(missing, drawn, counts, 63, 2)

    assert size(1, 0, (1, 49)) == 49  # 1 / (1/49) is 49.000000000000004 in floats: ceil would give 50
    assert size(2, 0, (3, 7)) == 5  # ceil(2 x 7 / 3) = ceil(4.67)
    assert size(2, 125, (3, 7)) == 3  # what the budget of 64 x 2 tasks leaves
    assert size(1, 0, (3, 7)) == 3  # ceil(7 / 3) = 3 >= tasks_per_step
    assert size(1, 0, (5, 5)) == 2  # never fewer than a plain round
    # and the sampler's adaptive round asks for that many tasks of its task stream
    run = scripted_run(tasks_per_step=2, max_rounds=63, adaptive=True)
    run.informative_counts = (3, 7)
    assert run.strategy.first_round(run.tasks, 2, run.informative_counts) == [0, 1, 2, 3, 4]


def test_adaptive_rounds_stay_within_the_steps_task_budget():
    run = scripted_run(tasks_per_step=2, group_size=2, max_rounds=3, adaptive=True)
    run.informative_counts = (0, 8)  # the last step found nothing: the share's floor, 1 / 4, sizes the round
    (kept, rewards, sampled, _, m), _ = call(run, lambda s: False)
    assert [seeds for seeds, _ in run.rollout_seeds] == [[0, 1, 2, 3, 4, 5, 6, 7]]  # the whole budget at once
    assert m == {"dynamic/rounds": 1.0, "dynamic/informative_groups": 0.0, "dynamic/sampled_groups": 8.0}
    # nothing informative: the update gets tasks_per_step groups (all advantages 0), not the 8 sampled
    assert [t.episode.seed for t in kept] == [0, 0, 1, 1] and rewards.tolist() == [0.0] * 4 and len(sampled) == 16
