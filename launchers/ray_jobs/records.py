"""What a sweep job leaves on the submitting side, and what it is read from.

Where results come from: the job writes ``result.json`` into its own folder (``hydra.run.dir``). When that folder is
readable here (a local cluster, or a filesystem both sides mount) it is read directly; otherwise the entrypoint prints
the file after a marker line (``launchers.ray_jobs.entrypoint.RESULT_MARKER``) and it is taken from the job's log.
Either way a copy lands in the submitting side's ``hydra.sweep.dir/<subdir>`` together with ``.hydra/overrides.yaml``,
``ray_job.json`` (submission id, status, timings), ``ray_job.log`` and, for a failed job, ``error.txt``, so the sweep
summary (``rlkit.sweep``), which reads ``<hydra.sweep.dir>/*/``, works the same for a local cluster and for HyperPod.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from launchers.ray_jobs.entrypoint import RESULT_MARKER, JobSpec
from launchers.ray_jobs.settings import Settings
from rlkit.run_folder import ERROR_FILE

log = logging.getLogger(__package__)  # one logger for the launcher: its lines name the package, not the module

_MARKER_LINE = re.compile(r"^" + re.escape(RESULT_MARKER) + r"[ \t]*\r?$", re.MULTILINE)
#: A job log that shows a refused config or checkpoint, or an error raised in a worker that was not a lost worker (a
#: bug, rlkit.recipes.heal.WorkerError): resubmitting it would fail the same way (no retry).
REFUSED = re.compile(r"\[rlkit\] (config|checkpoint|worker) error"
                     r"|\b(ConfigError|CheckpointError|ConfigCompositionException|WorkerError)\b")


@dataclass
class Outcome:
    """How one job ended: ``result`` (parsed result.json) when ``ok``, else ``error``; ``attempts``: submissions."""

    spec: JobSpec
    ok: bool
    status: str
    result: Optional[dict] = None
    error: Optional[str] = None
    logs: str = ""
    attempts: int = 1


def result_from_logs(logs: str) -> Optional[dict]:
    """The JSON object printed after the last result marker line of a job log, or None."""
    i = _marker_at(logs)
    if i < 0:
        return None
    text = logs[i + len(RESULT_MARKER):].lstrip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _marker_at(logs: str) -> int:
    """Offset of the last line that is exactly the result marker, or -1."""
    at = -1
    for m in _MARKER_LINE.finditer(logs):
        at = m.start()
    return at


def log_tail(logs: str, n: int) -> str:
    """The last ``n`` lines of a log, without the result block."""
    i = _marker_at(logs)
    if i >= 0:
        logs = logs[:i]
    lines = logs.rstrip("\n").splitlines()
    return "\n".join(lines[-n:])


def record_failure(spec: JobSpec, error: str, ran: bool) -> None:
    """Write ``error.txt`` (rlkit.run_folder.ERROR_FILE) into the job's local folder, which the sweep summary
    (rlkit.sweep) reads: without it, an earlier run's ``result.json`` there would list this failed job as
    completed, with that run's numbers. A job that ran in this very folder (a local cluster, a shared
    filesystem) and failed inside rlkit has written its own, with the traceback: that one is kept (an earlier
    attempt's was removed at submission, ``RayJobsRunner._submit``)."""
    path = spec.local_dir / ERROR_FILE
    if ran and path.is_file() and _same_folder(spec.local_dir, Path(spec.job_dir)):
        return
    try:
        _write_text(path, f"RayJobFailed: {error}\n")
    except OSError as e:  # the outcome still reaches Hydra as FAILED
        log.warning("could not write %s: %s", path, e)


def refused_in_folder(spec: JobSpec) -> bool:
    """Whether the job, in a folder this machine shares with it, wrote an error.txt (rlkit.run) saying its config or
    checkpoint was refused."""
    path = spec.local_dir / ERROR_FILE
    if not _same_folder(spec.local_dir, Path(spec.job_dir)) or not path.is_file():
        return False
    try:
        return bool(REFUSED.search(path.read_text(errors="replace").split("\n", 1)[0]))
    except OSError:
        return False


def read_result(spec: JobSpec, logs: str) -> Optional[dict]:
    """The job's result: the ``result.json`` its entrypoint printed into its log (on the cluster, after the job),
    else the file at its ``job_dir`` as this machine sees it (a shared folder; on a remote cluster's own disk that
    path may hold an earlier run's file, so the log comes first)."""
    result = result_from_logs(logs)
    if result is not None:
        return result
    path = Path(spec.job_dir) / "result.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            log.warning("could not read %s (%s)", path, e)
    return None


def job_record(spec: JobSpec, s: Settings) -> dict[str, Any]:
    """The fields of ``ray_job.json`` that describe the submission (runtime_env env_vars by name only)."""
    renv = dict(spec.runtime_env)
    if "env_vars" in renv:  # names only: values may be secrets
        renv["env_vars"] = sorted(renv["env_vars"])
    return {"job": spec.num, "submission_id": spec.submission_id, "address": s.address,
            "overrides": spec.overrides, "job_dir": spec.job_dir, "entrypoint": spec.entrypoint,
            "runtime_env": renv}


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` at once (a temporary file, then a rename)."""
    _write_text(path, json.dumps(obj, indent=2, default=str))


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _same_folder(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` are one folder (a local cluster, or the sweep on a shared filesystem)."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False
