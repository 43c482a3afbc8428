"""Metric sinks: Weights & Biases (default) and a console-only logger.

Every run also writes ``metrics.jsonl`` in its output folder (one JSON object per logged step) no
matter which logger is chosen: reports and the sweep summary read it.

W&B mode ``auto`` follows wandb's documented behaviour for offline use: online when WANDB_API_KEY is
set, otherwise offline (files under ``<output_dir>/wandb/offline-run-*``, uploadable later with
``wandb sync``). A resumed run passes the stored run id with ``resume="allow"`` so W&B continues
the same run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class MetricsFile:
    """Appends ``{"step": s, **metrics}`` lines to ``path`` (flushed each call)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, metrics: dict[str, Any], step: int) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **_plain(metrics)}) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after ``step`` (they belong to the lost part of the run)."""
        if not self.path.exists():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in metrics.items():
        if hasattr(v, "item"):
            v = v.item()
        out[k] = v
    return out


class ConsoleLogger:
    """No external service: metrics go to metrics.jsonl and the console progress line only."""

    run_id: str | None = None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None, resume_id: str | None) -> str | None:
        return None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        pass

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbLogger:
    """Weights & Biases run per job; see the module docstring for modes and resume.

    Args (conf/logger/wandb.yaml): project, entity, group (None: the sweep folder's name in a
    multirun), tags, name (None: the job's override string), mode (auto|online|offline|disabled).

    Raises: ValueError on an unknown mode.
    """

    def __init__(self, project: str = "rlkit", entity: str | None = None, group: str | None = None,
                 tags: list[str] | None = None, name: str | None = None, mode: str = "auto"):
        if mode not in ("auto", "online", "offline", "disabled"):
            raise ValueError(f"logger.mode={mode!r} is not one of auto, online, offline, disabled")
        self.project, self.entity, self.group = project, entity, group
        self.tags, self.name, self.mode = list(tags or []), name, mode
        self._run = None
        self.run_id: str | None = None

    def start(self, output_dir: Path, config: dict, run_name: str, group: str | None, resume_id: str | None) -> str | None:
        import wandb

        mode = self.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self._run = wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group or group,
            tags=self.tags,
            name=self.name or run_name,
            config=config,
            dir=str(output_dir),
            mode=mode,
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(console="off", quiet=True),
        )
        self.run_id = self._run.id
        return self.run_id

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._run is not None:
            self._run.log(_plain(metrics), step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """Log a table; PIL images in cells become wandb.Image."""
        if self._run is None:
            return
        import wandb
        from PIL import Image

        data = [[wandb.Image(c) if isinstance(c, Image.Image) else c for c in row] for row in rows]
        self._run.log({key: wandb.Table(columns=columns, data=data)}, step=step)

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        if self._run is None:
            return
        import wandb

        art = wandb.Artifact(name=name, type=kind)
        art.add_dir(str(path))
        self._run.log_artifact(art)

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
