"""Console progress: live bars on a terminal, one persistent line per GRPO step, nothing per token.

On a terminal (``Console.is_terminal``) a two-line live display (rich ``Live``, redrawn 4 times a
second, removed when the run ends) sits under the persistent lines:

    train ━━━━━━━━━━━━━━━━━╸━━━━━━━━━━━━━━  12/40  reward 0.412 | success 38.0% | eval 45.3% | ETA 7m40s
    ⠹ eval · step 12 · 64 tasks          ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━  0:00:05

The second line is the current phase with its elapsed time: ``eval`` (driven by the loop's
``phase("eval")``), ``sft`` (a determinate bar over the warm-start steps), any phase the loop
marks with ``phase(name)`` (e.g. ``rollout``, ``update``), and otherwise ``rollout + update`` for
the step in progress. Each finished step also prints one persistent line
(``[rlkit] step 12/40 | reward ... | ETA ...``), which is all that is printed when the output is
not a terminal (CI logs, Ray job logs, pipes): no escape codes, no redraws.

``quiet=True`` (``trainer.quiet``, used by CI) prints only the ``say`` lines (start, resume, the
final result). Every persistent line, and the warm-start stages' line every 25 steps even while a
bar stands for them on a terminal, also goes to the log files of Python's root logger (Hydra's
``<run dir>/train.log``), not to its console handler, so the console shows each line once.
ETA: mean wall time per step since the first step of this process (evaluations and checkpoints
included) times the steps left, in minutes and seconds.
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress as RichProgress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

TRAIN_PHASE = "rollout + update"


def to_log_files(line: str) -> None:
    """Write ``line`` (INFO, logger name ``rlkit``, its ``[rlkit] `` prefix dropped: the record names the
    logger) to the root logger's file handlers only (Hydra's train.log); looked up at each call, since
    Hydra installs a new file handler for each job of a multirun."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if handlers:
        record = logging.LogRecord("rlkit", logging.INFO, __file__, 0, line.removeprefix("[rlkit] "), None, None)
        for h in handlers:
            h.handle(record)


class Progress:
    """Progress reporting of one training job (see the module docstring).

    Args:
        quiet: only ``say`` lines.
        live: force the live display on (True) or off (False); None: on when stdout is a terminal.
        console: the rich Console to draw on (default: stdout).
    """

    _active: "Progress | None" = None  # the one live display of this process (rich allows one)

    def __init__(self, quiet: bool = False, live: bool | None = None, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(highlight=False)
        self.live_enabled = (not quiet) and (self.console.is_terminal if live is None else live)
        self._t0: float | None = None
        self._first_step: int | None = None
        self._total: int | None = None
        self._step = 0
        self._phase_name: str | None = None
        self._last_eval: float | None = None
        self.phase_seconds: dict[str, float] = {}  # last duration of each phase (seconds)
        self._live: Live | None = None
        self._bars: RichProgress | None = None
        self._phases: RichProgress | None = None
        self._train_task: Any = None
        self._phase_task: Any = None

    # ------------------------------------------------------------------ lines
    def say(self, text: str) -> None:
        """One persistent line ``[rlkit] text`` (also in quiet mode)."""
        if self._phase_name == "sft":
            self._end_phase()
        self._print(f"[rlkit] {text}")

    def step(self, step: int, total: int, m: dict[str, Any]) -> None:
        """Step ``step`` of ``total`` is done with metrics ``m``: update the bar, print its line."""
        now = time.time()
        if self._t0 is None:
            self._t0, self._first_step = now - float(m.get("timing/step", 0.0)), step - 1
        done = step - (self._first_step or 0)
        eta = (now - self._t0) / max(done, 1) * (total - step)
        self._total, self._step = total, step
        if self.quiet:
            return
        parts = [
            f"step {step}/{total}",
            f"reward {m.get('reward/mean', 0):.3f}",
            f"success {m.get('reward/success_rate', 0):.1%}",
            f"loss {m['policy/loss']:+.4f}" if "policy/loss" in m else "loss -",  # none: skipped or demonstrations only
            f"kl {m.get('policy/approx_kl', 0):.4f}",
            f"clip {m.get('policy/clip_ratio', 0):.3f}",
            f"tokens {m.get('generate/mean_tokens', 0):.0f}",
            # backend.one_step_off_policy: the update ran while the next step's batch was sampled
            (f"{m.get('timing/step', 0):.1f}s (update {m.get('timing/update', 0):.1f}s while sampling ahead "
             f"{m['timing/prefetch']:.1f}s)" if m.get("timing/prefetch") else
             f"{m.get('timing/step', 0):.1f}s (rollout {m.get('timing/rollout', 0):.1f}s, "
             f"update {m.get('timing/train', 0):.1f}s)"),
            f"ETA {_fmt(eta)}",
        ]
        options = []  # after the success rate: the demonstrations, when that term is on
        if "demo/tasks" in m:
            options.append(f"demos {m['demo/tasks']:.0f}")
        parts[3:3] = options
        if "eval/success_rate" in m:
            parts.append(f"EVAL {m['eval/success_rate']:.1%}"
                         + (f" (trained-on {m['eval_seen/success_rate']:.1%})" if "eval_seen/success_rate" in m else ""))
        self._print("[rlkit] " + " | ".join(parts))
        if self.live_enabled:
            info = [f"reward {m.get('reward/mean', 0):.3f}", f"success {m.get('reward/success_rate', 0):.1%}"]
            if "eval/success_rate" in m:
                self._last_eval = m["eval/success_rate"]
            if self._last_eval is not None:
                info.append(f"eval {self._last_eval:.1%}")
            info.append(f"ETA {_fmt(eta)}")
            self._ensure_live()
            self._bars.update(self._train_task, total=total, completed=step, info=" | ".join(info))
            if step < total and self._phase_name is None:
                self._show_phase(TRAIN_PHASE, step + 1, None, "")

    def sft(self, step: int, total: int, loss: float, val_success: float | None) -> None:
        """SFT warm-start progress: a bar on a terminal, a line every 25 steps otherwise.
        ``val_success``: the last check's greedy success on the held-out training mazes, None
        before the first check."""
        if self.quiet:
            return
        val = "-" if val_success is None else f"{val_success:.1%}"
        line = f"[rlkit] sft step {step}/{total} | loss {loss:.4f} | val success {val}"
        periodic = step % 25 == 0 or step == total
        if periodic:
            to_log_files(line)
        if self.live_enabled:
            self._ensure_live()
            if self._phase_name != "sft":
                self._phase_name = "sft"
                self._phases.reset(self._phase_task, total=total, description="sft warm start", info="")
            self._phases.update(self._phase_task, completed=step,
                                info=f"loss {loss:.4f} | val success {val}")
            return
        if periodic:
            print(line, file=sys.stdout, flush=True)

    def grounding(self, step: int, total: int, loss: float, table: dict[str, float] | None) -> None:
        """Grounding-stage progress: a bar on a terminal, a line every 25 steps otherwise.
        ``table``: the last check's held-out accuracy by task (None before the first check)."""
        if self.quiet:
            return
        acc = "-" if not table else " ".join(f"{k} {v:.0%}" for k, v in table.items() if k != "all")
        line = f"[rlkit] grounding step {step}/{total} | loss {loss:.4f} | held-out {acc}"
        periodic = step % 25 == 0 or step == total
        if periodic:
            to_log_files(line)
        if self.live_enabled:
            self._ensure_live()
            if self._phase_name != "grounding":
                self._phase_name = "grounding"
                self._phases.reset(self._phase_task, total=total, description="grounding", info="")
            self._phases.update(self._phase_task, completed=step, info=f"loss {loss:.4f} | {acc}")
            return
        if periodic:
            print(line, file=sys.stdout, flush=True)

    # ----------------------------------------------------------------- phases
    @contextmanager
    def phase(self, name: str, step: int | None = None, total: int | None = None,
              detail: str = "") -> Iterator[None]:
        """Mark a phase of the loop (``eval``, ``rollout``, ``update``...) for the live display.

        ``step``/``total``: the GRPO step it belongs to and the run's step count (they start the
        live display before the first step finishes). The phase's duration (seconds) is kept in
        ``phase_seconds[name]``. When the final evaluation (``step == total``) ends, the live
        display is closed.
        """
        if total is not None:
            self._total = total
        t0 = time.time()
        if self.live_enabled and not self.quiet:
            self._ensure_live()
            if self._bars is not None and self._total:
                self._bars.update(self._train_task, total=self._total, completed=self._step)
            self._phase_name = name
            self._show_phase(name, step, None, detail)
        try:
            yield
        finally:
            self.phase_seconds[name] = time.time() - t0
            self._end_phase()
            if name == "eval" and step is not None and self._total is not None and step >= self._total:
                self.close()
            elif self._live is not None and self._total is not None and self._step < self._total:
                self._show_phase(TRAIN_PHASE, (step if step is not None else self._step) + 1, None, "")

    def close(self) -> None:
        """Stop the live display (idempotent; also run at interpreter exit)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        if Progress._active is self:
            Progress._active = None

    # ---------------------------------------------------------------- helpers
    def _print(self, line: str) -> None:
        to_log_files(line)
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, flush=True)

    def _ensure_live(self) -> None:
        if self._live is not None or not self.live_enabled:
            return
        if Progress._active is not None and Progress._active is not self:
            Progress._active.close()  # a previous job of a multirun in this process
        self._bars = RichProgress(TextColumn("[bold]train"), BarColumn(bar_width=32), MofNCompleteColumn(),
                                  TextColumn("{task.fields[info]}"), console=self.console)
        self._phases = RichProgress(SpinnerColumn(), TextColumn("{task.description:<32}"), BarColumn(bar_width=32),
                                    TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
        self._train_task = self._bars.add_task("train", total=self._total, completed=self._step, info="")
        self._phase_task = self._phases.add_task("starting", total=None, info="")
        self._live = Live(Group(self._bars, self._phases), console=self.console, refresh_per_second=4,
                          transient=True, redirect_stdout=True, redirect_stderr=True)
        self._live.start()
        Progress._active = self
        atexit.register(self.close)

    def _show_phase(self, name: str, step: int | None, total: int | None, detail: str) -> None:
        if self._phases is None:
            return
        label = name if step is None else f"{name} · step {step}"
        self._phases.reset(self._phase_task, total=total, description=label, info=detail)

    def _end_phase(self) -> None:
        self._phase_name = None


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 60}m{seconds % 60:02d}s"
