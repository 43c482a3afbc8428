"""The gymnasium env: registration, check_env, upstream dynamics and rewards."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs.visgym  # noqa: F401  (registers the gymnasium ids)
from envs.visgym import GYM_IDS, STOP, MazeEnv, generate_maze, solve_moves


@pytest.mark.parametrize("env_id", sorted(GYM_IDS.values()))
def test_check_env_on_every_registered_id(env_id):
    env = gym.make(env_id, render_mode="rgb_array")
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_registered_ids_are_ours():
    ours = [i for i in gym.registry if i.startswith("rlkit/Maze2D")]
    assert sorted(ours) == sorted(GYM_IDS.values())


def test_spaces_and_determinism():
    env = MazeEnv("hard", cell_size=10)
    assert env.observation_space.shape == (110, 110, 3)
    assert env.action_space.n == 5
    o1, i1 = env.reset(seed=5)
    o2, i2 = env.reset(seed=5)
    assert np.array_equal(o1, o2) and i1 == i2
    maze_map, start, goal = generate_maze(5, 11)
    assert i1["agent"] == list(start) and i1["goal"] == list(goal) and i1["maze_seed"] == 5
    assert i1["distance"] == abs(start[0] - goal[0]) + abs(start[1] - goal[1])
    assert i1["bfs_distance"] == len(solve_moves(maze_map, start, goal))
    env.reset()  # no seed: a task seed drawn from np_random
    assert isinstance(env.maze_seed, int)


def test_solver_episode_and_reward_rules():
    env = MazeEnv("easy")
    _, info = env.reset(seed=0)
    maze_map = env.maze_map
    total = 0.0
    for a in solve_moves(maze_map, tuple(info["agent"]), tuple(info["goal"])):
        obs, r, term, trunc, info = env.step(a)
        total += r
        assert not term and not trunc
        assert obs.shape == (225, 225, 3)
    assert total == 0.0  # reaching the goal without stop gives nothing
    assert info["agent"] == info["goal"] and info["distance"] == 0 and info["bfs_distance"] == 0
    _, r, term, trunc, info = env.step(STOP)
    assert (r, term, trunc) == (1.0, True, False)
    assert "goal" in info["feedback"]


def test_wall_stop_off_goal_and_invalid_action():
    env = MazeEnv("easy")
    _, info = env.reset(seed=0)  # start (7, 1): walls below and to the left
    _, r, term, _, info2 = env.step(3)  # down into the border wall
    assert info2["agent"] == info["agent"] and r == 0.0 and not term
    assert "Wall" in info2["feedback"]
    for bad in (5, -1, 2.5, "0", None):
        _, r, term, _, info3 = env.step(bad)
        assert (r, term) == (0.0, False) and info3["agent"] == info["agent"]
        assert "Invalid action" in info3["feedback"]
    _, r, term, trunc, info4 = env.step(np.int64(STOP))
    assert (r, term, trunc) == (0.0, True, False)
    assert "off the goal" in info4["feedback"]


def test_step_before_reset_and_text():
    env = MazeEnv("easy")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=2)
    assert env.text().count("A") == 1 and env.text().count("G") == 1


@pytest.mark.parametrize("kwargs", [{"variant": "medium"}, {"cell_size": 2}, {"render_mode": "human"}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        MazeEnv(**kwargs)


def test_transition_is_step_without_the_picture():
    """transition() changes the state exactly as step() does; observation() then draws what step() returned."""
    rng = np.random.default_rng(0)
    for seed in range(6):
        a, b = MazeEnv("easy"), MazeEnv("easy")
        a.reset(seed=seed)
        b.reset(seed=seed)
        for action in [*rng.integers(0, 4, size=12).tolist(), 7, STOP]:
            obs, reward, terminated, truncated, info = a.step(action)
            r, t, i = b.transition(action)
            assert (r, t, i) == (reward, terminated, info) and truncated is False
            assert np.array_equal(b.observation(), obs)


def test_plan_episode_draws_no_picture_per_action(monkeypatch):
    """A plan-mode episode replays its route without drawing an image per action (none is shown after it);
    its step output equals the drawing path's (an env offering only step)."""
    from envs.visgym import VisGymMaze, gym_env

    class StepOnly:  # the env without transition(): the episode takes step(), which draws
        def __init__(self, env):
            self._env = env

        def __getattr__(self, name):
            if name == "transition":
                raise AttributeError(name)
            return getattr(self._env, name)

    spec = VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)
    drawn = []
    real = gym_env.render_array
    monkeypatch.setattr(gym_env, "render_array", lambda *a, **k: drawn.append(1) or real(*a, **k))
    for seed, route in [(3, "down down right right up left down stop"), (4, "up up up"), (5, "right stop")]:
        fast, slow = spec.make(), spec.make()
        slow.env = StepOnly(slow.env)
        drawn.clear()
        fast.reset(seed)
        out = fast.step(f"<answer>{route}</answer>")
        assert len(drawn) == 1  # reset's observation only
        slow.reset(seed)
        ref = slow.step(f"<answer>{route}</answer>")
        assert len(drawn) > 2
        assert (out.reward, out.done, out.info, out.observation) == (ref.reward, ref.done, ref.info, ref.observation)
        assert fast.success() == slow.success()
