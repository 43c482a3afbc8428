"""Start and stop a private local Ray cluster for the launcher tests.

The cluster runs under its own ``--temp-dir`` with free ports for every fixed-port service, so it
does not collide with other Ray clusters on the machine. It is stopped by process id: the
``ray start --block`` leader gets SIGTERM (Ray's shutdown hook then stops its raylet, GCS and
dashboard), any process whose command line still names this cluster's temp dir is killed, and the
temp dir is removed.
``ray stop --force`` is deliberately not used: it kills every Ray process of the machine, including
clusters other people started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes that talk to the test cluster.

    RAY_AUTH_MODE=disabled: Ray 2.60 accepts "disabled" and "token"; the test cluster runs without
    token auth, and the client must agree. RAY_ADDRESS / RAY_API_SERVER_ADDRESS are removed because
    Ray's JobSubmissionClient lets them override the address it is given.
    """
    env = dict(os.environ if base is None else base)
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_API_SERVER_ADDRESS", None)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


@dataclass
class LocalRayCluster:
    dashboard_url: str
    temp_dir: Path
    proc: subprocess.Popen
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        deadline = time.time() + 10
        while True:
            left = pids_naming(str(self.temp_dir))
            if not left or time.time() > deadline:
                break
            time.sleep(0.5)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # session logs; job logs are in the sweep folders


def pids_naming(needle: str) -> list[int]:
    """Process ids (of this user) whose command line contains ``needle``."""
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if d.stat().st_uid != os.getuid():
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            out.append(int(d.name))
    return out


def start_cluster(num_cpus: int = 2, timeout_s: float = 120.0) -> LocalRayCluster:
    """``ray start --head --block`` on 127.0.0.1 with free ports; returns once the Jobs API answers.

    Raises: RuntimeError with the tail of ``ray start``'s output when the dashboard does not answer
    within ``timeout_s`` seconds.
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="rlk-ray-", dir="/tmp"))
    dash = free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray_bin, "start", "--head", "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={free_port()}",
        f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--num-cpus={num_cpus}", "--num-gpus=0",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    log_path = temp_dir / "ray_start.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=cluster_env(),
                            start_new_session=True)
    cluster = LocalRayCluster(f"http://127.0.0.1:{dash}", temp_dir, proc, log_path)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{cluster.dashboard_url}/api/version", timeout=2) as r:
                if r.status == 200:
                    return cluster
        except OSError:
            pass
        time.sleep(1)
    cluster.stop()
    raise RuntimeError(f"local Ray cluster did not come up in {timeout_s:.0f} s:\n"
                       + log_path.read_text()[-3000:])
