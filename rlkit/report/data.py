"""Reading a run or a sweep from disk for the report: one ``Job`` per job folder.

A job folder is what ``train.py`` writes (docs/running.md, "What a run writes"): ``metrics.jsonl`` (one
JSON object per logged step; a step can have several lines, e.g. its training metrics and then the
final evaluation), ``result.json`` (only when the job completed), ``.hydra/config.yaml`` and
``overrides.yaml``, ``eval/<tag>.json`` (per-task outcomes). A sweep folder holds job folders
(``0``, ``1``, ...) plus the sweep summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def is_job_dir(path: Path) -> bool:
    path = Path(path)
    return any((path / n).exists() for n in ("metrics.jsonl", "result.json", ".hydra"))


@dataclass
class Job:
    """One job of a run or sweep.

    name: the folder name. overrides: its Hydra overrides (space-separated). swept: the overrides
    that differ between the sweep's jobs (empty for a single run). lines: metrics.jsonl records.
    result: result.json or None (the job did not complete).
    """

    name: str
    path: Path
    overrides: str = ""
    swept: str = ""
    lines: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        """Short legend label: the swept overrides, else the job folder name."""
        return self.swept or self.overrides or self.name

    @property
    def status(self) -> str:
        if self.result is not None:
            return str(self.result.get("status", "completed"))
        return "running or failed (no result.json)" if self.lines else "failed (no metrics)"

    @property
    def success_after(self) -> float | None:
        if self.result and self.result.get("eval_success_after") is not None:
            return float(self.result["eval_success_after"])
        s = self.series("eval/success_rate")
        return s[1][-1] if s[1] else None

    @property
    def success_before(self) -> float | None:
        if self.result and self.result.get("eval_success_before") is not None:
            return float(self.result["eval_success_before"])
        s = self.series("eval/success_rate")
        return s[1][0] if s[0] and s[0][0] == 0 else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of ``key``, one value per step (the last line of a step wins), by step."""
        by_step: dict[int, float] = {}
        for ln in self.lines:
            v = ln.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                by_step[int(ln["step"])] = float(v)
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps]

    def wall_time_at(self, step: int) -> float | None:
        """Training wall time (seconds) when step ``step`` ended; 0 for step 0; None if unknown."""
        if step == 0:
            return 0.0
        steps, walls = self.series("trainer/wall_time_s")
        return dict(zip(steps, walls)).get(step)

    def total(self, key: str) -> float:
        """Sum of ``key`` over the lines (e.g. seconds spent in a phase)."""
        return float(sum(ln[key] for ln in self.lines if isinstance(ln.get(key), (int, float))))

    def eval_outcomes(self) -> dict[str, dict[str, Any]]:
        """``eval/<tag>.json`` contents by tag (``step_000000``, ..., ``final``)."""
        out = {}
        d = self.path / "eval"
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                try:
                    out[p.stem] = json.loads(p.read_text())
                except json.JSONDecodeError:
                    continue
        return out

    def config(self) -> Any:
        """The job's composed config (``.hydra/config.yaml``, unresolved) or None."""
        from omegaconf import OmegaConf

        p = self.path / ".hydra" / "config.yaml"
        return OmegaConf.load(p) if p.is_file() else None


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for ln in path.read_text().splitlines():
        ln = ln.strip()
        if not ln:
            continue
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:  # a line being written right now
            continue
    return out


def _overrides(path: Path) -> str:
    p = path / ".hydra" / "overrides.yaml"
    if not p.is_file():
        return ""
    return " ".join(ln[2:].strip() for ln in p.read_text().splitlines() if ln.startswith("- "))


def load_job(path: Path) -> Job:
    path = Path(path)
    res = path / "result.json"
    result = None
    if res.is_file():
        try:
            result = json.loads(res.read_text())
        except json.JSONDecodeError:
            result = None
    return Job(name=path.name, path=path, overrides=_overrides(path), lines=_read_lines(path / "metrics.jsonl"),
               result=result)


def load(path: Path) -> tuple[str, list[Job]]:
    """``("run", [job])`` for a job folder, ``("sweep", jobs)`` for a sweep folder (jobs ordered by
    number, ``swept`` filled in).

    Raises: FileNotFoundError when ``path`` is neither (no job folder in it).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder")
    if is_job_dir(path) and not any(is_job_dir(d) for d in path.iterdir() if d.is_dir() and d.name != ".hydra"):
        return "run", [load_job(path)]
    dirs = [d for d in path.iterdir() if d.is_dir() and is_job_dir(d)]
    if not dirs:
        raise FileNotFoundError(
            f"{path} holds no rlkit job: expected metrics.jsonl / result.json / .hydra/ in it or in its subfolders"
        )
    dirs.sort(key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
    jobs = [load_job(d) for d in dirs]
    parts = [j.overrides.split() for j in jobs]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    for j, p in zip(jobs, parts):
        j.swept = " ".join(x for x in p if x not in common)
    return "sweep", jobs


def best_jobs(jobs: list[Job]) -> list[Job]:
    """The jobs with the highest final eval success (several on a tie; none without any result)."""
    scored = [j for j in jobs if j.success_after is not None]
    if not scored:
        return []
    top = max(j.success_after for j in scored)
    return [j for j in scored if j.success_after == top]


def best_job(jobs: list[Job]) -> Job | None:
    """The single job with the highest final eval success; None on a tie or without any result."""
    top = best_jobs(jobs)
    return top[0] if len(top) == 1 else None
