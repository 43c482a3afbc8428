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


def test_to_task_maps_stream_seeds_and_the_eval_check_sees_the_mapped_task():
    plain = TaskSampler(5, lambda s: False).sample(50)
    mapped = TaskSampler(5, lambda s: False, to_task=lambda s: s + 10**10).sample(50)
    assert mapped == [s + 10**10 for s in plain]
    # a mapped task that is an evaluation task is skipped, even though its stream seed is not one
    odd_is_eval = TaskSampler(5, lambda s: s % 2 == 1, to_task=lambda s: s + 1).sample(50)
    assert all(s % 2 == 0 for s in odd_is_eval)


def test_room_endpoint_share_of_the_visgym_training_stream():
    from envs.visgym.maze import ROOM_TASKS, generate_maze
    from envs.visgym.spec import VisGymMaze
    from rlkit.tasks import training_sampler

    def spec(share):
        return VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", train_room_endpoints=share)

    corners = training_sampler(spec(0.0), 1).sample(400)
    assert all(s < ROOM_TASKS for s in corners)
    half = training_sampler(spec(0.5), 1).sample(400)
    rooms = [s for s in half if s >= ROOM_TASKS]
    assert 150 < len(rooms) < 250
    assert training_sampler(spec(0.5), 1).sample(400) == half  # reproducible
    assert all(s >= ROOM_TASKS for s in training_sampler(spec(1.0), 1).sample(100))
    # never an evaluation maze, corner or room task alike (7x7: 64 of 768 corner layouts are held out)
    ev = spec(1.0)
    assert not any(ev.is_eval_seed(s) for s in training_sampler(ev, 2).sample(2000))
    eval_layout = generate_maze(ev.eval_seeds()[0], 7)
    assert ev.is_eval_seed(next(ROOM_TASKS + s for s in range(10**6)
                                if generate_maze(ROOM_TASKS + s, 7)[0].tobytes() == eval_layout[0].tobytes()
                                and generate_maze(ROOM_TASKS + s, 7)[1:] == eval_layout[1:]))


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half"])
def test_room_endpoint_share_must_be_a_share(bad):
    from envs.visgym.spec import VisGymMaze

    with pytest.raises(ValueError, match="train_room_endpoints"):
        VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", train_room_endpoints=bad)


def test_loop_task_share_of_the_visgym_training_stream():
    from envs.visgym.maze import LOOP_TASKS, ROOM_TASKS, generate_maze
    from envs.visgym.spec import VisGymMaze
    from rlkit.tasks import training_sampler

    def spec(rooms=0.0, loops=0.0):
        return VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan",
                          train_room_endpoints=rooms, train_open_passage=loops)

    half = training_sampler(spec(loops=0.5), 1).sample(400)
    assert 110 < sum(s >= LOOP_TASKS for s in half) < 200  # 0.5 * 0.64 / (0.5 * 0.64 + 0.5 * 0.92) = 41% (above)
    assert all(s < ROOM_TASKS or s >= LOOP_TASKS for s in half)
    # with both options one coin splits the stream: rooms below the room share, loops above it. About 36% of
    # the 7x7 loop tasks close back to an evaluation maze and are skipped (8% of corner tasks), so of 800 draws
    # about 0.25 / (0.25 + 0.5 * 0.64 + 0.25 * 0.92) = 31% are rooms and 40% loops
    both = training_sampler(spec(rooms=0.25, loops=0.5), 1).sample(800)
    n_rooms, n_loops = sum(ROOM_TASKS <= s < LOOP_TASKS for s in both), sum(s >= LOOP_TASKS for s in both)
    assert 200 < n_rooms < 310 and 270 < n_loops < 370
    # a loop task that closes back to an evaluation maze is held out, and the stream never draws one
    ev = spec(loops=1.0)
    eval_keys = {(generate_maze(s, 7)[0].tobytes(), generate_maze(s, 7)[1:]) for s in ev.eval_seeds()}

    def closes_to_eval(seed):
        m, start, goal = generate_maze(seed, 7)
        for r, c in np.argwhere(m == 0):
            if (r + c) % 2 == 1:
                m2 = m.copy()
                m2[r, c] = 1
                if (m2.tobytes(), (start, goal)) in eval_keys:
                    return True
        return False

    held = [LOOP_TASKS + s for s in range(3000) if closes_to_eval(LOOP_TASKS + s)]
    assert held and all(ev.is_eval_seed(s) for s in held)
    assert not any(ev.is_eval_seed(LOOP_TASKS + s) for s in range(3000) if LOOP_TASKS + s not in held)
    assert not any(closes_to_eval(s) for s in training_sampler(ev, 2).sample(500))


@pytest.mark.parametrize("rooms, loops", [(0.0, -0.1), (0.0, 1.5), (0.0, True), (0.6, 0.5)])
def test_loop_task_share_must_fit_beside_the_room_share(rooms, loops):
    from envs.visgym.spec import VisGymMaze

    with pytest.raises(ValueError, match="train_open_passage"):
        VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan",
                   train_room_endpoints=rooms, train_open_passage=loops)
