"""rlkit.sampling.demos: which tasks of a step the demonstration term (aux_loss.demo_coef) teaches."""

import pytest

from rlkit.rollout import Trajectory
from rlkit.sampling.demos import demonstration_tasks
from rlkit.types import Episode


def _traj(seed, success):
    ep = Episode(seed=seed, turns=[], terminated=True, truncated=False, success=success)
    return Trajectory([1], [1], [0.0], [], ep, group=0, policy_version=0)


def test_demonstration_tasks_are_the_groups_without_a_success():
    g = 3
    groups = [(5, [False, False, False]), (6, [False, True, False]), (7, [False] * 3), (5, [False] * 3),
              (8, [True] * 3)]
    trajs = [_traj(seed, s) for seed, flags in groups for s in flags]
    assert demonstration_tasks(trajs, g) == [5, 7]  # in order, each once (task 5 drawn again in a later round)
    with pytest.raises(ValueError, match="whole groups"):
        demonstration_tasks(trajs[:-1], g)


def test_demo_max_successes_also_picks_groups_with_few_successes():
    g = 4
    groups = [(5, [False] * 4), (6, [False, True, False, False]), (7, [True, True, False, False]),
              (8, [True] * 4), (9, [False, False, False, True])]
    trajs = [_traj(seed, s) for seed, flags in groups for s in flags]
    assert demonstration_tasks(trajs, g, max_successes=0) == [5]
    assert demonstration_tasks(trajs, g, max_successes=1) == [5, 6, 9]
    assert demonstration_tasks(trajs, g, max_successes=2) == [5, 6, 7, 9]
    assert demonstration_tasks(trajs, g, max_successes=3) == [5, 6, 7, 9]  # an all-success group is never picked
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="demo_max_successes"):
            demonstration_tasks(trajs, g, max_successes=bad)
