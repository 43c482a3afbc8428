"""rlkit.tasks.TaskSampler: fresh training tasks by default, a fixed pool with train_tasks=N."""

from collections import Counter

import numpy as np
import pytest

from rlkit.tasks import TaskSampler


def _is_eval(seed: int) -> bool:
    return seed % 3 == 0  # a third of all seeds are "evaluation" seeds here


def test_fresh_tasks_skip_eval_seeds_and_do_not_repeat():
    draws = TaskSampler(7, _is_eval).sample(200)
    assert not any(_is_eval(s) for s in draws)
    assert len(set(draws)) == 200  # 2**31 seeds: a repeat in 200 draws would be a bug


def test_pool_is_the_stream_prefix_visited_in_shuffled_epochs():
    fresh = TaskSampler(7, _is_eval).sample(5)
    pooled = TaskSampler(7, _is_eval, pool_size=5)
    assert pooled.pool == fresh  # the pool is the first N tasks the fresh stream would have drawn
    draws = pooled.sample(7) + pooled.sample(8)  # 3 epochs, split across calls
    epochs = [draws[0:5], draws[5:10], draws[10:15]]
    for epoch in epochs:
        assert sorted(epoch) == sorted(fresh)  # each epoch visits every pool task exactly once
    assert len({tuple(e) for e in epochs}) > 1  # and not in one fixed order
    assert Counter(draws) == Counter({s: 3 for s in fresh})


def test_pool_resumes_exactly_from_a_state_dict():
    a = TaskSampler(3, _is_eval, pool_size=4)
    a.sample(6)
    b = TaskSampler(3, _is_eval, pool_size=4)
    b.load_state_dict(a.state_dict())
    assert b.sample(9) == a.sample(9)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "8"])
def test_bad_pool_size_names_the_key(bad):
    with pytest.raises(ValueError, match="train_tasks"):
        TaskSampler(0, _is_eval, pool_size=bad)
