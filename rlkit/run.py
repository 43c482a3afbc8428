"""Entry from train.py: instantiate the backend and run one job of the (multi)run.

``cfg`` stops here and in the backend's entry; below that, typed configs or plain arguments.
"""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config group's option could not be built; the message names the group and the fix."""


def instantiate_plugin(node: Any, group: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` for a plug-in group, turning a bad key into a clear error.

    Raises: ConfigError naming the group, its ``_target_`` and Hydra's/the constructor's message
    (e.g. an unknown key: "unexpected keyword argument 'cell_sise'").
    """
    try:
        return instantiate(node, **kwargs)
    except Exception as e:  # hydra wraps constructor errors in InstantiationException
        target = OmegaConf.select(node, "_target_") if OmegaConf.is_config(node) else None
        raise ConfigError(
            f"config group '{group}' ({target}) could not be built: {e}\n"
            f"Check the keys of conf/{group}/*.yaml and your overrides against {target}'s arguments."
        ) from e


def to_dataclass(node: DictConfig, cls: type) -> Any:
    """A typed config node (validated at compose time) as its dataclass."""
    obj = OmegaConf.to_object(node)
    if not isinstance(obj, cls):
        obj = cls(**obj)
    return obj


def check_top_level_keys(cfg: DictConfig) -> None:
    """Refuse top-level keys the schema does not know (``+typo=1`` passes Hydra's compose).

    Raises: ConfigError listing the unknown keys.
    """
    from dataclasses import fields

    from rlkit.config import TrainConfig

    known = {f.name for f in fields(TrainConfig)} | {"hydra"}
    unknown = sorted(k for k in cfg.keys() if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown top-level config key(s): {', '.join(unknown)}. Known: {', '.join(sorted(known - {'hydra'}))}. "
            f"Fix the override (a '+' adds a new key instead of setting an existing one)."
        )


def run(cfg: DictConfig) -> dict:
    """Run one job with the configured backend; returns the job's result dict (also result.json)."""
    check_top_level_keys(cfg)
    backend = instantiate_plugin(cfg.backend, "backend")
    return backend.run(cfg)
