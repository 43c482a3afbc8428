"""Any rlkit env as a skyrl-gym ``BaseTextEnv``: one adapter over rlkit's env protocol (rlkit/types.py).

Registered as ``rlkit-env`` by ``register()``. SkyRL creates it with ``skyrl_gym.make("rlkit-env",
env_config=..., extras=...)`` (``rlkit-rewarded``, rlkit.backends.skyrl.gym_env, does so for each row):

- ``env_config``: the env group's node as a mapping, ``{"_target_": "<EnvSpec class>", **kwargs}``
  (conf/env/<name>.yaml, overrides applied), instantiated as the native backend does
  (rlkit.plugins.instantiate_plugin); a bad key raises ConfigError naming it.
- ``extras``: the dataset row's extra fields. The task seed is ``extras["seed"]`` or
  ``extras["extra_info"]["seed"]`` (required). SkyRL's generator also puts its ``max_turns`` there; it must
  equal the spec's ``max_turns`` (policy turns), else a ValueError says which config to fix.

Images travel in the OpenAI chat format that SkyRL's VLM generator hands to vLLM's chat renderer: a user
message whose ``content`` is a list of parts, each image first as
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` then
``{"type": "text", "text": ...}``. ``init(prompt)`` replaces the dataset prompt with the env's own first
messages (its ``system_prompt``, when not None, then the first observation of the seed): the observation
depends on the seed, so the dataset only carries the seed.

Rewards are the env's own per-step rewards; ``episode()`` gives the ``rlkit.types.Episode`` record so that
``rlkit-rewarded`` can apply the configured rlkit reward. The turn budget is the harness's, as in rlkit's
rollout: the episode ends when the env says done or after ``max_turns`` policy turns (truncated).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import skyrl_gym
from omegaconf import OmegaConf
from PIL import Image
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rlkit.backends.skyrl.compile import SPEC_ENV_ID
from rlkit.plugins import instantiate_plugin
from rlkit.safe_text import escape_special_tokens
from rlkit.types import EnvSpec, Episode, Observation, Turn



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


def task_seed(extras: Mapping[str, Any], who: str = SPEC_ENV_ID) -> int:
    """The task seed of a dataset row: ``extras["seed"]`` or ``extras["extra_info"]["seed"]``.

    Raises: ValueError naming ``who`` and the row's keys when neither is there."""
    if "seed" in extras:
        return int(extras["seed"])
    extra_info = extras.get("extra_info") or {}
    if isinstance(extra_info, Mapping) and "seed" in extra_info:
        return int(extra_info["seed"])
    raise ValueError(
        f"{who}: the dataset row must give the task seed as 'seed' or extra_info.seed; extras has keys {sorted(extras)}"
    )


class EnvSpecAdapter(BaseTextEnv):
    """skyrl-gym adapter around ``instantiate(env_config).make()`` for one task seed (see the module docstring).

    Raises:
        ConfigError: env_config without ``_target_``, or one its class refuses (an unknown key).
        ValueError: no seed in extras, or SkyRL's ``max_turns`` differs from the spec's.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        self.spec = self.build_spec(dict(env_config or {}))
        self.seed = task_seed(extras, type(self).__name__)
        self.max_turns = int(self.spec.max_turns)
        if "max_turns" in extras and int(extras["max_turns"]) != self.max_turns:
            raise ValueError(
                f"{SPEC_ENV_ID}: SkyRL generator max_turns={extras['max_turns']} but the env allows {self.max_turns} "
                f"policy turns ({self.spec!r}); set the generator's max_turns from the env spec"
            )
        self.episode_env = self.spec.make()
        self._turns: list[Turn] = []
        self._done = False

    @staticmethod
    def build_spec(env_config: dict[str, Any]) -> EnvSpec:
        """The env spec of ``env_config`` (``_target_`` + kwargs), built as the native backend builds it.

        Raises: ConfigError (rlkit.plugins.instantiate_plugin) naming the target and the bad key."""
        from rlkit.errors import ConfigError

        if "_target_" not in env_config:
            raise ConfigError(f"{SPEC_ENV_ID}: env_config has no _target_ (the env group's node, e.g. "
                              f"{{'_target_': 'envs.shapes.ShapesEnv', ...}}); keys: {sorted(env_config)}")
        return instantiate_plugin(OmegaConf.create(env_config), "env")

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode; returns ``([system?, user(images + text)], {"seed": seed})``."""
        obs = self.episode_env.reset(self.seed)
        messages = [observation_to_message(obs)]
        if self.episode_env.system_prompt:
            messages.insert(0, {"role": "system", "content": escape_special_tokens(self.episode_env.system_prompt)})
        self.turns = 0
        self._turns = []
        self._done = False
        return messages, {"seed": self.seed}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One policy turn: the env steps on ``action`` (never raising on a malformed output, by the protocol)."""
        self.turns += 1
        out = self.episode_env.step(action)
        self._done = out.done or self.turns >= self.max_turns
        self._turns.append(Turn(action_text=action, env_reward=out.reward, done=out.done, info=out.info))
        observations = [] if self._done or out.observation is None else [observation_to_message(out.observation)]
        return BaseTextEnvStepOutput(observations=observations, reward=float(out.reward), done=self._done,
                                     metadata=dict(out.info))

    def episode(self) -> Episode:
        """The rlkit ``Episode`` record of the turns so far (for rlkit reward functions)."""
        terminated = bool(self._turns and self._turns[-1].done)
        return Episode(seed=self.seed, turns=list(self._turns), terminated=terminated,
                       truncated=self._done and not terminated, success=self.episode_env.success())

    def get_metrics(self) -> dict[str, Any]:
        """Per-episode metrics: success (0/1), turns, parse_failures (turns whose info says parse_ok False,
        ``Episode.parse_failures``)."""
        return {"success": float(self.episode_env.success()), "turns": self.turns,
                "parse_failures": self.episode().parse_failures}


def register() -> str:
    """Register ``EnvSpecAdapter`` with skyrl-gym as ``rlkit-env`` (idempotent; skyrl-gym's registry is per
    process); returns the id."""
    if SPEC_ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=SPEC_ENV_ID, entry_point=f"{__name__}:EnvSpecAdapter")
    return SPEC_ENV_ID
