"""Healing a run that lost a worker: which failures count as a lost worker, and the error that ends a run which
cannot heal.

A rollout worker or trainer rank that dies (its process killed, out of memory, its node gone) or hangs (no
answer within ``backend.call_timeout_s``) is a lost worker. The recipe then tears the worker group down, starts a
new one and goes on from the latest checkpoint, up to ``trainer.max_failures`` times (the shape of Ray Train's
``FailureConfig(max_failures)`` and TorchElastic's restarts), exactly: a checkpoint holds every RNG state, so the
healed run logs what an uninterrupted run logs. Past the limit the run stops with ``WorkerLostError``, whose
message says what died and from which step a rerun of the same command resumes.
"""

from __future__ import annotations

#: A trainer rank whose peer died fails its collective with one of these (gloo: "Connection closed by peer").
_PEER_FAILURES = (RuntimeError, ConnectionError, OSError)


class WorkerLostError(RuntimeError):
    """A run stopped because it lost a worker more often than ``trainer.max_failures`` allows; the message names
    the worker, the step, and the step a rerun of the same command resumes from."""


def lost_worker(exc: BaseException) -> str | None:
    """What was lost when ``exc`` says a Ray worker died or hung, in words ("a rollout worker died: ..."), or None
    for any other failure (a bug, a bad value: healing would only repeat it).

    Lost: Ray's actor and worker deaths (RayActorError and its ActorDiedError, WorkerCrashedError, NodeDiedError,
    ActorUnavailableError, OwnerDiedError), a call that timed out (TimeoutError, GetTimeoutError), and a task that
    failed because its peer died (RayTaskError whose cause is a RuntimeError / ConnectionError / OSError: a
    collective broken by a dead rank). Without Ray installed nothing is lost this way.
    """
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - ray is a dependency
        return None
    deaths = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ActorUnavailableError,
              rex.OwnerDiedError, rex.LocalRayletDiedError)
    if isinstance(exc, deaths):
        return f"a worker died ({type(exc).__name__}: {_first_line(exc)})"
    if isinstance(exc, (TimeoutError, rex.GetTimeoutError)):
        return f"a worker hung ({_first_line(exc)})"
    if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, _PEER_FAILURES):
        return f"a worker's peer died ({type(exc.cause).__name__}: {_first_line(exc.cause)})"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
