"""Validate a compiled job with SkyRL's own structured config (``skyrl.train.config``).

SkyRL builds its config strictly: every key must be a field of its dataclasses
(``build_nested_dataclass`` -> ``validate_dict_keys_against_dataclass``), so an override SkyRL does
not know fails here, on the machine that composes the config, not on the cluster.

Two levels, depending on what imports:

- "full": ``SkyRLTrainConfig.from_dict_config`` (what SkyRL's entry points build), including its
  ``__post_init__``. That hook imports SkyRL's inference backend, which imports only on Python 3.12
  (a pydantic TypedDict rule), with the GPU extras installed.
- "sections": on Python 3.11 / without the GPU stack, the four sections (data, trainer, generator,
  environment) are built with SkyRL's ``build_nested_dataclass`` and the top-level keys are checked
  against ``SkyRLTrainConfig``; the compiled job sets explicitly every value the skipped
  ``__post_init__`` would fill in (max_input_length, algorithm.temperature, dataloader workers).

The SkyRL package itself (``pip install --no-deps skyrl==0.3.0 loguru`` suffices on CPU) is needed
for either; without it ``SkyRLNotInstalledError`` says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlkit.backends.skyrl.compile import SKYRL_VERSION, SkyRLConfigError

_SECTIONS = {"data": "DataConfig", "trainer": "TrainerConfig", "generator": "GeneratorConfig",
             "environment": "EnvironmentConfig"}


class SkyRLNotInstalledError(ImportError):
    """SkyRL's config module is not importable here."""


def skyrl_config_module() -> Any:
    """``skyrl.train.config.config``.

    Raises: SkyRLNotInstalledError naming the install command.
    """
    try:
        from skyrl.train.config import config as sc
    except Exception as e:  # ImportError, or a dependency failing at import time
        raise SkyRLNotInstalledError(
            f"SkyRL's config classes are not importable ({type(e).__name__}: {e}). On a GPU machine: "
            f"pip install 'rlkit[skyrl]' (Python 3.12, CUDA); to only check configs on CPU: "
            f"pip install --no-deps skyrl=={SKYRL_VERSION} loguru"
        ) from e
    return sc


def full_config_available() -> bool:
    """True when ``SkyRLTrainConfig.__post_init__``'s import of SkyRL's inference backend works."""
    try:
        import skyrl.backends.skyrl_train.inference_servers.utils  # noqa: F401
    except Exception:
        return False
    return True


@dataclasses.dataclass
class ValidatedConfig:
    """SkyRL's typed config of a job: ``typed`` (a ``SkyRLTrainConfig``, or a dict of the four typed
    sections at level "sections"), ``as_dict`` (every key with SkyRL's defaults filled in)."""

    level: str
    typed: Any
    as_dict: dict[str, Any]


def validate(config: dict[str, Any]) -> ValidatedConfig:
    """Build SkyRL's typed config from a compiled job's ``config`` mapping.

    Raises:
        SkyRLNotInstalledError: SkyRL's config module is missing.
        SkyRLConfigError: SkyRL rejects a key or value (its message included).
    """
    sc = skyrl_config_module()
    try:
        sc.validate_dict_keys_against_dataclass(sc.SkyRLTrainConfig, config)
        if full_config_available():
            from omegaconf import OmegaConf

            typed = sc.SkyRLTrainConfig.from_dict_config(OmegaConf.create(config))
            return ValidatedConfig("full", typed, dataclasses.asdict(typed))
        sections = {name: sc.build_nested_dataclass(getattr(sc, cls), config.get(name, {}))
                    for name, cls in _SECTIONS.items()}
    except (ValueError, TypeError, AssertionError) as e:
        raise SkyRLConfigError(f"SkyRL {SKYRL_VERSION} rejects the compiled config: {e}") from e
    return ValidatedConfig("sections", sections, {k: dataclasses.asdict(v) for k, v in sections.items()})
