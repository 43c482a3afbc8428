"""The Hydra side of the Ray Jobs launchers: a batch of Hydra jobs in, one ``JobReturn`` per job out.

:func:`launch` resolves the sweep's folders and code once, turns each job's overrides into a
:class:`~launchers.ray_jobs.entrypoint.JobSpec` (writing its ``.hydra/overrides.yaml`` on this side), runs them with
:class:`~launchers.ray_jobs.runner.RayJobsRunner` and hands each outcome back to Hydra.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from launchers.ray_jobs.connection import connect
from launchers.ray_jobs.entrypoint import JobSpec, build_entrypoint, job_env_vars, resolved_mode, runtime_env_for
from launchers.ray_jobs.records import Outcome
from launchers.ray_jobs.runner import RayJobsRunner
from launchers.ray_jobs.settings import LauncherError, RayJobFailed, Settings

log = logging.getLogger(__package__)  # one logger for the launcher: its lines name the package, not the module

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass(frozen=True)
class _Sweep:
    """What every job of one ``launch`` shares: where it writes (``cluster_dir`` on the cluster, ``local_dir``
    here), the code it runs (``script`` relative to ``code_dir``, by ``python``; ``mode`` as
    :func:`~launchers.ray_jobs.entrypoint.resolved_mode`), its runtime_env and the prefix of its Hydra job ids."""

    local_dir: Path
    cluster_dir: str
    code_dir: Path
    script: str
    mode: str
    python: str
    runtime_env: dict[str, Any]
    id_prefix: str


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    """Hydra ``Launcher.launch`` for the Ray Jobs launchers; returns one ``JobReturn`` per job.

    ``launcher`` carries ``settings`` (:class:`~launchers.ray_jobs.settings.Settings`), ``config``,
    ``hydra_context`` and ``task_function`` as Hydra's ``Launcher.setup`` stored them. COMPLETED JobReturns hold the
    parsed result.json as ``return_value``; FAILED ones hold a :class:`~launchers.ray_jobs.settings.RayJobFailed`.

    Hydra's BasicSweeper raises the first failed job's error right after ``launch`` returns, which
    skips ``on_multirun_end``; so with that sweeper, when a job failed, the ``on_multirun_end``
    callbacks (the sweep summary) run here before returning.

    Raises: LauncherError for a bad config or an unreachable cluster.
    """
    from hydra.core.utils import setup_globals

    setup_globals()
    s: Settings = launcher.settings
    s.validate()
    sweep = _resolve_sweep(launcher, s)
    log.info("Launching %d jobs on Ray at %s (code: %s %s, jobs write to %s)", len(job_overrides),
             s.address or "Ray's default address", sweep.mode,
             sweep.code_dir if sweep.mode != "uri" else s.working_dir, sweep.cluster_dir)
    jobs = [_job(launcher, sweep, list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]

    runner = RayJobsRunner(s, lambda: connect(s.address, s.verify), echo=_echo)
    _ = runner.client  # connect first: an unreachable cluster fails before anything is submitted
    outcomes = runner.run([spec for spec, _ in jobs])

    sweep_cfgs = {spec.num: sweep_config for spec, sweep_config in jobs}
    returns = [_job_return(o, sweep_cfgs[o.spec.num]) for o in outcomes]
    _report_failures(launcher, outcomes)
    return returns


def _resolve_sweep(launcher: Any, s: Settings) -> _Sweep:
    """The sweep's folders (the cluster's resolved once per sweep, on this side; the local one created), its code and
    runtime_env. Raises LauncherError when the task script is not under ``code_dir``."""
    from omegaconf import OmegaConf

    from rlkit.run_folder import SWEPT_KEYS_ENV, sweep_group_name, swept_keys_of

    config = launcher.config
    local_sweep = Path(str(config.hydra.sweep.dir)).absolute()
    if launcher.cluster_sweep_dir is None:
        launcher.cluster_sweep_dir = os.path.normpath(s.sweep_dir) if s.sweep_dir else str(local_sweep)
    local_sweep.mkdir(parents=True, exist_ok=True)

    code_dir = Path(s.code_dir or os.path.dirname(os.path.abspath(sys.argv[0]))).resolve()
    script = Path(os.path.abspath(sys.argv[0])).resolve()
    try:
        script_rel = script.relative_to(code_dir).as_posix()
    except ValueError:
        raise LauncherError(f"The task script {script} is not under hydra.launcher.code_dir={code_dir}; "
                            "set code_dir to a folder that holds it.") from None
    mode = resolved_mode(s)
    python = s.python or (sys.executable if s.is_local() else "python")
    env_vars = job_env_vars(s)
    if "WANDB_RUN_GROUP" not in env_vars:  # the local launcher's W&B group for the sweep (rlkit.backends)
        env_vars["WANDB_RUN_GROUP"] = sweep_group_name(local_sweep)
    # each job is a single run on the cluster: tell it which keys this sweep sweeps, so that a sweep rerun into
    # the same folders with other values is refused there as in a local multirun (rlkit.run_folder.SWEPT_KEYS_ENV)
    env_vars[SWEPT_KEYS_ENV] = ",".join(sorted(swept_keys_of(
        list(OmegaConf.select(config, "hydra.overrides.task", default=None) or []))))
    return _Sweep(local_dir=local_sweep, cluster_dir=launcher.cluster_sweep_dir, code_dir=code_dir,
                  script=script_rel, mode=mode, python=python, runtime_env=runtime_env_for(s, code_dir, env_vars),
                  id_prefix=f"rlkit-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")


def _job(launcher: Any, sweep: _Sweep, overrides: list[str], num: int) -> tuple[JobSpec, Any]:
    """Job ``num`` of the sweep: its spec and its Hydra sweep config (``hydra.job.id``/``num`` set, ``output_dir``
    the cluster-side folder); writes ``<local folder>/.hydra/overrides.yaml``."""
    from omegaconf import OmegaConf, open_dict, read_write

    sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep.id_prefix}-{num}"
        sweep_config.hydra.job.num = num
    subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    job_dir = os.path.normpath(os.path.join(sweep.cluster_dir, subdir))
    local_dir = sweep.local_dir / subdir
    with read_write(sweep_config.hydra.runtime), open_dict(sweep_config.hydra.runtime):
        sweep_config.hydra.runtime.output_dir = job_dir
    sub_id = str(sweep_config.hydra.job.id)
    entry = build_entrypoint(sweep.python, sweep.script, overrides, job_dir, num, sub_id,
                             cd=str(sweep.code_dir) if sweep.mode == "in_place" else None,
                             threads=max(1, int(launcher.settings.entrypoint_num_cpus)))
    (local_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(overrides), local_dir / ".hydra" / "overrides.yaml")
    log.info("\t#%d : %s", num, " ".join(overrides))
    spec = JobSpec(num=num, overrides=overrides, job_dir=job_dir, local_dir=local_dir, entrypoint=entry,
                   runtime_env=sweep.runtime_env, submission_id=sub_id,
                   metadata={"rlkit_sweep": str(sweep.local_dir), "rlkit_job_num": str(num),
                             "rlkit_overrides": " ".join(overrides)[:1000]})
    return spec, sweep_config


def _job_return(o: Outcome, sweep_config: Any) -> Any:
    """The ``JobReturn`` Hydra gets for one outcome: the task config and the hydra config apart, COMPLETED with the
    result or FAILED with a RayJobFailed."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf, open_dict, read_write

    ret = JobReturn()
    ret.overrides = list(o.spec.overrides)
    task_cfg = copy.deepcopy(sweep_config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    ret.cfg = task_cfg
    hydra_cfg = copy.deepcopy(sweep_config)
    with read_write(hydra_cfg), open_dict(hydra_cfg):
        for key in [k for k in hydra_cfg.keys() if k != "hydra"]:
            del hydra_cfg[key]
    ret.hydra_cfg = hydra_cfg
    ret.working_dir = o.spec.job_dir
    ret.task_name = str(OmegaConf.select(sweep_config, "hydra.job.name", default="task"))
    if o.ok:
        ret.status = JobStatus.COMPLETED
        ret.return_value = o.result
    else:
        ret.status = JobStatus.FAILED
        ret.return_value = RayJobFailed(o.error)
    return ret


def _report_failures(launcher: Any, outcomes: Sequence[Outcome]) -> None:
    """Log every failed job (Hydra reports only the first with its full message; the others would be lost) and, under
    Hydra's BasicSweeper, which raises that first failure and skips ``on_multirun_end``, run those callbacks now."""
    from omegaconf import OmegaConf

    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return
    log.error("%d of %d jobs failed: %s", len(failed), len(outcomes),
              ", ".join(f"#{o.spec.num} {o.status}" for o in failed))
    for o in failed[1:]:
        log.error("%s", o.error)
    config = launcher.config
    if str(OmegaConf.select(config, "hydra.sweeper._target_", default="")) == BASIC_SWEEPER:
        launcher.hydra_context.callbacks.on_multirun_end(
            config=config, config_name=OmegaConf.select(config, "hydra.job.config_name", default=None))


def _echo(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
