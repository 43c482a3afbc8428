"""What a run's folder and a sweep's folder record, and the code that reads and writes those records.

A run folder (``paths.output_dir``) holds, besides what the recipe writes (checkpoints, metrics, result.json):

- ``error.txt`` (``ERROR_FILE``): the error and traceback of an attempt that raised; the sweep summary
  (rlkit.sweep) and the Ray Jobs launchers (launchers/ray_jobs/) show its first line as the job's status;
- ``.hydra/accepted/``: a copy of the Hydra record of the last attempt that was accepted (``accept_run_config``),
  put back over a refused attempt's record (``restore_accepted_config``).

A sweep folder (``hydra.sweep.dir``) names the sweep's group (``sweep_group_name``) and, in the ``multirun.yaml``
Hydra writes there, which keys the sweep sweeps (``swept_keys``); a cluster job, run without that file, reads them
from ``$RLKIT_SWEPT_KEYS`` (``SWEPT_KEYS_ENV``).

This module sits low in the package (it imports nothing of rlkit), so the recipe, resume, the sweep summary and the
launchers read these records without importing the job's entry (rlkit.run).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import traceback
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

log = logging.getLogger(__name__)

#: Written into a job's output folder when the job raises: the error and its traceback. The sweep
#: summary (rlkit.sweep) shows its first line as the job's status.
ERROR_FILE = "error.txt"

#: Where a run folder keeps a copy of the Hydra record (``.hydra/*.yaml``) of the last run it accepted.
ACCEPTED_SUBDIR = "accepted"
_accepted: set[str] = set()  # run folders (realpath) whose current attempt has been accepted, in this process

#: Set by the Ray Jobs launchers (launchers/ray_jobs/) in every job's environment: the sweep's swept keys,
#: comma-separated. A cluster job runs train.py as a single run, without the sweep's multirun.yaml beside it,
#: so this is how it knows which keys its sweep sweeps (rlkit.resume.check_sweep_resume).
SWEPT_KEYS_ENV = "RLKIT_SWEPT_KEYS"

_DATE_DIR = re.compile(r"\d{4}-\d{2}-\d{2}")


def hydra_record_dir(out: Path) -> Path | None:
    """The run's Hydra record folder (``hydra.output_subdir``, ``.hydra`` by default), or None without one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        sub = HydraConfig.get().output_subdir
    except Exception:  # noqa: BLE001 - outside a Hydra run (tests, launchers calling run() directly)
        sub = ".hydra"
    return None if sub is None else out / sub


def begin_attempt(out: Path) -> None:
    """A new attempt of the run in ``out`` starts: remove the last attempt's ``error.txt`` (a resumed run that
    now succeeds must not keep it) and mark this attempt as not accepted yet."""
    (out / ERROR_FILE).unlink(missing_ok=True)
    _accepted.discard(os.path.realpath(out))


def is_accepted(out: Path) -> bool:
    """Whether this process accepted the current attempt of the run in ``out`` (``accept_run_config``)."""
    return os.path.realpath(out) in _accepted


def accept_run_config(out: Path | None) -> None:
    """Record that this attempt of the run in ``out`` was accepted (its config checked, a resume allowed):
    copy its Hydra record (``.hydra/{config,hydra,overrides}.yaml``) to ``.hydra/accepted/``, atomically.

    Hydra writes ``.hydra/`` before the job starts, so a later attempt in the same folder that is refused
    (a resume that would change the experiment, a bad value) has overwritten it with settings that never
    ran; rlkit.run.run then puts this copy back (``restore_accepted_config``), and the folder's record again
    says what its checkpoints hold (scripts/eval.py and report.py read it). Idempotent within an attempt.

    Raises: OSError when the copy cannot be written."""
    if out is None:
        return
    record = hydra_record_dir(out)
    key = os.path.realpath(out)
    if key in _accepted or record is None or not record.is_dir():
        _accepted.add(key)
        return
    tmp = record / f".{ACCEPTED_SUBDIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in record.glob("*.yaml"):
        shutil.copy2(f, tmp / f.name)
    previous = record / f".{ACCEPTED_SUBDIR}.old-{os.getpid()}"
    if (record / ACCEPTED_SUBDIR).is_dir():
        os.replace(record / ACCEPTED_SUBDIR, previous)  # a crash from here on still leaves one of the two
    os.replace(tmp, record / ACCEPTED_SUBDIR)
    shutil.rmtree(previous, ignore_errors=True)
    _accepted.add(key)


def restore_accepted_config(out: Path) -> bool:
    """Put the last accepted attempt's Hydra record back over this refused attempt's; True if there was one."""
    record = hydra_record_dir(out)
    saved = record / ACCEPTED_SUBDIR if record is not None else None
    if saved is None or not saved.is_dir():
        return False
    for f in saved.glob("*.yaml"):
        tmp = record / f".{f.name}.tmp"
        shutil.copy2(f, tmp)
        os.replace(tmp, record / f.name)
    return True


def record_resolved_dtype(out: Path | None, dtype: str) -> None:
    """Write the resolved ``policy.dtype`` into the run's ``.hydra/config.yaml`` (Hydra wrote it with "auto"
    before the job started), atomically; nothing without that file or when it holds another value."""
    record = hydra_record_dir(out) if out is not None else None
    path = record / "config.yaml" if record is not None else None
    if path is None or not path.is_file():
        return
    try:
        saved = OmegaConf.load(path)
        if OmegaConf.select(saved, "policy.dtype", default=None) != "auto":
            return
        saved.policy.dtype = dtype
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(OmegaConf.to_yaml(saved, resolve=False))
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 - the record is informative; the run itself uses cfg
        log.warning("could not record policy.dtype=%s in %s: %s", dtype, path, e)


def write_error(out: Path, err: BaseException) -> None:
    """Write ``err`` and its traceback to ``out/error.txt``, whole or not at all (a full disk must not leave an
    empty error.txt); never raises (the job's own error must not be hidden behind this one)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{ERROR_FILE}.tmp"
        try:
            tmp.write_text(f"{type(err).__name__}: {err}\n\n" + "".join(traceback.format_exception(err)))
            os.replace(tmp, out / ERROR_FILE)
        finally:
            tmp.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - never hide the job's own error behind this one
        pass


def sweep_group_name(sweep_dir: str | Path) -> str:
    """The W&B group (and Prometheus ``group`` label) of a sweep's jobs, from its sweep folder.

    Hydra's default sweep folder is ``multirun/<YYYY-mm-dd>/<HH-MM-SS>`` (conf/train.yaml
    ``hydra.sweep.dir``): its group is ``sweep-<YYYY-mm-dd>_<HH-MM-SS>``, dated, so sweeps started
    at the same clock time on different days are different groups. Any other folder (one named with
    ``hydra.sweep.dir=...``) gives ``sweep-<its last part>``, the name its user chose. Only the path
    is read (nothing on disk), so every job of a sweep, and the Ray launcher submitting them
    (launchers/ray_jobs/), get the same group whenever and wherever they run.

    Raises: ValueError for a folder without a name (``""``, ``/``).
    """
    path = Path(sweep_dir)
    if not path.name:
        raise ValueError(f"sweep folder {str(sweep_dir)!r} has no name to make a group of")
    if _DATE_DIR.fullmatch(path.parent.name):
        return f"sweep-{path.parent.name}_{path.name}"
    return f"sweep-{path.name}"


def swept_keys_of(task_overrides: Sequence[str]) -> set[str]:
    """The keys (or groups) that command-line overrides sweep: those with several values (``lr=1e-5,3e-5``,
    ``range(...)``, ``choice(...)``), in Hydra's override grammar. Raises Hydra's OverrideParseException for a
    malformed override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides([str(o) for o in task_overrides])
    return {o.key_or_group for o in overrides if o.is_sweep_override()}


def swept_keys(sweep_dir: Path) -> set[str]:
    """The config keys (or groups) the sweep that Hydra launched into ``sweep_dir`` sweeps (``swept_keys_of``
    its command-line overrides), read from the ``multirun.yaml`` Hydra writes there at the sweep's start.
    Empty when there is none or it cannot be read."""
    try:
        return swept_keys_of(list(OmegaConf.load(Path(sweep_dir) / "multirun.yaml").hydra.overrides.task))
    except Exception:  # noqa: BLE001 - no sweep record: nothing to compare against
        return set()


#: ``hydra.*`` keys whose overrides change what a job composes (``hydra.searchpath``: config folders outside the
#: clone, docs/adding-an-env.md section 8), unlike those that say where it writes or how it launches
#: (``hydra.run.dir``, ``hydra/launcher=...``). Hydra keeps every ``hydra.*`` override out of the task overrides.
RERUN_HYDRA_KEYS = ("hydra.searchpath",)


def rerun_overrides(task: Sequence[str], hydra: Sequence[str]) -> list[str]:
    """The overrides that rerun a job, as its records keep them (result.json's ``overrides``).

    Args:
        task: the job's task overrides (``HydraConfig.overrides.task``, ``.hydra/overrides.yaml``), as typed.
        hydra: its ``hydra.*`` overrides (``HydraConfig.overrides.hydra``), as typed or added by Hydra.

    Returns: those of ``hydra`` on a RERUN_HYDRA_KEYS key (``+``, ``++`` and ``~`` forms too; in order), then ``task``:
    without the search path, a rerun of an env outside the clone stops at Hydra's "Could not find 'env/...'".
    """
    kept = [o for o in hydra if o.lstrip("+~").split("=", 1)[0] in RERUN_HYDRA_KEYS]
    return [*kept, *task]
