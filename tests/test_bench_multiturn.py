"""bench/bench_multiturn.py's token count behind the multi-turn floor it prints."""

from types import SimpleNamespace

from bench.bench_multiturn import update_tokens


def traj(*ids):
    return SimpleNamespace(input_ids=list(ids))


def test_update_tokens_counts_each_groups_common_prefix_once():
    trajs = [traj(1, 2, 3, 4), traj(1, 2, 3, 5, 6), traj(1, 2, 9),  # group 0: prefix [1, 2]
             traj(7, 8), traj(8, 7), traj(7)]  # group 1: no common prefix
    # group 0: 2 shared + (2 + 3 + 1) own; group 1: 2 + 2 + 1
    assert update_tokens(trajs, 3) == 2 + 6 + 5
    # one group holding a sequence that is the others' prefix: that sequence is all prefix
    assert update_tokens([traj(1, 2), traj(1, 2, 3), traj(1, 2, 4, 5)], 3) == 2 + 0 + 1 + 2
    assert update_tokens([traj(1, 2, 3)], 1) == 3
