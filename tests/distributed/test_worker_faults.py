"""A bug is not a lost worker (issue 74), on Ray: train.py on backend=native_ray (1 trainer rank, 1 rollout
worker) with an env that misbehaves only inside the rollout worker (tests/distributed/faulty_env.py).

- An env whose step() raises RuntimeError stops the run at once: no restart, and the run's last line is
  "[rlkit] worker error: ..." with that error's message, the env's frame that raised it and the contract it broke.
- A rollout worker killed during the evaluation before training (step 0) heals: the run restarts the workers from
  the step-0 checkpoint and completes with the rows an uninterrupted run logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.faulty_env import MESSAGE

ROOT = Path(__file__).resolve().parents[2]
BASE = ["experiment=smoke", "backend=native_ray", "steps=1", "eval.num_tasks=2", "logger=console",
        "grounding.enabled=false", "sft.enabled=false", "trainer.quiet=true"]
FAULTY = "env._target_=tests.distributed.faulty_env.FaultyMaze"


def _run(out: Path, cache: Path, *extra: str) -> tuple[int, str]:
    env = dict(os.environ, RLKIT_CACHE_DIR=str(cache), WANDB_MODE="offline", RAY_AUTH_MODE="disabled",
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for k in ("RLKIT_CRASH_AT", "WANDB_API_KEY", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *BASE, *extra, f"hydra.run.dir={out}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and not k.endswith("_s")} for r in rows]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("faults_cache")


@pytest.mark.slow
def test_a_deterministic_error_in_a_rollout_workers_env_stops_the_run_without_a_restart(tmp_path, cache):
    out = tmp_path / "run"
    rc, text = _run(out, cache, FAULTY, "+env.fault=raise")
    assert rc == 1, text[-4000:]
    assert "restarting the workers" not in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    # the rollout names the env's episode class and the contract it broke (rlkit.env_check.step_error)
    assert last.startswith("[rlkit] worker error: RolloutWorker.evaluate raised EnvContractError: "), last
    assert f"step raised RuntimeError: {MESSAGE}" in last and "must not raise on malformed model output" in last, last
    assert "faulty_env.py" in last and "in faulty_step" in last, last  # the env's frame that raised
    assert (out / "error.txt").read_text().startswith("WorkerError: ")  # what the launchers read: not resubmitted


@pytest.mark.slow
def test_a_rollout_worker_killed_during_the_step0_evaluation_heals(tmp_path, cache):
    ref = tmp_path / "ref"
    rc, text = _run(ref, cache)
    assert rc == 0, text[-4000:]
    out = tmp_path / "run"
    marker = tmp_path / "killed"
    rc, text = _run(out, cache, FAULTY, "+env.fault=die_once", f"+env.marker={marker}")
    assert rc == 0, text[-4000:]
    assert marker.is_file()  # a rollout worker did die
    assert "at step 0: restarting the workers and going on from step 0" in text, text[-4000:]
    assert _rows(out) == _rows(ref)  # eval before training, 1 step, the final eval: as uninterrupted
