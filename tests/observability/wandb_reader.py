"""The tests' name for rlkit.wandb_file (the offline run-file reader moved into the library, where
the resume path uses it), and the check that a run's W&B history is its metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlkit.wandb_file import WandbFileError, read_run, records, scan  # noqa: F401


def segments(out: Path, run_id: str) -> list[Path]:
    """The run files of W&B run ``run_id`` under ``<out>/wandb``, oldest segment first (the order
    ``wandb sync`` appends them in)."""
    dirs = sorted((Path(out) / "wandb").glob(f"*run-*-{run_id}"), key=lambda d: d.name.rsplit("-", 2)[-2])
    return [d / f"run-{run_id}.wandb" for d in dirs if (d / f"run-{run_id}.wandb").exists()]


def wandb_history(out: Path, run_id: str) -> list[dict[str, Any]]:
    """Every history row of the run's segments, in order; each file must read cleanly to its end
    (what ``wandb sync`` needs)."""
    rows: list[dict[str, Any]] = []
    for f in segments(out, run_id):
        rows += read_run(f)["history"]
    return rows


def metrics_rows(out: Path) -> list[tuple[int, dict[str, Any]]]:
    """metrics.jsonl as W&B rows: (step, merged metrics) in order, lines of one step merged."""
    rows: dict[int, dict[str, Any]] = {}
    for ln in (Path(out) / "metrics.jsonl").read_text().splitlines():
        d = json.loads(ln)
        rows.setdefault(d.pop("step"), {}).update(d)
    return list(rows.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def assert_wandb_matches_metrics(out: Path, run_id: str | None = None) -> list[int]:
    """W&B's history of the run (``run_id``, default result.json's ``wandb_run_id``) holds every step
    of metrics.jsonl exactly once, in order, with equal values; returns the steps."""
    out = Path(out)
    run_id = run_id or json.loads((out / "result.json").read_text())["wandb_run_id"]
    hist = wandb_history(out, run_id)
    expected = metrics_rows(out)
    steps = [h["_step"] for h in hist]
    assert steps == [s for s, _ in expected], f"W&B steps {steps} != metrics.jsonl steps {[s for s, _ in expected]}"
    for row, (s, metrics) in zip(hist, expected):
        bad = {k: (row.get(k), v) for k, v in metrics.items() if not _same(row.get(k), v)}
        assert not bad, f"step {s}: W&B != metrics.jsonl for {bad}"
    return steps
