"""Console progress: one line per GRPO step (step, reward, success, loss, time, ETA), nothing per token.

``quiet=True`` (trainer.quiet, used by CI) prints only the start/end lines.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self._t0: float | None = None
        self._first_step: int | None = None

    def say(self, text: str) -> None:
        print(f"[rlkit] {text}", flush=True)

    def step(self, step: int, total: int, m: dict[str, Any]) -> None:
        now = time.time()
        if self._t0 is None:
            self._t0, self._first_step = now - m.get("timing/step", 0.0), step - 1
        done = step - (self._first_step or 0)
        eta = (now - self._t0) / max(done, 1) * (total - step)
        if self.quiet:
            return
        parts = [
            f"step {step}/{total}",
            f"reward {m.get('reward/mean', 0):.3f}",
            f"success {m.get('reward/success_rate', 0):.1%}",
            f"loss {m.get('policy/loss', 0):+.4f}",
            f"clip {m.get('policy/clip_ratio', 0):.3f}",
            f"tokens {m.get('generate/mean_tokens', 0):.0f}",
            f"{m.get('timing/step', 0):.1f}s",
            f"ETA {_fmt(eta)}",
        ]
        if "eval/success_rate" in m:
            parts.append(f"EVAL {m['eval/success_rate']:.1%}")
        print("[rlkit] " + " | ".join(parts), flush=True)

    def sft(self, step: int, total: int, loss: float, val_success: float) -> None:
        if self.quiet or (step % 25 and step != total):
            return
        print(f"[rlkit] sft step {step}/{total} | loss {loss:.4f} | val success {val_success:.1%}", file=sys.stdout, flush=True)


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 60}m{seconds % 60:02d}s"
