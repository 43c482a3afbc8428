"""Composing configs for the backend tests (Hydra's compose API, as train.py would compose them)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

import rlkit.config  # noqa: F401  (registers the typed schema)

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose_cfg(overrides: list[str]):
    """The composed config with its hydra node, set as the current Hydra config (job overrides)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def compose_config():
    return compose_cfg
