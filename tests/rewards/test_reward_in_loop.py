"""The training loop enforces the reward's time limit: a hung reward ends the run with a clear error,
or with reward.on_error=zero counts as 0 (reward/failures) and the run completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rlkit.types import RewardOutput

ROOT = Path(__file__).resolve().parents[2]


class Hang:
    """A reward stuck forever on every episode with an even seed."""

    name = "hang"

    def __call__(self, episode):
        if episode.seed % 2 == 0:
            time.sleep(3600)
        return RewardOutput(1.0)


def _train(tmp_path, name, *overrides):
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    out = tmp_path / name
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "logger=console",
                           "sft.enabled=false", "grounding.enabled=false",  # the loop is what is tested: no builds
                           "reward._target_=tests.rewards.test_reward_in_loop.Hang", "reward.timeout_s=0.5",
                           *overrides, f"hydra.run.dir={out}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    return proc, out


def test_hung_reward_in_the_loop(tmp_path):
    proc, out = _train(tmp_path, "zero", "reward.on_error=zero")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    failures = [s["reward/failures"] for s in steps if "reward/failures" in s]
    assert len(failures) == 2 and sum(failures) > 0  # counted, and the run went on
    proc, out = _train(tmp_path, "raise", "reward.on_error=raise")
    assert proc.returncode != 0
    error = (out / "error.txt").read_text()
    assert "reward 'hang' on episode seed" in error and "did not return within its limit of 0.5 s" in error
