"""One run per run folder: an exclusive lock on ``<run dir>/.rlkit_run.lock`` for the run's life.

Two runs writing one folder interleave metrics.jsonl, start two W&B runs and overwrite each other's
checkpoints. The lock is an ``fcntl.flock`` on the lock file, held by the process that runs the job
(the Hydra callback ``RunLockCallback`` takes it before Hydra writes ``.hydra/`` into the folder;
``rlkit.run.run`` takes it again for launchers that call it directly). A lock belongs to an open
file, so the operating system releases it when the process ends in any way, SIGKILL included: a
lock left by a killed run is simply free for the next one. The file records the holder (pid, host,
start time) for the error message.

Filesystems without flock support (some network mounts) get a logged warning and no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from rlkit.errors import ConfigError

LOCK_FILE = ".rlkit_run.lock"

log = logging.getLogger(__name__)
_held: dict[str, list[Any]] = {}  # realpath of the folder -> [fd, holders in this process]
_mutex = threading.Lock()


class RunFolderBusyError(ConfigError):
    """Another live process holds the run folder's lock."""


def acquire(folder: str | Path) -> None:
    """Take the lock on ``folder`` (created if missing); re-entrant within one process.

    Raises:
        RunFolderBusyError: another process holds it (names the folder, the holder and the fix).
    """
    folder = Path(folder)
    key = os.path.realpath(folder)
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                log.warning("cannot lock the run folder %s (%s); a second run in this folder would not be "
                            "refused", folder, e)
                _held[key] = [None, 1]
                return
            holder = _describe_holder(fd)
            os.close(fd)
            raise RunFolderBusyError(
                f"the run folder {folder} is in use by another run ({holder}); wait for it to end, or give this "
                "run its own folder (hydra.run.dir=... / hydra.sweep.dir=...). A run that was killed holds no "
                "lock: its folder is free again as soon as its process is gone"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        _held[key] = [fd, 1]


def release(folder: str | Path) -> None:
    """Drop one hold on ``folder``'s lock; the last one unlocks it (the lock file stays)."""
    key = os.path.realpath(folder)
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            if entry[0] is not None:
                os.close(entry[0])  # closing the only descriptor of the open file releases the flock


@contextlib.contextmanager
def locked(folder: str | Path) -> Iterator[None]:
    """``acquire(folder)`` for the body of the ``with``; see ``acquire`` for what it raises."""
    acquire(folder)
    try:
        yield
    finally:
        release(folder)


def _describe_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except Exception:  # noqa: BLE001 - only for the message
        return "holder unknown"


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a dependency; the lock itself does not need it
    Callback = object  # type: ignore[misc,assignment]


class RunLockCallback(Callback):  # type: ignore[misc]
    """Hydra callback: lock ``hydra.run.dir`` (single run) or ``hydra.sweep.dir`` (multirun) before
    Hydra writes ``.hydra/`` there, so a refused second run changes nothing in the folder.

    A refusal prints one ``[rlkit] ...`` line to stderr and exits with status 1.
    """

    def _take(self, config: Any, key: str) -> None:
        import sys

        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        try:
            HydraConfig.instance().set_config(config)  # so ${hydra:...} in the folder name resolves
            folder = OmegaConf.select(config, key)
        except Exception as e:  # noqa: BLE001 - rlkit.run.run still locks the job's folder
            log.debug("run lock: cannot resolve %s before the run (%s)", key, e)
            return
        try:
            acquire(folder)
        except RunFolderBusyError as e:
            print(f"[rlkit] {e}", file=sys.stderr)
            sys.exit(1)
        self._folder = folder

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._take(config, "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._take(config, "hydra.sweep.dir")

    def _drop(self) -> None:
        folder = getattr(self, "_folder", None)
        if folder is not None:
            release(folder)
            self._folder = None

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        self._drop()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self._drop()
