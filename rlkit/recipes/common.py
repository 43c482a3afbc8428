"""Small pieces every recipe uses: seeding the global RNGs, the run's name and sweep group for the loggers."""

from __future__ import annotations

import random

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig

from rlkit.run_folder import rerun_overrides, sweep_group_name


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs with the run's ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_name() -> str:
    """The job's Hydra overrides joined by commas: its task overrides after the ``hydra.searchpath`` it was given
    (rlkit.run_folder.rerun_overrides), so they rerun it ("default" without any; "run" outside a Hydra job)."""
    try:
        overrides = HydraConfig.get().overrides
    except ValueError:
        return "run"
    return ",".join(rerun_overrides(overrides.task, overrides.hydra)) or "default"


def sweep_group() -> str | None:
    """The sweep's group in a multirun (``rlkit.run_folder.sweep_group_name``: ``sweep-<date>_<time>`` for
    Hydra's default sweep folder; the loggers group a sweep's jobs by it), else None."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    if str(hc.mode) == "RunMode.MULTIRUN":
        return sweep_group_name(hc.sweep.dir)
    return None
