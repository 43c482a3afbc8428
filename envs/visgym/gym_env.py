"""Gymnasium environment for VisGym maze_2d (native re-implementation, upstream dynamics).

Registered ids: ``rlkit/Maze2D-easy-v0`` (9x9) and ``rlkit/Maze2D-hard-v0`` (11x11).

- Observation: the RGB image of the state, uint8 [H * cell_size, W * cell_size, 3] (``render.py``).
- Actions: ``Discrete(5)``: 0..3 move in action directions (0 right, 1 up, 2 left, 3 down,
  upstream ``('move', d)``), 4 = stop (upstream ``('stop', 'stop')``).
- Dynamics and reward (upstream VisGym maze_2d): a move into a wall leaves the agent in place;
  every step gives 0 except stop, which gives 1.0 on the goal and 0.0 elsewhere and terminates the
  episode. Reaching the goal without stopping gives nothing. The env never truncates: the step
  budget (VisGym paper: 20 easy / 30 hard turns) belongs to the harness (e.g. ``TimeLimit``).
- An out-of-range action is a no-op with reward 0 and a feedback text saying why.
- ``info`` on reset and on every step: ``agent`` and ``goal`` ([row, col] lists), ``distance``
  (L1 cells), ``bfs_distance`` (remaining shortest-path moves), ``feedback`` (short text),
  ``maze_seed`` (the task seed).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.visgym.maze import (
    MOVE_NAMES,
    VARIANT_SIZES,
    distance_map,
    generate_maze,
    render_text,
    step_position,
)
from envs.visgym.render import DEFAULT_CELL_SIZE, render_array

#: Discrete action index of stop; 0..3 are moves in action directions.
STOP = 4
N_ACTIONS = 5

GYM_IDS: dict[str, str] = {
    "easy": "rlkit/Maze2D-easy-v0",
    "hard": "rlkit/Maze2D-hard-v0",
    "small": "rlkit/Maze2D-small-v0",
}


def action_index(action) -> int | None:
    """``action`` as a ``Discrete(5)`` index (0-3 move, 4 stop), or None when it is not one (a
    non-integer, a float with a fraction, out of range): such an action does nothing."""
    try:
        a = int(action)
        return a if a == action and 0 <= a < N_ACTIONS else None
    except (TypeError, ValueError, OverflowError):
        return None


def invalid_action_feedback(action) -> str:
    """The feedback text of an action ``action_index`` refuses."""
    return f"Invalid action {action!r}: expected 0-3 (move) or 4 (stop)."


class MazeEnv(gym.Env):
    """VisGym maze_2d as a gymnasium env with image observations and ``Discrete(5)`` actions.

    Args:
        variant: "easy" (9x9 grid) or "hard" (11x11 grid), as upstream maze_2d/easy|hard, or "small"
            (7x7 grid, rlkit's own, the same generator).
        cell_size: pixels per cell side in the observation image (default 25, as upstream).
        render_mode: None or "rgb_array" (``render()`` returns the observation image).

    ``reset(seed=s)`` builds the maze of task ``s`` (identical to upstream ``reset(seed=s)``);
    ``reset()`` without a seed draws a task seed from the env's ``np_random``.

    Raises:
        ValueError: unknown variant or render_mode, bad cell_size.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        variant: str = "easy",
        cell_size: int = DEFAULT_CELL_SIZE,
        render_mode: str | None = None,
    ):
        if variant not in VARIANT_SIZES:
            raise ValueError(f"variant must be one of {sorted(VARIANT_SIZES)}, got {variant!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if isinstance(cell_size, bool) or not isinstance(cell_size, (int, np.integer)) or cell_size < 4:
            raise ValueError(f"cell_size must be an int >= 4 pixels, got {cell_size!r}")
        self.variant = variant
        self.size = VARIANT_SIZES[variant]
        self.cell_size = int(cell_size)
        self.render_mode = render_mode
        side = self.size * self.cell_size
        self.observation_space = spaces.Box(0, 255, shape=(side, side, 3), dtype=np.uint8)
        self.action_space = spaces.Discrete(N_ACTIONS)
        self.maze_map: np.ndarray | None = None
        self.agent: tuple[int, int] | None = None
        self.goal: tuple[int, int] | None = None
        self.maze_seed: int | None = None
        self._dist: np.ndarray | None = None

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task ``seed``. Returns ``(observation uint8 [H*cs, W*cs, 3], info)``."""
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self.maze_seed = int(seed)
        self.maze_map, self.agent, self.goal = generate_maze(self.maze_seed, self.size)
        self._dist = distance_map(self.maze_map, self.goal)
        return self._observation(), self._info("")

    def step(self, action):
        """Apply one action (0..3 move, 4 stop). Returns ``(obs, reward, terminated, False, info)``.

        Raises:
            RuntimeError: ``reset`` was not called.
        """
        reward, terminated, info = self.transition(action)
        return self._observation(), reward, terminated, False, info

    def transition(self, action) -> tuple[float, bool, dict[str, Any]]:
        """``step`` without drawing the observation: ``(reward, terminated, info)`` (the state changes alike).

        For callers that never look at the image after this action (plan mode replays a whole route and
        shows no picture after it; drawing one took ~12% of a plan-mode GRPO rollout). Raises as ``step``.
        """
        if self.maze_map is None:
            raise RuntimeError("MazeEnv.step() called before reset()")
        reward, terminated = 0.0, False
        a = action_index(action)
        if a is None:
            feedback = invalid_action_feedback(action)
        elif a == STOP:
            terminated = True
            if self.agent == self.goal:
                reward, feedback = 1.0, "You stopped on the goal."
            else:
                feedback = "You stopped off the goal."
        else:
            new = step_position(self.maze_map, self.agent, a)
            if new == self.agent:
                feedback = f"Wall: moving {MOVE_NAMES[a]} left you in place."
            else:
                feedback = f"You moved {MOVE_NAMES[a]}."
            self.agent = new
        return reward, terminated, self._info(feedback)

    def render(self):
        """The observation image (uint8 [H*cs, W*cs, 3]) when ``render_mode == "rgb_array"``."""
        if self.render_mode == "rgb_array" and self.maze_map is not None:
            return self._observation()
        return None

    # -- helpers ---------------------------------------------------------------------------------

    def text(self) -> str:
        """Text picture of the current state (``#`` wall, ``.`` free, ``A`` agent, ``G`` goal)."""
        if self.maze_map is None:
            raise RuntimeError("MazeEnv.text() called before reset()")
        return render_text(self.maze_map, self.agent, self.goal)

    def observation(self) -> np.ndarray:
        """The current state's observation image (uint8 [H*cs, W*cs, 3]), as ``reset`` / ``step`` return it."""
        return self._observation()

    def _observation(self) -> np.ndarray:
        return render_array(self.maze_map, self.agent, self.goal, self.cell_size)

    def _info(self, feedback: str) -> dict[str, Any]:
        agent, goal = self.agent, self.goal
        return {
            "agent": [int(agent[0]), int(agent[1])],
            "goal": [int(goal[0]), int(goal[1])],
            "distance": int(abs(agent[0] - goal[0]) + abs(agent[1] - goal[1])),
            "bfs_distance": int(self._dist[agent]),
            "feedback": feedback,
            "maze_seed": self.maze_seed,
        }


def register_gymnasium() -> None:
    """Register ``rlkit/Maze2D-easy-v0``, ``-hard-v0`` and ``-small-v0`` with gymnasium (idempotent)."""
    for variant, env_id in GYM_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="envs.visgym.gym_env:MazeEnv",
                kwargs={"variant": variant},
            )
