"""Sweep summary: one row per job of a multirun, on the console and as CSV/JSON in the sweep dir.

Each job writes ``result.json`` in its own folder (rlkit.recipes.grpo); this Hydra callback
runs once at the end of a multirun (``on_multirun_end``), reads every ``<sweep_dir>/*/result.json``
and writes ``sweep_summary.csv`` and ``sweep_summary.json`` next to them. Because it reads files
from the sweep folder, it works the same for every launcher whose jobs write there (local, Ray,
HyperPod with the sweep folder on /shared). Jobs without a result file are listed as failed, with
the first line of the ``error.txt`` the job wrote (rlkit.run_folder.ERROR_FILE) when there is one.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlkit.run_folder import ERROR_FILE

COLUMNS = ["job", "swept", "overrides", "status", "attempts", "success_before", "success_after", "steps", "wall_time_s",
           "output_dir"]


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """Rows for every job folder under ``sweep_dir`` (a folder holding ``.hydra/``), ordered by job number."""
    rows = []
    job_dirs = [d for d in Path(sweep_dir).iterdir() if d.is_dir() and (d / ".hydra").is_dir()]
    for d in sorted(job_dirs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)):
        overrides = _overrides(d)
        res_path = d / "result.json"
        err = d / ERROR_FILE
        attempts = _attempts(d)
        if res_path.is_file():
            res = json.loads(res_path.read_text())
            status = res.get("status", "completed")
            if err.is_file():  # this attempt failed (a run removes error.txt when it starts): the result is an earlier one's
                first = err.read_text(errors="replace").splitlines()[0][:120] if err.stat().st_size else ""
                status = f"failed: {first} (the numbers are the earlier run's)"
            rows.append({
                "job": d.name,
                "overrides": overrides,
                "status": status,
                "attempts": attempts,
                "success_before": res.get("eval_success_before"),
                "success_after": res.get("eval_success_after"),
                "steps": res.get("steps_completed"),
                "wall_time_s": res.get("wall_time_s"),
                "output_dir": str(d),
            })
        else:
            first = err.read_text(errors="replace").splitlines()[0][:120] if err.is_file() else ""
            status = f"failed: {first}" if first else "failed (no result.json)"
            rows.append({"job": d.name, "overrides": overrides, "status": status, "attempts": attempts,
                         "success_before": None, "success_after": None, "steps": None,
                         "wall_time_s": None, "output_dir": str(d)})
    # "swept": the overrides that differ between jobs (what the table is about)
    split = [r["overrides"].split() for r in rows]
    common = set.intersection(*(set(s) for s in split)) if len(split) > 1 else set()
    for r, parts in zip(rows, split):
        r["swept"] = " ".join(p for p in parts if p not in common)
    return [{k: r[k] for k in COLUMNS} for r in rows]


def _attempts(job_dir: Path) -> int:
    """How often the job was submitted: ``attempts`` in the Ray Jobs launchers' ``ray_job.json`` (they resubmit a
    failed job, launchers/ray_jobs/runner.py), else 1."""
    try:
        return int(json.loads((job_dir / "ray_job.json").read_text()).get("attempts", 1))
    except (OSError, ValueError, TypeError):
        return 1


def _overrides(job_dir: Path) -> str:
    p = job_dir / ".hydra" / "overrides.yaml"
    if not p.is_file():
        return ""
    lines = [ln[2:].strip() for ln in p.read_text().splitlines() if ln.startswith("- ")]
    return " ".join(lines)


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` (one dict per job, keys ``COLUMNS``) to ``sweep_dir``/sweep_summary.json and .csv."""
    sweep_dir = Path(sweep_dir)
    (sweep_dir / "sweep_summary.json").write_text(json.dumps(rows, indent=2))
    with open(sweep_dir / "sweep_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


def print_summary(rows: list[dict[str, Any]], title: str) -> None:
    """Print ``rows`` (one per job) as a rich table under ``title``; success rates in %, "-" where unknown."""

    from rich.console import Console
    from rich.table import Table

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    best = max((r["success_after"] for r in rows if r["success_after"] is not None), default=None)
    table = Table(title=title)
    for c in ["job", "swept", "status", "attempts", "success before", "success after", "steps", "wall time", "output dir"]:
        table.add_column(c)
    for r in rows:
        style = "bold green" if best is not None and r["success_after"] == best else None
        wall = "-" if r["wall_time_s"] is None else f"{r['wall_time_s']:.0f}s"
        table.add_row(r["job"], r["swept"] or r["overrides"], r["status"], str(r["attempts"]), pct(r["success_before"]),
                      pct(r["success_after"]),
                      str(r["steps"] if r["steps"] is not None else "-"), wall, r["output_dir"], style=style)
    Console(width=200).print(table)


class SweepSummaryCallback(Callback):
    """Hydra callback (configured under hydra.callbacks in conf/train.yaml)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = collect(sweep_dir)
        write_summary(sweep_dir, rows)
        print_summary(rows, title=f"sweep {sweep_dir}  (eval success on the fixed set, greedy)")
        print(f"sweep summary written to {sweep_dir / 'sweep_summary.csv'} and sweep_summary.json")
