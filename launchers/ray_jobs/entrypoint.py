"""What each sweep job runs: its shell command (the entrypoint), its runtime_env and environment, as a :class:`JobSpec`.

The command is ``python train.py <overrides> hydra.run.dir=<sweep_dir>/<subdir> hydra.job.num=<n> hydra.job.id=<id>``,
then the job's ``result.json`` printed after :data:`RESULT_MARKER` (``launchers.ray_jobs.records`` reads it from the log
where the job's folder is not readable here). Upstream behaviour followed (Ray 2.60 Jobs API): the entrypoint runs under
``/bin/sh`` (``subprocess.Popen(shell=True)``) in the job's working_dir.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from launchers.ray_jobs.settings import Settings

RESULT_MARKER = "==> rlkit result.json <=="
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+@%-]+")


@dataclass
class JobSpec:
    """One sweep job, ready to submit. ``job_dir`` is cluster-side, ``local_dir`` submitter-side."""

    num: int
    overrides: list[str]
    job_dir: str
    local_dir: Path
    entrypoint: str
    runtime_env: dict[str, Any]
    submission_id: str
    metadata: dict[str, str]


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value: as is when it only has path-safe characters, else
    single-quoted with quotes and backslashes escaped (Hydra's override grammar)."""
    if _HYDRA_PLAIN.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_entrypoint(python: str, script: str, overrides: Sequence[str], job_dir: str, num: int,
                     job_id: str, cd: Optional[str] = None, threads: Optional[int] = None) -> str:
    """The shell command of one job.

    ``<python> <script> <overrides...> hydra.run.dir='<job_dir>' hydra.job.num=<num>
    hydra.job.id=<job_id> && echo <marker> && cat <job_dir>/result.json``, each argument quoted
    with shlex so ``/bin/sh`` passes the overrides to Hydra unchanged, prefixed with
    ``cd <cd> &&`` when the job runs in place. With ``threads``, the program runs with
    ``OMP_NUM_THREADS=${OMP_NUM_THREADS:-<threads>}``: the entrypoint's CPUs unless the job's env sets
    it, for the entrypoint process only (the job's Ray tasks and actors keep their own), so an rlkit
    job's one-time builds (``trainer.build_threads=null``) take its share of a node other jobs share.
    """
    argv = [python, script, *overrides, f"hydra.run.dir={hydra_quote(job_dir)}",
            f"hydra.job.num={num}", f"hydra.job.id={job_id}"]
    cmd = shlex.join(argv)
    if threads is not None:
        cmd = f"OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{int(threads)}}} {cmd}"
    # The marker is echoed as two words so that the command text itself, which Ray writes into the
    # log ("Running entrypoint for job ..."), never contains the marker line.
    head, tail = RESULT_MARKER.split(" ", 1)
    cmd += (f" && echo {shlex.quote(head)} {shlex.quote(tail)}"
            f" && cat {shlex.quote(job_dir.rstrip('/') + '/result.json')}")
    if cd:
        cmd = f"cd {shlex.quote(cd)} && {cmd}"
    return cmd


def job_env_vars(settings: Settings, environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``env_vars`` plus each ``pass_env`` name set in ``environ`` (values are never logged)."""
    environ = os.environ if environ is None else environ
    env = {str(k): str(v) for k, v in settings.env_vars.items()}
    for name in settings.pass_env:
        if name in environ and name not in env:
            env[name] = environ[name]
    return env


def runtime_env_for(settings: Settings, code_dir: Path, env_vars: dict[str, str]) -> dict[str, Any]:
    """The runtime_env of every job: ``runtime_env`` extras, working_dir per mode, env_vars."""
    renv: dict[str, Any] = copy.deepcopy(dict(settings.runtime_env))
    mode = resolved_mode(settings)
    if mode == "upload":
        renv["working_dir"] = str(code_dir)
        renv["excludes"] = list(settings.excludes) + list(renv.get("excludes", []))
    elif mode == "uri":
        renv["working_dir"] = settings.working_dir
    if env_vars:
        renv["env_vars"] = env_vars
    return renv


def resolved_mode(settings: Settings) -> str:
    """``in_place``, ``upload`` or ``uri`` (``auto`` decided by whether the cluster is local)."""
    if settings.working_dir == "auto":
        return "in_place" if settings.is_local() else "upload"
    if "://" in settings.working_dir:
        return "uri"
    return settings.working_dir
