"""Running reward plug-ins safely: an enforced time limit and clear errors naming the reward and episode.

``safe_call(fn, episode, timeout_s, on_error)`` calls one reward; ``GuardedReward`` wraps a reward
once (for the core) and counts failures; ``instantiate_reward(node)`` builds the guarded reward of
a ``conf/reward/*.yaml`` node. All are thread-safe.

The guard keys of a reward node (read by the core, not passed to the reward's constructor):

    timeout_s: 60      seconds one call may take (> 0); default DEFAULT_TIMEOUT_S
    on_error: raise    raise: stop the run with a RewardError naming the reward, the episode seed and
                       the fix; zero: count the episode's reward as 0, log the error (rlkit logger,
                       warning) and count it (metric reward/failures)

Time limit: enforced. The call runs in a daemon worker thread and the caller waits at most
``timeout_s``; a call still running then is abandoned (the caller goes on, the stuck thread is
left to finish or hang in the background without blocking the process's exit) and a
``RewardTimeoutError`` is raised or counted. Each calling thread keeps one worker, so the cost of a
call is a queue hand-off (~20 us), not a thread start. A reward stuck in C code that holds the GIL
cannot be abandoned this way; rewards are meant to be pure Python and fast.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Any, Callable

from rlkit.types import Episode, RewardFn, RewardOutput

ON_ERROR = ("raise", "zero")
#: Seconds a reward call may take when the reward config sets no ``timeout_s``.
DEFAULT_TIMEOUT_S = 60.0
#: Keys of a reward config node that configure the guard (not the reward itself).
GUARD_KEYS = ("timeout_s", "on_error")

log = logging.getLogger("rlkit.reward")


class RewardError(RuntimeError):
    """A reward function raised, returned a non-finite or non-RewardOutput value, or was too slow."""


class RewardTimeoutError(RewardError):
    """A reward function did not return within its time limit (the call was abandoned)."""


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


class _Worker:
    """One daemon thread that runs calls one at a time (see the module doc)."""

    def __init__(self) -> None:
        self.stuck = False  # a call timed out and may still be running: use another worker
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="rlkit-reward", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, arg, box, done = self._jobs.get()
            try:
                box.append((True, fn(arg)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))
            done.set()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> tuple[bool, Any] | None:
        """(True, result) or (False, exception); None when ``fn`` did not return in ``timeout_s``."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._jobs.put((fn, arg, box, done))
        if done.wait(timeout_s):
            return box[0]
        self.stuck = True
        return None


def _reward_name(fn) -> str:
    return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__)


def _check_args(timeout_s: float | None, on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s > 0 or not math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a number of seconds > 0 or None, got {timeout_s!r}")


def safe_call(
    fn: RewardFn,
    episode: Episode,
    timeout_s: float | None = None,
    on_error: str = "raise",
    failures: FailureCounter | None = None,
    worker: _Worker | None = None,
) -> RewardOutput:
    """``fn(episode)`` with failures turned into clear errors, within a time limit.

    Args:
        fn: the reward plug-in.
        episode: the finished episode.
        timeout_s: time limit in seconds (None: no limit, the call runs in the caller's thread).
            With a limit the call runs in a worker thread and is abandoned when the limit passes.
        on_error: "raise" -> raise ``RewardError`` / ``RewardTimeoutError`` naming the reward, the
            episode seed and the fix; "zero" -> log the error, count it in ``failures`` and return
            ``RewardOutput(0.0)``.
        failures: where "zero" failures are counted (optional).
        worker: the worker thread to use (GuardedReward keeps one per calling thread); None: a
            fresh one for this call.

    Raises:
        RewardError, RewardTimeoutError: with on_error="raise".
        ValueError: bad ``on_error`` or ``timeout_s``.
    """
    _check_args(timeout_s, on_error)
    name = _reward_name(fn)
    where = f"reward {name!r} on episode seed {episode.seed}"
    fix = "; fix the reward, or set reward.on_error=zero to count such episodes as reward 0"
    error: RewardError | None = None
    t0 = time.perf_counter()
    if timeout_s is None:
        try:
            result: tuple[bool, Any] | None = (True, fn(episode))
        except Exception as e:  # noqa: BLE001 - reported below
            result = (False, e)
    else:
        result = (worker or _Worker()).call(fn, episode, timeout_s)
    if result is None:
        error = RewardTimeoutError(
            f"{where} did not return within its limit of {timeout_s} s and was abandoned{fix}, "
            "or raise reward.timeout_s if it is just slow"
        )
    elif not result[0]:
        e = result[1]
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: not the reward's failure to report
            raise e
        error = RewardError(f"{where} raised {type(e).__name__}: {e}{fix}")
        error.__cause__ = e
    else:
        out = result[1]
        if not isinstance(out, RewardOutput):
            error = RewardError(f"{where} returned {type(out).__name__}, expected RewardOutput{fix}")
        elif not _finite(out.total):
            error = RewardError(f"{where} returned a non-finite total {out.total!r}{fix}")
    if error is None:
        return out
    if on_error == "raise":
        raise error
    log.warning("%s (counted as reward 0, on_error=zero; %.1f s)", error, time.perf_counter() - t0)
    if failures is not None:
        failures.add(str(error))
    return RewardOutput(0.0, {})


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


class GuardedReward:
    """A reward wrapped with ``safe_call``; same ``name``, failures counted in ``self.failures``.

    Args: fn, timeout_s, on_error: as in ``safe_call`` (default: DEFAULT_TIMEOUT_S, "raise").

    Raises: ValueError on a bad ``timeout_s`` or ``on_error``.
    """

    def __init__(self, fn: RewardFn, timeout_s: float | None = DEFAULT_TIMEOUT_S, on_error: str = "raise"):
        _check_args(timeout_s, on_error)
        self.fn = fn
        self.name = _reward_name(fn)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self.failures = FailureCounter()
        self._local = threading.local()

    def __call__(self, episode: Episode) -> RewardOutput:
        worker = getattr(self._local, "worker", None)
        if self.timeout_s is not None and (worker is None or worker.stuck):
            worker = self._local.worker = _Worker()  # the first call of this thread, or after an abandoned one
        return safe_call(self.fn, episode, self.timeout_s, self.on_error, self.failures, worker)


def split_guard_keys(node: dict[str, Any]) -> tuple[dict[str, Any], float, str]:
    """(the reward's own config, timeout_s, on_error) of a plain-dict reward node (see module doc).

    Raises: ValueError naming the key, its valid range and the default.
    """
    rest = {k: v for k, v in node.items() if k not in GUARD_KEYS}
    timeout_s = node.get("timeout_s", DEFAULT_TIMEOUT_S)
    on_error = node.get("on_error", "raise")
    try:
        _check_args(timeout_s, on_error)
    except ValueError as e:
        raise ValueError(f"reward.{e} (default timeout_s={DEFAULT_TIMEOUT_S:g}, on_error=raise)") from None
    return rest, float(timeout_s), str(on_error)
