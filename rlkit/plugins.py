"""Plug-ins from config: build an option of a config group from its ``_target_``, compose conf/train.yaml, read
a typed group as its dataclass. Every failure is a ConfigError naming the group and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlkit.errors import ConfigError


def instantiate_plugin(node: Any, group: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` for a plug-in group, turning a bad key into a clear error.

    Raises: ConfigError naming the group, its ``_target_`` and Hydra's/the constructor's message
    (e.g. an unknown key: "unexpected keyword argument 'cell_sise'").
    """
    try:
        return instantiate(node, **kwargs)
    except Exception as e:  # hydra wraps constructor errors in InstantiationException
        target = OmegaConf.select(node, "_target_") if OmegaConf.is_config(node) else None
        cause: BaseException = e
        while cause.__cause__ is not None:  # the constructor's own error, not Hydra's wrapper
            cause = cause.__cause__
        hint = ""
        if isinstance(cause, TypeError) and "argument" in str(cause):
            hint = f"\nCheck the keys of conf/{group}/*.yaml and your overrides against {target}'s arguments."
        raise ConfigError(f"config group '{group}' ({target}): {type(cause).__name__}: {cause}{hint}") from None


def compose_train(overrides: list[str]) -> DictConfig:
    """conf/train.yaml composed with these overrides, without the ``hydra`` node (as ``train.py`` composes it).

    Inside a running job (Hydra already initialised by ``train.py``) it composes through that job's config
    search path; elsewhere (tests, scripts) from this checkout's conf/. Keys that interpolate ``${hydra:...}``
    (``paths.*``) resolve only inside a job: set them before reading them elsewhere.

    Raises: ConfigError naming the overrides, with Hydra's message (an unknown group option, key or value).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import rlkit.config  # noqa: F401  (registers the schema)

    try:
        if GlobalHydra.instance().is_initialized():
            return compose(config_name="train", overrides=list(overrides))
        conf = Path(__file__).resolve().parents[1] / "conf"
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))
    except Exception as e:  # hydra raises ConfigCompositionException, OverrideParseException, MissingConfigException
        raise ConfigError(f"config overrides {list(overrides)} do not compose: {e}") from e


def instantiate_reward(node: Any) -> Any:
    """The guarded reward of a ``conf/reward/*.yaml`` node: the plug-in built from the node without
    its guard keys (``timeout_s``, ``on_error``), wrapped in rlkit.reward_guard.GuardedReward.

    Raises: ConfigError for a bad ``timeout_s`` / ``on_error`` (naming the key and its range) or a
    reward that cannot be built (see instantiate_plugin).
    """
    from rlkit.reward_guard import GuardedReward, split_guard_keys

    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    try:
        rest, timeout_s, on_error = split_guard_keys(plain)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return GuardedReward(instantiate_plugin(OmegaConf.create(rest), "reward"), timeout_s=timeout_s, on_error=on_error)


def to_dataclass(node: DictConfig, cls: type) -> Any:
    """A typed config node (validated at compose time) as its dataclass."""
    obj = OmegaConf.to_object(node)
    if not isinstance(obj, cls):
        obj = cls(**obj)
    return obj


