"""One run per run folder: a second run is refused while the first lives; a killed run's lock is free."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import run_lock
from rlkit.run_lock import LOCK_FILE, RunFolderBusyError

ROOT = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from rlkit import run_lock
run_lock.acquire({folder!r})
print("locked", flush=True)
time.sleep(600)
"""


def _holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), folder=str(folder))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_holder_is_refused_and_a_killed_holder_frees_the_folder(tmp_path):
    folder = tmp_path / "run"
    proc = _holder(folder)
    try:
        with pytest.raises(RunFolderBusyError, match=rf"{folder} is in use by another run \(pid {proc.pid} on .*hydra.run.dir"):
            run_lock.acquire(folder)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with run_lock.locked(folder):  # the OS released the killed process's lock
        with run_lock.locked(folder):  # re-entrant in one process
            pass
        assert f'"pid": {os.getpid()}' in (folder / LOCK_FILE).read_text()
    proc2 = _holder(folder)  # and this process released it again
    proc2.kill()
    proc2.wait()


def test_train_refuses_a_folder_in_use_before_touching_it(tmp_path):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("the first run's config\n")
    proc = _holder(folder)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"))
        t0 = time.time()
        out = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "logger=console",
                              f"hydra.run.dir={folder}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"[rlkit] the run folder {folder} is in use by another run (pid {proc.pid}" in out.stderr
    assert "Traceback" not in out.stderr and time.time() - t0 < 120
    assert (folder / ".hydra" / "config.yaml").read_text() == "the first run's config\n"  # untouched
    assert not (folder / "error.txt").exists() and not (folder / "metrics.jsonl").exists()
