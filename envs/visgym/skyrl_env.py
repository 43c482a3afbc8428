"""The VisGym maze episode as a skyrl-gym ``BaseTextEnv`` (for the skyrl backend).

Registered as ``rlkit-visgym-maze`` by ``register()`` (or ``envs.visgym.register_skyrl()``); this
module registers on import. SkyRL creates it with ``skyrl_gym.make(env_class, env_config=...,
extras=...)``:

- ``env_config``: a mapping of ``VisGymMaze`` arguments (variant, mode, max_turns, parser,
  cell_size, impl, wall_move); an unknown key fails with TypeError. Missing keys take VisGymMaze's defaults.
- ``extras``: the dataset row's extra fields. The task seed is ``extras["seed"]`` or
  ``extras["extra_info"]["seed"]`` (required). SkyRL's generator also puts its ``max_turns`` there;
  it must equal the spec's policy turns (``VisGymMaze.max_turns``: ``max_turns`` in interactive
  mode, 1 in plan mode), else a ValueError says which config to fix.

Images travel in the OpenAI chat format that SkyRL's VLM generator hands to vLLM's chat renderer:
a user message whose ``content`` is a list of parts, the image first as
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` then
``{"type": "text", "text": ...}``. ``init(prompt)`` replaces the dataset prompt with the env's own
first messages (system instructions + the maze image of the seed): the image depends on the seed,
so the dataset only needs to carry the seed.

Rewards are the env rewards (upstream semantics: 1.0 on stopping at the goal); ``episode()`` gives
the ``rlkit.types.Episode`` record so that the backend can apply the configured rlkit reward.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import skyrl_gym
from PIL import Image
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from envs.visgym import SKYRL_ENV_ID
from envs.visgym.spec import VisGymMaze
from rlkit.safe_text import escape_special_tokens
from rlkit.types import Episode, Observation, Turn


def image_to_data_url(image: Image.Image) -> str:
    """PNG-encode a PIL image as a ``data:image/png;base64,...`` URL."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def observation_to_message(obs: Observation) -> dict[str, Any]:
    """An rlkit ``Observation`` as one OpenAI-format user message (images first, then text).

    The text may echo model output; special-token strings in it are escaped
    (rlkit.safe_text.escape_special_tokens) before SkyRL's chat template tokenizes it."""
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image_to_data_url(img)}} for img in obs.images
    ]
    parts.append({"type": "text", "text": escape_special_tokens(obs.text)})
    return {"role": "user", "content": parts}


def _task_seed(extras: Mapping[str, Any]) -> int:
    if "seed" in extras:
        return int(extras["seed"])
    extra_info = extras.get("extra_info") or {}
    if isinstance(extra_info, Mapping) and "seed" in extra_info:
        return int(extra_info["seed"])
    raise ValueError(
        f"{SKYRL_ENV_ID}: the dataset row must give the maze seed as 'seed' or extra_info.seed; "
        f"extras has keys {sorted(extras)}"
    )


class SkyRLMazeEnv(BaseTextEnv):
    """skyrl-gym adapter around ``VisGymMaze(**env_config).make()`` (see module docstring).

    Raises:
        TypeError: unknown env_config key. ValueError: no seed in extras, or a max_turns mismatch.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        config = dict(env_config or {})
        self.maze_spec = VisGymMaze(**config)
        self.seed = _task_seed(extras)
        self.max_turns = self.maze_spec.max_turns
        if "max_turns" in extras and int(extras["max_turns"]) != self.maze_spec.max_turns:
            raise ValueError(
                f"{SKYRL_ENV_ID}: SkyRL generator max_turns={extras['max_turns']} but the env allows "
                f"{self.maze_spec.max_turns} policy turns ({self.maze_spec!r}); set the generator's "
                "max_turns from the env spec"
            )
        self.episode_env = self.maze_spec.make()
        self._turns: list[Turn] = []
        self._done = False

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode; returns ``([system, user(image + text)], {"seed": seed})``."""
        obs = self.episode_env.reset(self.seed)
        messages = [observation_to_message(obs)]
        if self.episode_env.system_prompt:
            messages.insert(0, {"role": "system", "content": escape_special_tokens(self.episode_env.system_prompt)})
        self.turns = 0
        self._turns = []
        self._done = False
        return messages, {"seed": self.seed}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One policy turn: parse and apply ``action``; never raises on a malformed output."""
        self.turns += 1
        out = self.episode_env.step(action)
        self._done = out.done or self.turns >= self.max_turns
        self._turns.append(Turn(action_text=action, env_reward=out.reward, done=out.done, info=out.info))
        observations = [] if self._done or out.observation is None else [observation_to_message(out.observation)]
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=float(out.reward),
            done=self._done,
            metadata=dict(out.info),
        )

    def episode(self) -> Episode:
        """The rlkit ``Episode`` record of the turns so far (for rlkit reward functions)."""
        terminated = bool(self._turns and self._turns[-1].done)
        return Episode(
            seed=self.seed,
            turns=list(self._turns),
            terminated=terminated,
            truncated=self._done and not terminated,
            success=self.episode_env.success(),
        )

    def get_metrics(self) -> dict[str, Any]:
        """Per-episode metrics: success (0/1), turns, parse_failures."""
        return {
            "success": float(self.episode_env.success()),
            "turns": self.turns,
            "parse_failures": sum(1 for t in self._turns if not t.info.get("parse_ok", False)),
        }


def register() -> str:
    """Register ``SkyRLMazeEnv`` with skyrl-gym as ``rlkit-visgym-maze`` (idempotent); returns the id."""
    if SKYRL_ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=SKYRL_ENV_ID, entry_point="envs.visgym.skyrl_env:SkyRLMazeEnv")
    return SKYRL_ENV_ID


register()
