"""Envs for fault injection in Ray rollout workers (tests/distributed/test_worker_faults.py): the 7x7 maze, whose
episodes misbehave only inside a Ray actor (the driver's own uses of the env, task sets and warm-start builds, play
as usual).

``fault="raise"``: every step() raises RuntimeError (a deterministic bug in a rollout worker's env).
``fault="die_once"``: the first step() in any actor kills its process (SIGKILL, as the OOM killer would); the
marker file ``marker`` records that it happened, so the replacement worker plays normally.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from envs.visgym import VisGymMaze

MESSAGE = "deliberate bug in the env's step() (tests/distributed/faulty_env.py)"


def _in_actor() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - outside Ray: the driver
        return False


class FaultyMaze(VisGymMaze):
    """VisGymMaze whose episodes fail in a Ray actor as ``fault`` says (module doc); other keys as VisGymMaze's."""

    def __init__(self, fault: str = "raise", marker: str | None = None, **kwargs):
        if fault not in ("raise", "die_once"):
            raise ValueError(f"fault={fault!r}: use raise or die_once")
        super().__init__(**kwargs)
        self.fault, self.marker = fault, marker

    def make(self):
        episode = super().make()
        if not _in_actor():
            return episode
        step = episode.step

        def faulty_step(action_text):
            if self.fault == "raise":
                raise RuntimeError(MESSAGE)
            marker = Path(self.marker)
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            return step(action_text)

        episode.step = faulty_step
        return episode
