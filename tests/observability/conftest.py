"""Shared runs for the observability tests: one smoke run (W&B offline + TensorBoard) and one
2-job smoke sweep, each made once per test session (a smoke job takes ~10-60 s on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def train_env(tmp: Path) -> dict[str, str]:
    """Environment for train.py subprocesses: W&B offline with its staging area in ``tmp``, the SFT
    cache shared by the session's runs, no Ray address inherited."""
    env = dict(os.environ)
    env.pop("WANDB_API_KEY", None)
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_JOB_CONFIG_JSON_ENV_VAR"):
        env.pop(k, None)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DATA_DIR=str(tmp / "wandb-data"),
               WANDB_CACHE_DIR=str(tmp / "wandb-cache"), WANDB_CONFIG_DIR=str(tmp / "wandb-config"),
               RLKIT_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    return env


def run_train(args: list[str], tmp: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp, env=train_env(tmp),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"train.py {args} failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc


@dataclass
class SmokeRun:
    out: Path
    tmp: Path
    stdout: str


@pytest.fixture(scope="session")
def obs_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("observability")


def has_tensorboard() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="session")
def smoke_run(obs_tmp) -> SmokeRun:
    """experiment=smoke with logger=multi (W&B offline + TensorBoard when installed), progress lines on."""
    out = obs_tmp / "run"
    no_tb = [] if has_tensorboard() else ["~logger.loggers.tensorboard"]
    proc = run_train(["experiment=smoke", "logger=multi", *no_tb, "trainer.quiet=false",
                      "logger.loggers.wandb.project=rlkit-obs-test", "logger.loggers.wandb.tags=[obs,smoke]",
                      "logger.loggers.wandb.name=obs-smoke", f"hydra.run.dir={out}"], obs_tmp)
    return SmokeRun(out=out, tmp=obs_tmp, stdout=proc.stdout)


@pytest.fixture(scope="session")
def smoke_sweep(obs_tmp) -> Path:
    """The 2-job smoke sweep of the README (logger=console)."""
    sweep = obs_tmp / "sweep"
    run_train(["experiment=smoke", "logger=console", "-m", "lr=1e-5,3e-5", f"hydra.sweep.dir={sweep}"], obs_tmp)
    return sweep
