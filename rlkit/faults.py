"""Fault injection for crash/resume tests: kill this process at a named point of the loop.

Set ``RLKIT_CRASH_AT="<point>@<step>"`` (e.g. ``update@3``, ``checkpoint@2``) and the process sends
itself SIGKILL when it reaches that point at that step, as a node failure would: no cleanup, no
flushing, no exception handlers. Points: ``rollout`` (after sampling, before the update),
``update`` (after the first micro-batch's backward, before the optimizer step), ``checkpoint``
(after part of the checkpoint's files are written, before its manifest), ``logged`` (after the
step's metrics are logged, before its checkpoint). Unset (the default), ``maybe_crash`` costs one
dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "RLKIT_CRASH_AT"


def maybe_crash(point: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if spec and spec == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
