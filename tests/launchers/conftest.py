"""Fixtures for the launcher tests: one private local Ray cluster per test session, and a helper
that runs a Hydra multirun in a subprocess the way a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launchers.ray_cluster import LocalRayCluster, cluster_env, start_cluster

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).resolve().parent / "app" / "sweep_app.py"


@pytest.fixture(scope="session")
def ray_cluster() -> LocalRayCluster:
    """A 2-CPU Ray head on 127.0.0.1 with free ports, RAY_AUTH_MODE=disabled; stopped by process id."""
    cluster = start_cluster(num_cpus=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Sweep:
    returncode: int
    stdout: str
    stderr: str
    sweep_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_sweep(script: Path, args: list[str], cwd: Path, sweep_dir: Path, env_extra: dict[str, str] | None = None,
              timeout: float = 240) -> Sweep:
    """``python <script> -m <args> hydra.sweep.dir=<sweep_dir>`` in ``cwd``; never raises on failure."""
    env = cluster_env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="0")
    env.pop("WANDB_API_KEY", None)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, str(script), "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return Sweep(proc.returncode, proc.stdout, proc.stderr, sweep_dir)


@pytest.fixture
def sweep_runner():
    return run_sweep
