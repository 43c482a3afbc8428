"""rlkit's skyrl-gym env: the env's episode (rlkit.backends.skyrl.env_adapter), scored by the configured rlkit reward.

SkyRL's generators (``SkyRLGymGenerator.agent_loop``, ``SkyRLVLMGymGenerator.agent_loop``) create one
env per trajectory with ``skyrl_gym.make(env_class, env_config=..., extras=<dataset row>)``, call
``init(prompt)`` once, then ``step(model_text)`` per turn until ``done``; the reward of each step is
put on the last token of that turn and GRPO sums them per trajectory. ``get_metrics()`` is collected
per episode and averaged into ``environment/<key>`` (``eval/all/environment/<key>`` in evaluation).

``RewardedEnv`` (registered as ``rlkit-rewarded``) reads the task spec from the row's
``rlkit_task`` column (a JSON string: ``register`` "module:function" of the adapter (``rlkit-env``, over any rlkit
EnvSpec), ``env_id``, ``target`` the env's ``_target_``, ``env`` its kwargs, ``reward`` node with ``_target_``),
builds the adapter with ``skyrl_gym.make(env_id, env_config={"_target_": target, **env}, extras=row)`` and forwards ``init``/``step``. Intermediate
steps get reward 0; the step that ends the episode gets ``reward(adapter.episode()).total``, so the
trajectory's return is exactly the rlkit reward of the episode (the env's own per-step rewards are
kept in the step metadata as ``env_reward``). Metrics: the adapter's (e.g. ``success``) plus
``reward`` and ``reward/<component>``.

An episode that SkyRL cuts before the env says done (context over ``generator.max_input_length``)
never reaches a final step and keeps reward 0, as SkyRL does for any env.
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any, Mapping

import skyrl_gym
from hydra.utils import instantiate
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rlkit.backends.skyrl.compile import REWARDED_ENV_ID, TASK_KEY
from rlkit.reward_guard import GuardedReward, RewardError, split_guard_keys
from rlkit.types import RewardOutput

__all__ = ["RewardError", "RewardedEnv", "register"]


@functools.lru_cache(maxsize=16)
def _task(spec_json: str) -> dict[str, Any]:
    spec = json.loads(spec_json)
    module_name, _, fn_name = spec["register"].partition(":")
    env_id = getattr(importlib.import_module(module_name), fn_name)()
    if env_id != spec["env_id"]:
        raise ValueError(f"{spec['register']}() registered {env_id!r}, the dataset expects {spec['env_id']!r}")
    return spec


@functools.lru_cache(maxsize=16)
def _reward_fn(reward_json: str) -> GuardedReward:
    """The guarded reward of a reward config node (its timeout_s / on_error, see rlkit.reward_guard)."""
    node, timeout_s, on_error = split_guard_keys(json.loads(reward_json))
    return GuardedReward(instantiate(node), timeout_s=timeout_s, on_error=on_error)


class RewardedEnv(BaseTextEnv):
    """See the module docstring.

    Args:
        env_config: unused (SkyRL passes ``environment.skyrl_gym.<env_class>``, absent for this id).
        extras: the dataset row without prompt and env_class; must hold ``rlkit_task`` and what the
            adapter reads (``seed``), plus SkyRL's ``max_turns``.

    Raises:
        ValueError: no ``rlkit_task`` in the row, an adapter that registers another id or has no
            ``episode()``.
        RewardError: the reward raised, returned a non-finite total or ran past reward.timeout_s
            (names the reward, the seed and the fix; with reward.on_error=zero it counts as 0 instead).
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        if TASK_KEY not in extras:
            raise ValueError(
                f"{REWARDED_ENV_ID}: the dataset row has no {TASK_KEY!r} column (rows are written by "
                f"rlkit.backends.skyrl.data); row keys: {sorted(extras)}"
            )
        spec = _task(str(extras[TASK_KEY]))
        self.reward_name = str(spec["reward"].get("_target_", "reward"))
        self._reward_json = json.dumps(spec["reward"], sort_keys=True)
        self.inner = skyrl_gym.make(spec["env_id"], env_config={"_target_": spec["target"], **spec["env"]},
                                    extras=extras)
        if not callable(getattr(self.inner, "episode", None)):
            raise ValueError(
                f"{REWARDED_ENV_ID}: the adapter {spec['env_id']!r} has no episode() -> rlkit.types.Episode, "
                "which the rlkit reward needs"
            )
        self.max_turns = getattr(self.inner, "max_turns", self.max_turns)
        self._reward: RewardOutput | None = None

    def init(self, prompt: Any = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The adapter's first messages (the dataset prompt is only a placeholder)."""
        self._reward = None
        self.turns = 0
        return self.inner.init(prompt)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One turn through the adapter; the final turn's reward is the rlkit reward of the episode."""
        out = self.inner.step(action)
        self.turns = getattr(self.inner, "turns", self.turns + 1)
        reward = 0.0
        if out["done"]:
            self._reward = self._score()
            reward = float(self._reward.total)
        metadata = dict(out.get("metadata") or {})
        metadata["env_reward"] = float(out["reward"])
        return BaseTextEnvStepOutput(observations=out["observations"], reward=reward, done=bool(out["done"]),
                                     metadata=metadata)

    def _score(self) -> RewardOutput:
        episode = self.inner.episode()
        try:
            reward = _reward_fn(self._reward_json)
        except Exception as e:
            raise RewardError(f"reward {self.reward_name} could not be built for the episode of seed {episode.seed}: "
                              f"{e}; check conf/reward/ and its overrides") from e
        return reward(episode)

    def get_metrics(self) -> dict[str, Any]:
        """The adapter's metrics plus ``reward`` and ``reward/<component>`` (0 when the episode was cut)."""
        metrics = dict(self.inner.get_metrics())
        if self._reward is not None:
            metrics["reward"] = float(self._reward.total)
            metrics.update({f"reward/{k}": float(v) for k, v in self._reward.components.items()})
        else:
            metrics["reward"] = 0.0
        return metrics

    def close(self) -> None:
        self.inner.close()


def register() -> str:
    """Register ``RewardedEnv`` with skyrl-gym as ``rlkit-rewarded`` (idempotent); returns the id.

    Called in the Ray task that runs SkyRL's trainer and generator (rlkit.backends.skyrl.entrypoint):
    skyrl-gym's registry is per process. The adapter's own id is registered lazily from the row.
    """
    if REWARDED_ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=REWARDED_ENV_ID, entry_point=f"{__name__}:RewardedEnv")
    return REWARDED_ENV_ID
