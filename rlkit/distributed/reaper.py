"""A local Ray instance must not outlive the run that started it.

``ray.init(address="local")`` starts the GCS, the raylet and their agents (dashboard agent, runtime
env agent, log monitor, workers) as processes of their own. ``ray.shutdown()`` stops them, but a
driver killed with SIGKILL never calls it, and the agents were seen alive over a minute later. So
``start_reaper`` launches this module as a tiny watchdog in its own session: it waits for the
driver's pid to end, then stops every process of that Ray session (their command line names the
session; their descendants, e.g. workers that renamed themselves "ray::...", go too): SIGTERM,
then SIGKILL after ``grace_s``. After a clean ``ray.shutdown()`` the caller stops the watchdog.

    python -m rlkit.distributed.reaper <driver pid> <session name> [grace_s]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def session_processes(session_name: str, exclude: set[int] = frozenset()) -> list[int]:
    """Pids whose command line contains ``session_name``, plus all their descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    roots: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        try:
            stat = (d / "stat").read_text()
            parents[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])
            if session_name.encode() in (d / "cmdline").read_bytes():
                roots.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return sorted(found - set(exclude) - {os.getpid()})


def terminate(pids: list[int], grace_s: float = 3.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``grace_s`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (another user's process counts as alive)."""
    return _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] == "Z"
    except (OSError, IndexError):
        return False


def start_reaper(session_name: str, driver_pid: int | None = None, grace_s: float = 3.0) -> subprocess.Popen:
    """Launch the watchdog for ``session_name`` (see the module doc); returns its Popen (terminate it
    after a clean ``ray.shutdown()``). It runs in its own session, so a signal to the driver's
    process group does not reach it."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-m", "rlkit.distributed.reaper", str(driver_pid or os.getpid()), session_name, str(grace_s)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/<pid>/stat field 22): tells a pid reused by
    another process from the one remembered."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, IndexError):
        return None


def main(argv: list[str]) -> int:
    driver, session = int(argv[0]), argv[1]
    grace = float(argv[2]) if len(argv) > 2 else 3.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the driver shut Ray down itself
    # Remember the session's processes while the driver lives: when it is killed, the raylet may
    # exit first and its agents (ray::DashboardAgent, ray::RuntimeEnvAgent: renamed, so their
    # command line no longer names the session) are re-parented out of the session's tree.
    seen: dict[int, str | None] = {}
    me = {os.getpid()}
    while _alive(driver):
        for pid in session_processes(session, me):
            seen.setdefault(pid, _start_time(pid))
        time.sleep(0.5)
    for pid in session_processes(session, me):
        seen.setdefault(pid, _start_time(pid))
    terminate([p for p, t in seen.items() if _alive(p) and _start_time(p) == t], grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
