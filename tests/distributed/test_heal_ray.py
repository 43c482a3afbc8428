"""Fault injection on the default backend (native_ray_ddp: 2 trainer ranks, 2 rollout workers): a short smoke run
whose rollout worker, trainer rank or driver is SIGKILLed at a seeded random step ends complete, with every
logged value except timings equal to an uninterrupted run's. A lost worker heals inside the job
(trainer.max_failures); a lost driver is rerun by hand (what a launcher's resubmission does) and resumes.

Slow (a few minutes a case: two Ray runs each): ``scripts/test.sh -m slow tests/distributed/test_heal_ray.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
BASE = ["experiment=smoke", "backend=native_ray_ddp", f"steps={STEPS}", "eval.num_tasks=2", "logger=console",
        "trainer.ckpt_interval=2"]
#: (what is killed, the ps pattern of its process, the step after which it is killed): seeded random points
CASES = [(kind, pattern, random.Random(f"heal-{kind}").randint(1, STEPS - 1))
         for kind, pattern in (("rollout worker", "ray::RolloutWorker"), ("trainer rank", "ray::TrainerWorker"),
                               ("driver", "train.py"))]


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, RLKIT_CACHE_DIR=str(cache), WANDB_MODE="offline", RAY_AUTH_MODE="disabled",
               PYTHONPATH=str(ROOT))
    for k in ("RLKIT_CRASH_AT", "WANDB_API_KEY", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    return env


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and not k.endswith("_s")} for r in rows]


def _steps_logged(out: Path) -> list:
    m = out / "metrics.jsonl"
    return [json.loads(ln).get("trainer/step") for ln in m.read_text().splitlines()] if m.is_file() else []


def _run(out: Path, cache: Path, kill: tuple[str, int] | None = None) -> tuple[int, str]:
    """train.py on BASE into ``out``; with ``kill`` = (ps pattern, step), SIGKILL the first process matching the
    pattern once the step's row is logged. Returns (exit code, output)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *BASE, f"hydra.run.dir={out}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill is not None:
        pattern, step = kill
        deadline = time.time() + 900
        while proc.poll() is None and time.time() < deadline:
            if step in _steps_logged(out):
                ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
                pids = [int(ln.split()[0]) for ln in ps
                        if pattern in ln and (pattern != "train.py" or str(out) in ln)]
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    break
            time.sleep(0.2)
    out_text = proc.communicate(timeout=1200)[0]
    return proc.returncode, out_text


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = tmp_path_factory.mktemp("heal_cache")
    out = tmp_path_factory.mktemp("heal") / "ref"
    rc, text = _run(out, cache)
    assert rc == 0, text[-4000:]
    return cache, _rows(out)


@pytest.mark.slow
@pytest.mark.parametrize("kind,pattern,step", CASES, ids=[c[0].replace(" ", "_") for c in CASES])
def test_a_killed_process_leaves_the_run_complete_and_exact(reference, tmp_path, kind, pattern, step):
    cache, ref = reference
    out = tmp_path / "run"
    rc, text = _run(out, cache, kill=(pattern, step))
    if kind == "driver":  # nothing in the job survives its driver: the rerun (a launcher's resubmission) resumes
        assert rc != 0
        rc, text = _run(out, cache)
        assert "resuming from" in text, text[-3000:]
    else:
        assert "restarting the workers and going on from step" in text, text[-4000:]
    assert rc == 0, text[-4000:]
    assert _rows(out) == ref  # one row per step (eval before, STEPS steps, final eval), values as uninterrupted
