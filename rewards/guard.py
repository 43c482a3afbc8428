"""Running reward plug-ins safely: clear errors naming the reward and the episode.

``safe_call(fn, episode, timeout_s, on_error)`` calls one reward; ``GuardedReward`` wraps a reward
once (for the core) and counts failures. Both are thread-safe (the counter takes a lock).

Time limit: measured, not enforced. The call runs to completion in the calling thread and, if it
took longer than ``timeout_s``, that is reported afterwards as a ``RewardTimeoutError`` (or as a
counted failure with reward 0). Interrupting Python code in-process is not reliable (a thread
cannot be killed), and rewards are meant to be pure and fast; a hung reward therefore hangs the
caller, and the fix is in the reward.
"""

from __future__ import annotations

import math
import threading
import time

from rlkit.types import Episode, RewardFn, RewardOutput

ON_ERROR = ("raise", "zero")


class RewardError(RuntimeError):
    """A reward function raised, returned a non-finite or non-RewardOutput value, or was too slow."""


class RewardTimeoutError(RewardError):
    """A reward function took longer than its time limit (measured after it returned)."""


class FailureCounter:
    """Thread-safe count of reward failures, with the last error message."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.last_error: str | None = None

    def add(self, message: str) -> None:
        with self._lock:
            self.count += 1
            self.last_error = message


def _reward_name(fn) -> str:
    return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__)


def safe_call(
    fn: RewardFn,
    episode: Episode,
    timeout_s: float | None = None,
    on_error: str = "raise",
    failures: FailureCounter | None = None,
) -> RewardOutput:
    """``fn(episode)`` with failures turned into clear errors.

    Args:
        fn: the reward plug-in.
        episode: the finished episode.
        timeout_s: time limit in seconds (None: no limit), checked after the call returns.
        on_error: "raise" -> raise ``RewardError`` / ``RewardTimeoutError`` naming the reward and
            the episode seed; "zero" -> return ``RewardOutput(0.0)`` and count the failure in
            ``failures``.
        failures: where "zero" failures are counted (optional).

    Raises:
        RewardError, RewardTimeoutError: with on_error="raise".
        ValueError: bad ``on_error`` or ``timeout_s``.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds or None, got {timeout_s!r}")
    name = _reward_name(fn)
    where = f"reward {name!r} on episode seed {episode.seed}"
    error: RewardError | None = None
    t0 = time.perf_counter()
    try:
        out = fn(episode)
    except Exception as e:
        error = RewardError(f"{where} raised {type(e).__name__}: {e}")
        error.__cause__ = e
    else:
        elapsed = time.perf_counter() - t0
        if not isinstance(out, RewardOutput):
            error = RewardError(f"{where} returned {type(out).__name__}, expected RewardOutput")
        elif not math.isfinite(float(out.total)):
            error = RewardError(f"{where} returned a non-finite total {out.total!r}")
        elif timeout_s is not None and elapsed > timeout_s:
            error = RewardTimeoutError(
                f"{where} took {elapsed:.3f} s, over its limit of {timeout_s} s "
                "(measured after the call returned; it is not interrupted)"
            )
    if error is None:
        return out
    if on_error == "raise":
        raise error
    if failures is not None:
        failures.add(str(error))
    return RewardOutput(0.0, {})


class GuardedReward:
    """A reward wrapped with ``safe_call``; same ``name``, failures counted in ``self.failures``.

    Args: fn, timeout_s, on_error: as in ``safe_call``.
    """

    def __init__(self, fn: RewardFn, timeout_s: float | None = None, on_error: str = "raise"):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.fn = fn
        self.name = _reward_name(fn)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.failures = FailureCounter()

    def __call__(self, episode: Episode) -> RewardOutput:
        return safe_call(self.fn, episode, self.timeout_s, self.on_error, self.failures)
