"""A local Ray instance does not outlive the driver that started it, even after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlkit.distributed.reaper import _alive, session_processes

from .conftest import RAY_ENV

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys, time
sys.path.insert(0, {root!r})
import ray
from rlkit.distributed.runtime import RaySettings, init_ray
init_ray(RaySettings(address=None, num_workers=1, num_rollout_workers=0, num_cpus=1))

@ray.remote
class Actor:
    def ping(self):
        return 1

a = Actor.remote()
ray.get(a.ping.remote())
print(ray.get_runtime_context().gcs_address, ray._private.worker.global_worker.node.session_name, flush=True)
time.sleep(600)
"""


def test_local_ray_processes_end_after_the_driver_is_killed():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")} | RAY_ENV
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT))], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = driver.stdout.readline().split()
        assert len(line) == 2, "the driver did not start Ray"
        session = line[1]
        pids = session_processes(session)  # gcs, raylet, agents, the actor's worker, ...
        assert len(pids) >= 3
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        t0 = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - t0 < 60:
            time.sleep(0.25)
        left = [p for p in pids if _alive(p)]
        took = time.monotonic() - t0
        assert left == [] and took < 15, f"Ray processes of {session} alive {took:.0f} s after the driver's kill -9: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
