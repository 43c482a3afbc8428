"""``impl=upstream``: drive the real VisGym maze_2d env (the VisGym fork) instead of ``MazeEnv``.

The fork is not a dependency of rlkit and is not installed here; ``impl=native`` reproduces its
layouts exactly (tests/envs checks the recorded upstream layouts), so ``upstream`` exists to
cross-check against the original code on a machine where the fork is installed.

Assumptions about the fork (its source is not available here, so this adapter is untested against
it): importing the package ``visgym`` registers ``maze_2d/easy`` and ``maze_2d/hard`` with
gymnasium; ``step`` takes VisGym action tuples ``('move', d)`` / ``('stop', 'stop')``; the maze
state is readable as ``agent``, ``target`` and ``maze_map`` from ``info`` or from the unwrapped env
(the names used in the recorded layouts). Anything else fails with a RuntimeError naming the gap.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.visgym.gym_env import N_ACTIONS, STOP
from envs.visgym.maze import MOVE_NAMES, distance_map

#: Python package of the VisGym fork; importing it registers the maze_2d ids with gymnasium.
UPSTREAM_PACKAGE = "visgym"

INSTALL_HINT = (
    "impl=upstream needs the VisGym fork importable as `{pkg}` in this Python environment, so that "
    "gymnasium.make('maze_2d/{variant}') works: clone the fork and run "
    "`/path/to/.venv/bin/python -m pip install -e <path-to-VisGym-fork>`. "
    "Or use impl=native (identical mazes and dynamics, checked against recorded upstream layouts)."
)


def upstream_env_id(variant: str) -> str:
    """Upstream gymnasium id of a variant: ``maze_2d/easy`` or ``maze_2d/hard``."""
    return f"maze_2d/{variant}"


def require_upstream(variant: str) -> None:
    """Check that the VisGym fork provides ``maze_2d/<variant>``.

    Raises:
        ImportError: the fork package cannot be imported (message says how to install it).
        RuntimeError: it imports but does not register the gymnasium id.
    """
    env_id = upstream_env_id(variant)
    hint = INSTALL_HINT.format(pkg=UPSTREAM_PACKAGE, variant=variant)
    if env_id in gym.registry:
        return
    try:
        importlib.import_module(UPSTREAM_PACKAGE)
    except ImportError as e:
        raise ImportError(f"cannot import the VisGym fork ({e}). {hint}") from e
    if env_id not in gym.registry:
        raise RuntimeError(f"`import {UPSTREAM_PACKAGE}` did not register {env_id!r}. {hint}")


class UpstreamMazeEnv(gym.Env):
    """The VisGym fork's maze_2d behind ``MazeEnv``'s interface (``Discrete(5)`` actions, same info).

    Args:
        variant: "easy" or "hard".

    Raises:
        ImportError / RuntimeError: see ``require_upstream``.
    """

    metadata = {"render_modes": []}

    def __init__(self, variant: str = "easy"):
        require_upstream(variant)
        self.variant = variant
        self._env = gym.make(upstream_env_id(variant))
        self.observation_space = self._env.observation_space
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.maze_map: np.ndarray | None = None
        self.agent = self.goal = None
        self.maze_seed: int | None = None
        self._dist: np.ndarray | None = None
        self._obs: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self.maze_seed = int(seed)
        obs, info = self._env.reset(seed=self.maze_seed)
        self._read_state(info)
        self._dist = distance_map(self.maze_map, self.goal)
        self._obs = np.asarray(obs)
        return self._obs, self._info("")

    def step(self, action):
        a = int(action)
        before = self.agent
        if a == STOP:
            upstream_action = ("stop", "stop")
        elif 0 <= a < STOP:
            upstream_action = ("move", a)
        else:
            return self._last_obs_unchanged(f"Invalid action {action!r}: expected 0-3 (move) or 4 (stop).")
        obs, reward, terminated, truncated, info = self._env.step(upstream_action)
        self._read_state(info)
        if a == STOP:
            feedback = "You stopped on the goal." if self.agent == self.goal else "You stopped off the goal."
        elif self.agent == before:
            feedback = f"Wall: moving {MOVE_NAMES[a]} left you in place."
        else:
            feedback = f"You moved {MOVE_NAMES[a]}."
        self._obs = np.asarray(obs)
        return self._obs, float(reward), bool(terminated), bool(truncated), self._info(feedback)

    def close(self):
        self._env.close()

    def _last_obs_unchanged(self, feedback: str):
        return self._obs, 0.0, False, False, self._info(feedback)

    def _read_state(self, info: dict[str, Any]) -> None:
        src = self._env.unwrapped
        values = {}
        for key in ("agent", "target", "maze_map"):
            if key in info:
                values[key] = info[key]
            elif hasattr(src, key):
                values[key] = getattr(src, key)
            else:
                raise RuntimeError(
                    f"VisGym fork env {upstream_env_id(self.variant)!r} exposes no {key!r} in info or "
                    "as an attribute; impl=upstream cannot follow its state (use impl=native)"
                )
        self.maze_map = np.asarray(values["maze_map"], dtype=np.int64)
        self.agent = (int(values["agent"][0]), int(values["agent"][1]))
        self.goal = (int(values["target"][0]), int(values["target"][1]))

    def _info(self, feedback: str) -> dict[str, Any]:
        agent, goal = self.agent, self.goal
        return {
            "agent": [agent[0], agent[1]],
            "goal": [goal[0], goal[1]],
            "distance": abs(agent[0] - goal[0]) + abs(agent[1] - goal[1]),
            "bfs_distance": int(self._dist[agent]),
            "feedback": feedback,
            "maze_seed": self.maze_seed,
        }
