"""impl=upstream (envs/visgym/upstream.py) against a stand-in for upstream VisGym's maze_2d.

The stand-in is rlkit's own code with the API of upstream's ``Maze2DEnv`` as read at VisGym commit
0289034 (gymnasium/envs/maze_2d/maze_2d.py, registered in gymnasium/envs/__init__.py); it is not
upstream's code. What it mirrors, so that an adapter assuming another API fails here:
- ids ``maze_2d/easy`` (9x9) and ``maze_2d/hard`` (11x11), kwargs ``maze_width`` / ``maze_height``,
  ``disable_env_checker=True``; the fork is gymnasium itself, so no other package is imported;
- ``step(action: str)``: ``ast.literal_eval`` of ``"('move', d)"`` / ``"('stop', 'stop')"``; anything
  else, a tuple included, is a no-op reported in ``info['env_feedback']``;
- ``info``: ``agent`` / ``target`` (int arrays [row, col]), ``maze_map``, ``distance`` (float L1),
  ``env_feedback``; attributes ``_agent_location``, ``_target_location``, ``maze_map``;
- ``reset(seed=None, options=None, init_state=None)`` reseeding with ``seed``; the layout of a seeded
  reset is rlkit's ``generate_maze`` (identical to upstream's, tests/envs/test_visgym_maze.py);
- observations: the incrementally drawn pygame canvas (tests/envs/pygame_reference.py), declared as
  a Dict space; ``reset`` renders before dropping the previous canvas; ``render(mode="rgb_array")``.

Where VisGym's fork is really installed, the tests that need a maze_2d env run against it instead.
"""

from __future__ import annotations

import ast

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils import seeding

from envs.visgym import STOP, MazeEnv, VisGymMaze, generate_maze, solve_moves
from envs.visgym.maze import MOVE_DELTAS
from envs.visgym.upstream import (
    UpstreamMazeEnv,
    require_upstream,
    upstream_env_id,
    upstream_installed,
)
from tests.envs.pygame_reference import PygameCanvas, pygame_frame

SIZES = {"easy": 9, "hard": 11}
REAL_FORK = upstream_installed("easy") and upstream_installed("hard")


class _FuncConditional(spaces.Space):
    """Upstream's action space shape: a function name -> its argument space, indexable by name."""

    def __init__(self, branches: dict[str, spaces.Space]):
        self.branches = branches
        super().__init__(None, None)

    def __getitem__(self, name: str) -> spaces.Space:
        return self.branches[name]

    def contains(self, x) -> bool:
        if not isinstance(x, dict) or x.get("function") not in self.branches:
            return False
        return self.branches[x["function"]].contains(x.get("args"))


class StandInMaze2DEnv(gym.Env):
    """Upstream ``Maze2DEnv``'s API (see the module docstring), written for these tests."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(self, maze_width: int = 11, maze_height: int = 11, seed: int | None = None):
        self.maze_width, self.maze_height = maze_width, maze_height
        self.np_random, _ = seeding.np_random(seed)
        self.action_space = _FuncConditional({"move": spaces.Discrete(4), "stop": spaces.Text(4)})
        box = spaces.Box(0, 2, shape=(maze_height, maze_width), dtype=int)
        self.observation_space = spaces.Dict({"agent": box, "target": box})
        self.env_feedback = ""
        self._canvas: PygameCanvas | None = None
        self._prev_agent_location = None

    def reset(self, seed=None, options=None, init_state=None):
        super().reset(seed=seed)
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self._prev_agent_location = None
        maze_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        maze_map, agent, target = generate_maze(maze_seed, self.maze_width)
        self.maze_map = maze_map.astype(int)
        self._agent_location, self._target_location = np.array(agent), np.array(target)
        observation = self._get_obs()  # before the old canvas is dropped, as upstream
        info = self._get_info()
        self._canvas = None
        return observation, info

    def step(self, action: str):
        terminated = False
        self.env_feedback = None
        try:
            parsed = ast.literal_eval(action)
        except Exception as exc:  # noqa: BLE001 - upstream catches everything here
            self.env_feedback = f"Cannot parse action string {action!r}: {exc} so the action is invalid."
            return self._get_obs(), 0.0, False, False, self._get_info()
        if not isinstance(parsed, tuple) or len(parsed) != 2:
            self.env_feedback = "The action format is invalid."
            return self._get_obs(), 0.0, False, False, self._get_info()
        branch, payload = parsed
        if branch == "move" and self.action_space["move"].contains(payload):
            new = self._agent_location + np.array(MOVE_DELTAS[payload])
            if self.maze_map[new[0], new[1]] != 1:
                self._prev_agent_location, self._agent_location = self._agent_location, new
            else:
                self.env_feedback = "Cannot move into a wall."
        elif branch == "stop" and self.action_space["stop"].contains(payload):
            terminated = True
        else:
            self.env_feedback = f"The action {parsed!r} is not valid so nothing is executed."
        reward = 0.0
        if terminated:
            reward = 1.0 if np.array_equal(self._agent_location, self._target_location) else 0.0
        if self.env_feedback is None:
            self.env_feedback = "Action executed successfully."
        info = self._get_info()
        return self._get_obs(), reward, terminated, False, info

    def render(self, mode="rgb_array"):
        if mode != "rgb_array":
            raise ValueError(f"Invalid render mode: {mode}")
        if self._canvas is None:
            self._canvas = PygameCanvas(self.maze_map, self._target_location)
        return self._canvas.draw(self._agent_location, self._prev_agent_location).array()

    def _get_obs(self):
        return self.render()

    def _get_info(self):
        return {
            "distance": np.linalg.norm(self._agent_location - self._target_location, ord=1),
            "agent": self._agent_location,
            "target": self._target_location,
            "maze_map": self.maze_map,
            "env_feedback": self.env_feedback,
        }


def _register(monkeypatch, cls, variants=("easy", "hard")):
    for variant in variants:
        size = SIZES[variant]
        env_id = upstream_env_id(variant)
        monkeypatch.setitem(gym.registry, env_id, EnvSpec(
            id=env_id, entry_point=cls, kwargs={"maze_width": size, "maze_height": size}, disable_env_checker=True,
        ))


@pytest.fixture
def fork(monkeypatch):
    """maze_2d/easy and /hard: the real fork where installed, else the stand-in (until the test ends)."""
    if not REAL_FORK:
        _register(monkeypatch, StandInMaze2DEnv)


def test_upstream_api_as_mirrored(fork):
    """What the adapter relies on: string actions, tuples ignored, info keys, stale reset image."""
    env = gym.make("maze_2d/easy")
    obs, info = env.reset(seed=0)
    maze_map, start, goal = generate_maze(0, 9)
    assert np.array_equal(info["maze_map"], maze_map)
    assert tuple(info["agent"]) == start and tuple(info["target"]) == goal
    assert obs.shape == (225, 225, 3) and obs.dtype == np.uint8
    assert not env.observation_space.contains(obs)  # declared a Dict, returns the frame
    first = solve_moves(maze_map, start, goal)[0]
    *_, info = env.step(("move", first))  # a tuple is not an action upstream: nothing happens
    assert tuple(info["agent"]) == start and "Cannot parse" in info["env_feedback"]
    _, r, term, trunc, info = env.step(f"('move', {first})")
    assert tuple(info["agent"]) != start and (r, term, trunc) == (0.0, False, False)
    stale, _ = env.reset(seed=1)
    m1, s1, g1 = generate_maze(1, 9)
    assert not np.array_equal(stale, pygame_frame(m1, s1, g1))  # the previous maze's canvas
    assert np.array_equal(env.render(), pygame_frame(m1, s1, g1))
    _, r, term, _, _ = env.step("('stop', 'stop')")
    assert (r, term) == (0.0, True)


@pytest.mark.parametrize("variant", ["easy", "hard"])
def test_reset_gives_upstream_layouts_and_images(fork, variant):
    up, native = UpstreamMazeEnv(variant), MazeEnv(variant)
    side = SIZES[variant] * 25
    assert up.observation_space.shape == (side, side, 3) and up.action_space.n == 5
    for seed in range(4):
        obs, info = up.reset(seed=seed)
        n_obs, n_info = native.reset(seed=seed)
        assert info == n_info and np.array_equal(up.maze_map, native.maze_map)
        assert up.observation_space.contains(obs) and obs.flags["C_CONTIGUOUS"]
        assert np.array_equal(obs, pygame_frame(up.maze_map, up.agent, up.goal))
        assert np.array_equal(obs, n_obs)


def test_solver_episode_matches_native_step_by_step(fork):
    up, native = UpstreamMazeEnv("hard"), MazeEnv("hard")
    for seed in (0, 5):
        _, info = up.reset(seed=seed)
        native.reset(seed=seed)
        for a in solve_moves(up.maze_map, up.agent, up.goal) + [STOP]:
            got, want = up.step(a), native.step(a)
            assert got[1:] == want[1:]
            assert np.array_equal(got[0], want[0])  # the goal is never left: frames are identical
        assert got[1:3] == (1.0, True)


def test_random_actions_match_native(fork):
    """Wall bumps, stops off the goal and out-of-range actions, each step compared with MazeEnv."""
    rng = np.random.default_rng(0)
    up, native = UpstreamMazeEnv("easy"), MazeEnv("easy")
    bumps = 0
    for seed in range(6):
        up.reset(seed=seed)
        native.reset(seed=seed)
        for a in rng.choice([0, 1, 2, 3, 0, 1, 2, 3, 4, 7, -1], size=40):
            a = int(a)
            got, want = up.step(a), native.step(a)
            assert got[1:] == want[1:], (seed, a)
            bumps += "Wall" in got[4]["feedback"]
            if got[2]:
                break
    assert bumps > 0


def test_second_reset_shows_the_new_maze(fork):
    up = UpstreamMazeEnv("easy")
    up.reset(seed=0)
    for a in (0, 1, 2, 3, 1, 0):
        up.step(a)
    obs, _ = up.reset(seed=1)
    assert np.array_equal(obs, pygame_frame(*generate_maze(1, 9)))


@pytest.mark.parametrize("mode,parser,wall_move", [("interactive", "tuple", "stay"), ("plan", "plan", "fail")])
def test_episode_through_the_spec_matches_native(fork, mode, parser, wall_move):
    spec_up = VisGymMaze(variant="easy", mode=mode, parser=parser, impl="upstream", wall_move=wall_move)
    spec_native = VisGymMaze(variant="easy", mode=mode, parser=parser, impl="native", wall_move=wall_move)
    for seed in (2, 9):
        up, native = spec_up.make(), spec_native.make()
        up.reset(seed)
        native.reset(seed)
        for text in native.demonstration(seed):
            got, want = up.step(text), native.step(text)
            assert (got.reward, got.done, got.info) == (want.reward, want.done, want.info)
            if got.done:
                break
        assert up.success() and native.success()


class _OtherActionFormat(StandInMaze2DEnv):
    """A fork whose step wants another action format: every string the adapter sends is a no-op."""

    def step(self, action):
        return super().step(f"[{action}]")


class _NoState(StandInMaze2DEnv):
    """A fork that keeps the agent and target under other names."""

    def _get_info(self):
        return {"distance": 0.0, "env_feedback": self.env_feedback}

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        self._agent, self._target = self.__dict__.pop("_agent_location"), self.__dict__.pop("_target_location")
        return out


class _StateOnlyAsAttributes(StandInMaze2DEnv):
    def _get_info(self):
        return {"distance": 0.0, "env_feedback": self.env_feedback}


def test_an_action_the_fork_does_not_apply_raises(monkeypatch):
    _register(monkeypatch, _OtherActionFormat)
    up = UpstreamMazeEnv("easy")
    up.reset(seed=0)
    with pytest.raises(RuntimeError, match="did not apply"):
        for a in solve_moves(up.maze_map, up.agent, up.goal):
            up.step(a)
    up.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"did not apply \('stop', 'stop'\)"):
        up.step(STOP)


def test_state_is_read_from_attributes_when_info_lacks_it(monkeypatch):
    _register(monkeypatch, _StateOnlyAsAttributes)
    up, native = UpstreamMazeEnv("easy"), MazeEnv("easy")
    assert up.reset(seed=3)[1] == native.reset(seed=3)[1]
    assert up.step(0)[1:] == native.step(0)[1:]


def test_missing_state_raises_naming_it(monkeypatch):
    _register(monkeypatch, _NoState)
    up = UpstreamMazeEnv("easy")
    with pytest.raises(RuntimeError, match="no 'agent' in info nor '_agent_location'"):
        up.reset(seed=0)


def test_not_installed_and_unknown_variant(monkeypatch):
    for variant in ("easy", "hard"):
        monkeypatch.delitem(gym.registry, upstream_env_id(variant), raising=False)
    with pytest.raises(ImportError, match="not VisGym's fork") as exc:
        UpstreamMazeEnv("hard")
    msg = str(exc.value)
    assert "maze_2d/hard" in msg and "pip install -e" in msg and "impl=native" in msg
    assert "gymnasium==1.4.0" in msg and "0289034" in msg
    with pytest.raises(ValueError, match="small"):
        require_upstream("small")
