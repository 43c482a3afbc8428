"""Compose rlkit's Hydra config for the command-line tools around a run (serve, play, eval).

``compose(overrides, run_dir)`` composes conf/train.yaml as ``python train.py <overrides>`` would
(the same defaults, groups and typo checks), registers it as the current Hydra config so that
``${hydra:...}`` interpolations (paths.cache_dir) resolve, and returns it. With a run directory,
that run's recorded overrides (``.hydra/overrides.yaml``, and the ``hydra.searchpath`` of an env outside the
clone) come first, so its env, policy and rollout settings are reproduced; the caller's overrides apply on top. A run that took the default env is
given the env it recorded (``.hydra/hydra.yaml``, ``runtime.choices.env``), so a run made before the
default changed (9x9 ``visgym`` until 2026-12, ``visgym_small`` since) composes as it ran.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from rlkit.config import CONF_DIR  # the package's conf/ (a wheel) or the checkout's

log = logging.getLogger(__name__)



class ConfigComposeError(ValueError):
    """The overrides do not compose; the message names the override and Hydra's reason."""


def run_overrides(run_dir: Path | None) -> list[str]:
    """The overrides a run was started with, or []: its task overrides (``<run_dir>/.hydra/overrides.yaml``) after
    the ``hydra.searchpath`` it was given (``.hydra/hydra.yaml``, ``hydra.overrides.hydra``; rlkit.run_folder.rerun_overrides),
    so a run of an env outside the clone composes with the config folder it came from."""
    if run_dir is None:
        return []
    f = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    from omegaconf import OmegaConf

    from rlkit.run_folder import rerun_overrides

    h = Path(run_dir) / ".hydra" / "hydra.yaml"
    hydra = OmegaConf.select(OmegaConf.load(h), "hydra.overrides.hydra", default=None) if h.is_file() else None
    return rerun_overrides([str(o) for o in OmegaConf.load(f)], [str(o) for o in hydra or ()])


def recorded_env_choice(run_dir: Path | None) -> str | None:
    """The env option a run composed (``<run_dir>/.hydra/hydra.yaml`` runtime.choices.env), or None."""
    if run_dir is None:
        return None
    f = Path(run_dir) / ".hydra" / "hydra.yaml"
    if not f.is_file():
        return None
    from omegaconf import OmegaConf

    choice = OmegaConf.select(OmegaConf.load(f), "hydra.runtime.choices.env")
    return str(choice) if choice else None


def compose(overrides: Sequence[str] = (), run_dir: Path | None = None):
    """The composed train config (DictConfig, with its ``hydra`` node) for these overrides.

    Raises: ConfigComposeError naming the overrides, with Hydra's message (unknown key, unknown
    option of a group, bad value).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    import rlkit.config  # noqa: F401  (registers the schema)

    recorded = run_overrides(run_dir)
    env_choice = recorded_env_choice(run_dir)
    if env_choice and not any(str(o).lstrip("+~").startswith("env=") for o in [*recorded, *overrides]):
        recorded = [f"env={env_choice}", *recorded]
    all_overrides = [*recorded, *overrides]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name="train", overrides=all_overrides, return_hydra_config=True)
    except Exception as e:  # hydra raises ConfigCompositionException, OverrideParseException, ...
        raise ConfigComposeError(f"config overrides {all_overrides} do not compose: {e}") from e
    HydraConfig.instance().set_config(cfg)
    if run_dir is not None:
        _warn_if_env_changed(cfg, Path(run_dir))
    return cfg


def _warn_if_env_changed(cfg, run_dir: Path) -> None:
    from omegaconf import OmegaConf

    from rlkit.config import KEYS_ADDED_LATER, compat_table

    recorded = run_dir / ".hydra" / "config.yaml"
    if not recorded.is_file():
        return
    old = OmegaConf.load(recorded)
    if "env" not in old:
        return
    before = OmegaConf.to_container(old.env, resolve=False)
    now = OmegaConf.to_container(cfg.env, resolve=False)
    for key, value in KEYS_ADDED_LATER.items():  # a run recorded before the key existed drew what its default draws
        if key.startswith("env.") and isinstance(before, dict):
            before.setdefault(key[len("env."):], value)
    for key, value in compat_table("removed").items():  # a removed lever's key at the value that does what runs do now
        if key.startswith("env.") and isinstance(before, dict) and before.get(key[len("env."):], object()) == value:
            before.pop(key[len("env."):])
    if before != now:
        log.warning("env config differs from the one run %s used: %s (run) vs %s (now)", run_dir, before, now)


def node(cfg, key: str) -> dict[str, Any]:
    """A resolved config node as a plain dict (e.g. ``node(cfg, "policy")``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg[key], resolve=True)


def instantiate_env(cfg):
    """The EnvSpec of ``cfg.env`` (rlkit.run.instantiate_plugin: bad keys are a clear ConfigError)."""
    from rlkit.plugins import instantiate_plugin

    return instantiate_plugin(cfg.env, "env")
