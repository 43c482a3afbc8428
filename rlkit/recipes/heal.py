"""Healing a run that lost a worker: which failures count as a lost worker, and the errors that end a run which
cannot (or must not) heal.

A rollout worker or trainer rank that dies (its process killed, out of memory, its node gone) or hangs (no
answer within ``backend.call_timeout_s``) is a lost worker. The recipe then tears the worker group down, starts a
new one and goes on from the latest checkpoint, up to ``trainer.max_failures`` times (the shape of Ray Train's
``FailureConfig(max_failures)`` and TorchElastic's restarts), exactly: a checkpoint holds every RNG state, so the
healed run logs what an uninterrupted run logs. Past the limit the run stops with ``WorkerLostError``, whose
message says what died and from which step a rerun of the same command resumes.

Anything else a worker raises is a bug or a bad value, whatever its class (a RuntimeError from a shape mismatch
or CUDA out of memory, an OSError from a missing file, a SyncError): replaying it from a checkpoint would only
raise it again, so the run stops at once with ``WorkerError`` (its own message and the worker's last frame), and
the Ray Jobs launchers do not resubmit it (launchers/ray_jobs/records.py, ``REFUSED``). A collective broken by a dead
peer also surfaces as a RuntimeError in the surviving ranks: that one is told apart by asking Ray whether a peer
of the group is gone (``RayExecutor.dead_workers``), never by the exception's class.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from rlkit import checkpoint as ckpt
from rlkit import resume

T = TypeVar("T")


class WorkerLostError(RuntimeError):
    """A run stopped because it lost a worker more often than ``trainer.max_failures`` allows; the message names
    the worker, the step, and the step a rerun of the same command resumes from."""


class WorkerError(RuntimeError):
    """A worker raised an error that is not a lost worker (a bug, a bad value, a full disk): the run stops at once
    without a restart. The message: which worker call, the error's class and first line, and the worker traceback's
    last frame (file:line in function)."""


#: the ``File "...", line N, in f`` lines of a formatted traceback
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
#: the "ray::RolloutWorker.evaluate()" header of a RayTaskError's text, and terminal colour codes
_FUNCTION = re.compile(r"ray::([\w.]+)\(")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def lost_worker(exc: BaseException, dead_workers: Callable[[], list[str]] | None = None) -> str | None:
    """What was lost when ``exc`` says a Ray worker died or hung, in words ("a worker died: ..."), or None for any
    other failure (a bug, a bad value: healing would only repeat it).

    Lost: Ray's actor and worker deaths (RayActorError and its ActorDiedError, WorkerCrashedError, NodeDiedError,
    ActorUnavailableError, OwnerDiedError, LocalRayletDiedError), a call of the workers that timed out
    (rlkit.distributed.runtime.WorkersHungError: ``backend.call_timeout_s`` passed; Ray's GetTimeoutError), and an
    error raised inside a worker (RayTaskError) while ``dead_workers()`` names a worker of the group that is gone
    (a collective broken by a dead rank raises in the ranks still alive). A RayTaskError is checked first: Ray makes
    it an instance of its cause's class too, so a TimeoutError raised in a worker is that worker's error, not a
    hang. Without ``dead_workers`` no RayTaskError is a lost worker; without Ray installed nothing is.
    """
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    from rlkit.distributed.runtime import WorkersHungError

    if isinstance(exc, rex.RayTaskError):
        dead = dead_workers() if dead_workers is not None else []
        if not dead:
            return None
        return (f"a worker's peer died ({', '.join(dead)} gone; the call failed with "
                f"{_cause_name(exc)}: {_first_line(_cause(exc))})")
    deaths = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ActorUnavailableError,
              rex.OwnerDiedError, rex.LocalRayletDiedError)
    if isinstance(exc, deaths):
        return f"a worker died ({type(exc).__name__}: {_first_line(exc)})"
    if isinstance(exc, (WorkersHungError, rex.GetTimeoutError)):
        return f"a worker hung ({_first_line(exc)})"
    return None


def worker_error(exc: BaseException) -> WorkerError | None:
    """The ``WorkerError`` that stops a run for ``exc`` when it is an error raised inside a Ray worker (RayTaskError)
    and not a lost worker (``lost_worker`` said None), else None. Its message: "<function> raised <Class>:
    <first line> (at <file>:<line> in <function>)", the frame the last of the worker traceback's
    (RayTaskError.traceback_str, Ray 2.x)."""
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    if not isinstance(exc, rex.RayTaskError):
        return None
    # the instance Ray raises is a subclass of the cause's class whose attributes are the cause's: its text (the
    # "ray::Class.method()" header and the worker traceback) is what is left to read
    text = _ANSI.sub("", (getattr(exc, "traceback_str", None) or "") + "\n" + str(exc))
    frames = _FRAME.findall(text)
    where = f" (at {frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]})" if frames else ""
    named = _FUNCTION.search(text)
    func = named.group(1) if named else (getattr(exc, "function_name", None) or "a worker")
    return WorkerError(f"{func} raised {_cause_name(exc)}: {_first_line(_cause(exc))}{where}. Not a lost worker "
                       "(no worker of the group was found gone), so the run stops instead of replaying it from a "
                       "checkpoint; the full worker traceback is in the run folder's error.txt")


def lost_worker_or_raise(exc: Exception, executor: Any) -> str:
    """What was lost (``lost_worker``'s words) when ``exc`` is a lost worker of ``executor`` (one that ``heals``,
    asked through its ``dead_workers``); otherwise raises: the ``WorkerError`` of an error raised inside a worker
    (``worker_error``), else ``exc`` itself (an error of the driver)."""
    what = executor.heals and lost_worker(exc, executor.dead_workers)
    if what:
        return what
    bug = worker_error(exc)
    if bug is None:
        raise exc
    raise bug from exc


def healed(run: Callable[[], T], heal: Callable[[Path], None], executor: Any, ckpt_root: Path, max_failures: int,
           restart_wait_s: float, step: Callable[[], int], say: Callable[[str], Any]) -> T:
    """``run()``, healed: when it (or ``heal``) loses a worker of ``executor`` (``lost_worker_or_raise``), say so,
    ``heal(path)`` (a new worker group loaded with the latest checkpoint under ``ckpt_root``) and ``run()`` again,
    at most ``max_failures`` times. ``step()``: the step in progress, for the messages; ``restart_wait_s``:
    trainer.restart_wait_s, for the message (``heal`` waits).

    Raises: WorkerLostError past ``max_failures`` or with no checkpoint to go on from (its message names the step
    a rerun of the same command resumes from); WorkerError at once for any other error raised in a worker; any
    other error of ``run`` as it is."""
    failures, heal_from = 0, None
    while True:
        try:
            if heal_from is not None:
                heal(heal_from)
                heal_from = None
            return run()
        except Exception as e:
            what = lost_worker_or_raise(e, executor)
            failures += 1
            path = ckpt.find_latest(ckpt_root)
            at = resume.checkpoint_step(path) if path is not None else 0
            if failures > max_failures or path is None:
                raise WorkerLostError(f"{what} at step {step()}; trainer.max_failures={max_failures} spent. "
                                      f"Rerun the same command to resume from step {at} ({path})") from e
            say(f"{what} at step {step()}: restarting the workers and going on from step {at} ({path}; failure "
                f"{failures} of trainer.max_failures={max_failures}; the new group waits up to "
                f"trainer.restart_wait_s={restart_wait_s:g}s for its resources)")
            heal_from = path


class SentOnce:
    """A run's metrics rows, each written to metrics.jsonl and sent to the logger once: a healed run replays the
    steps after its checkpoint and writes their rows again (``rewind`` cut the file back), but sends only the rows
    past those already sent; a resumed run's logger matched its history to the file first (``sent = written``).

    ``written``: rows in metrics.jsonl; ``sent``: rows the logger has."""

    def __init__(self, metrics_file: Any):
        self.file = metrics_file
        self.written = self.sent = 0

    def log(self, logger: Any, metrics: dict[str, float], step: int) -> None:
        """A row to metrics.jsonl and, unless it replays one already sent, to ``logger``."""
        self.file.write(metrics, step)
        self.written += 1
        if self.written > self.sent:
            logger.log(metrics, step)
            self.sent = self.written

    def rewind(self, lines: int) -> None:
        """metrics.jsonl cut back to its first ``lines`` rows (a checkpoint's), the rows after them to be replayed."""
        self.written = lines
        self.file.truncate_lines(lines)


def start_worker_group(executor: Any, ctx: Any, wait_s: float, say: Callable[[str], Any], poll_s: float = 10.0) -> None:
    """Start a new worker group on ``executor`` (``executor.start(ctx, wait_s=...)``), waiting up to ``wait_s``
    seconds in all (``trainer.restart_wait_s``) for its resources, as a replacement node still joining needs: each
    try waits at most the executor's ``settings.startup_timeout_s``, and a try that times out
    (rlkit.distributed.runtime.PlacementGroupTimeout) is said (``say``: what the group asked for and what the
    cluster has) and tried again after ``poll_s`` seconds.

    Raises: WorkerLostError when ``wait_s`` is spent (a rerun of the same command resumes from the latest
    checkpoint); any other error of ``executor.start`` as it is.
    """
    from rlkit.distributed.runtime import PlacementGroupTimeout

    deadline = time.monotonic() + wait_s
    per_try = getattr(getattr(executor, "settings", None), "startup_timeout_s", wait_s)
    while True:
        left = max(deadline - time.monotonic(), 0.0)
        try:
            executor.start(ctx, wait_s=min(per_try, left))
            return
        except PlacementGroupTimeout as e:
            executor.shutdown()
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerLostError(f"the new worker group's resources did not appear within "
                                      f"trainer.restart_wait_s={wait_s:g}s: {e}. Rerun the same command to resume "
                                      "from the latest checkpoint once the cluster has them") from e
            say(f"waiting for the new worker group's resources ({left:.0f}s left of "
                f"trainer.restart_wait_s={wait_s:g}): {e}")
            time.sleep(min(poll_s, left))


def _cause(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _cause_name(exc: BaseException) -> str:
    return type(_cause(exc)).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
