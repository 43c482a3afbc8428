"""``impl=upstream``: drive upstream VisGym's own maze_2d env instead of ``MazeEnv``.

Upstream VisGym is not a dependency of rlkit and is not installed here; ``impl=native`` reproduces its
layouts, rules and images (envs/visgym/README.md lists the few differences), so ``upstream`` exists to
cross-check against the original code in an environment where VisGym is installed.

Checked against the upstream source, github.com/visgym/VisGym commit
0289034b0cefa6fbbad27f7dd8c01545df324afd (the commit rlkit's parity data was recorded from):

- Package: VisGym is a fork of gymnasium itself. ``pip install -e <checkout>`` (its README) installs a
  distribution named ``gymnasium`` (version 1.1.1, pyproject.toml / setup.py); there is no ``visgym``
  package. ``import gymnasium`` registers the envs (gymnasium/__init__.py imports gymnasium/envs,
  whose __init__.py calls ``register``): ``maze_2d/easy`` (9x9) and ``maze_2d/hard`` (11x11), both
  ``gymnasium.envs.maze_2d.maze_2d:Maze2DEnv`` with ``disable_env_checker=True``. No other size.
- ``step`` takes a *string*, ``"('move', d)"`` (d 0 right, 1 up, 2 left, 3 down) or
  ``"('stop', 'stop')"``, and runs ``ast.literal_eval`` on it; anything else (a tuple included) is
  caught, reported in ``info['env_feedback']`` and does nothing. A move into a wall leaves the agent in
  place; stop ends the episode (``terminated``) with reward 1.0 on the target, 0.0 elsewhere; every
  other step gives 0.0; it never truncates.
- State: ``info`` on reset and step holds ``agent`` and ``target`` (int arrays [row, col]),
  ``maze_map`` (int [H, W], 1 wall, 0 free), ``distance`` (L1, float) and ``env_feedback``; the
  unwrapped env keeps them as ``_agent_location``, ``_target_location``, ``maze_map``.
- ``reset(seed=s)`` reseeds the env's ``np_random`` with ``s`` before drawing the maze (same maze for
  the same seed, the layouts rlkit's tests record); ``reset()`` without a seed continues the stream.
- Observation: the pygame frame, uint8 [H*25, W*25, 3], although ``observation_space`` is declared
  as a Dict of agent/target boxes. The canvas is drawn incrementally and kept across steps, and
  ``reset`` renders *before* dropping the old canvas, so on an env that has already run an episode
  the observation ``reset`` returns is the previous maze's canvas; upstream's own harness shows
  ``render()`` after reset, which draws the new maze.

What this adapter does accordingly: checks that the imported gymnasium registers the id, sends the
action strings, reads the state from ``info`` (then from the unwrapped env's attributes), declares
the real image space, takes the reset image from ``render()``, and raises RuntimeError where the
fork's state or dynamics do not match what was checked (a missing key, a wrong map shape or image
shape, an action that was not applied). Never run here: the adapter has not been executed against
the real package (installing it replaces rlkit's pinned gymnasium==1.4.0 with the fork's 1.1.1);
tests/envs/test_visgym_upstream.py runs it against a stand-in with the API above. Unverified: that
the rest of rlkit runs on the fork's gymnasium 1.1.1, and the fork's behaviour beyond that commit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.visgym.gym_env import N_ACTIONS, STOP, action_index, invalid_action_feedback
from envs.visgym.maze import MOVE_NAMES, VARIANT_SIZES, distance_map, step_position

#: Python package VisGym ships as: a fork of gymnasium; importing it registers the maze_2d ids.
UPSTREAM_PACKAGE = "gymnasium"

#: Upstream commit this adapter was checked against.
UPSTREAM_COMMIT = "0289034b0cefa6fbbad27f7dd8c01545df324afd"

#: Variants upstream registers (``maze_2d/<variant>``); rlkit's ``small`` is native only.
UPSTREAM_VARIANTS = ("easy", "hard")

#: Upstream's fixed cell size in pixels (``RandomMaze2DEnv._window_pixel_size``).
UPSTREAM_CELL_SIZE = 25

INSTALL_HINT = (
    "impl=upstream needs VisGym (github.com/visgym/VisGym, checked at commit {commit}), which ships as "
    "a fork of gymnasium: installing it replaces the `gymnasium` package (its version 1.1.1; rlkit pins "
    "gymnasium==1.4.0), and `import gymnasium` then registers 'maze_2d/easy' and 'maze_2d/hard'. In a "
    "separate virtual environment with rlkit's requirements run "
    "`python -m pip install -e <VisGym checkout> pygame`. "
    "Or use impl=native (the same mazes and rules, checked against recorded upstream runs)."
)


def upstream_env_id(variant: str) -> str:
    """Upstream gymnasium id of a variant: ``maze_2d/easy`` or ``maze_2d/hard``."""
    return f"maze_2d/{variant}"


def upstream_installed(variant: str = "easy") -> bool:
    """True when the imported gymnasium registers ``maze_2d/<variant>`` (i.e. it is VisGym's fork)."""
    return upstream_env_id(variant) in gym.registry


def require_upstream(variant: str) -> None:
    """Check that the imported gymnasium is VisGym's fork, providing ``maze_2d/<variant>``.

    Raises:
        ValueError: ``variant`` is not one upstream has.
        ImportError: the gymnasium in this environment does not register the id (message says how
            to install the fork).
    """
    if variant not in UPSTREAM_VARIANTS:
        raise ValueError(f"upstream VisGym has maze_2d variants {UPSTREAM_VARIANTS}, not {variant!r}")
    if upstream_installed(variant):
        return
    env_id = upstream_env_id(variant)
    raise ImportError(
        f"the gymnasium imported here ({gym.__version__}, {gym.__file__}) is not VisGym's fork: it "
        f"registers no {env_id!r}. " + INSTALL_HINT.format(commit=UPSTREAM_COMMIT[:7])
    )


class UpstreamMazeEnv(gym.Env):
    """Upstream VisGym's maze_2d behind ``MazeEnv``'s interface (``Discrete(5)`` actions, same info).

    Observations are upstream's own frames (uint8 [H*25, W*25, 3]); rewards and termination are
    upstream's; the feedback texts and info keys are rlkit's (``MazeEnv``).

    Args:
        variant: "easy" or "hard".

    Raises:
        ValueError / ImportError: see ``require_upstream``.
    """

    metadata = {"render_modes": []}

    def __init__(self, variant: str = "easy"):
        require_upstream(variant)
        self.variant = variant
        self.size = VARIANT_SIZES[variant]
        self._env = gym.make(upstream_env_id(variant))
        side = self.size * UPSTREAM_CELL_SIZE
        # upstream declares a Dict space but returns the rendered frame
        self.observation_space = spaces.Box(0, 255, shape=(side, side, 3), dtype=np.uint8)
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
        _, info = self._env.reset(seed=self.maze_seed)
        self._read_state(info)
        self._dist = distance_map(self.maze_map, self.goal)
        # reset's own observation is the previous episode's canvas once the env has stepped;
        # render() draws the new maze, as upstream's harness shows it
        self._obs = self._frame(self._env.render(), "render() after reset")
        return self._obs, self._info("")

    def step(self, action):
        if self.maze_map is None:
            raise RuntimeError("UpstreamMazeEnv.step() called before reset()")
        a = action_index(action)
        if a is None:
            return self._obs, 0.0, False, False, self._info(invalid_action_feedback(action))
        before = self.agent
        upstream_action = "('stop', 'stop')" if a == STOP else f"('move', {a})"
        obs, reward, terminated, truncated, info = self._env.step(upstream_action)
        self._read_state(info)
        self._check_applied(a, upstream_action, before, bool(terminated), info)
        if a == STOP:
            feedback = "You stopped on the goal." if self.agent == self.goal else "You stopped off the goal."
        elif self.agent == before:
            feedback = f"Wall: moving {MOVE_NAMES[a]} left you in place."
        else:
            feedback = f"You moved {MOVE_NAMES[a]}."
        self._obs = self._frame(obs, "step()")
        return self._obs, float(reward), bool(terminated), bool(truncated), self._info(feedback)

    def close(self):
        self._env.close()

    # -- helpers ---------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"upstream env {upstream_env_id(self.variant)!r}"

    def _frame(self, image, source: str) -> np.ndarray:
        frame = np.asarray(image)
        if frame.shape != self.observation_space.shape or frame.dtype != np.uint8:
            raise RuntimeError(
                f"{self._where()} {source} gave an image of shape {frame.shape} {frame.dtype}, "
                f"expected {self.observation_space.shape} uint8; impl=upstream cannot use it (use impl=native)"
            )
        return np.ascontiguousarray(frame)

    def _check_applied(self, a: int, sent: str, before, terminated: bool, info: dict[str, Any]) -> None:
        """Raise when the fork did not do what ``sent`` asks (a wrong action format is silently a no-op there)."""
        if a == STOP:
            ok = terminated and self.agent == before
            expected = "the episode to end in place"
        else:
            expected_pos = step_position(self.maze_map, before, a)
            ok = self.agent == expected_pos and not terminated
            expected = f"the agent at {list(expected_pos)}"
        if not ok:
            raise RuntimeError(
                f"{self._where()} did not apply {sent}: expected {expected}, got the agent at "
                f"{list(self.agent)} (from {list(before)}), terminated={terminated}; its feedback: "
                f"{info.get('env_feedback')!r}. impl=upstream assumes the fork at commit {UPSTREAM_COMMIT[:7]} "
                "(use impl=native)"
            )

    def _read_state(self, info: dict[str, Any]) -> None:
        src = self._env.unwrapped
        # info key, then the unwrapped env's attribute, for each piece of state
        names = {"agent": "_agent_location", "target": "_target_location", "maze_map": "maze_map"}
        values = {}
        for key, attr in names.items():
            if key in info:
                values[key] = info[key]
            elif hasattr(src, attr):
                values[key] = getattr(src, attr)
            else:
                raise RuntimeError(
                    f"{self._where()} exposes no {key!r} in info nor {attr!r} as an attribute; "
                    "impl=upstream cannot follow its state (use impl=native)"
                )
        maze_map = np.asarray(values["maze_map"], dtype=np.int64)
        if maze_map.shape != (self.size, self.size):
            raise RuntimeError(
                f"{self._where()} has a maze_map of shape {maze_map.shape}, expected "
                f"{(self.size, self.size)}; impl=upstream cannot follow its state (use impl=native)"
            )
        self.maze_map = maze_map
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
