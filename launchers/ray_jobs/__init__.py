"""Run Hydra sweep jobs as Ray jobs through the Ray Jobs API (``ray.job_submission``).

One module per job:

- ``settings``: :class:`Settings` (the fields of ``launchers.config.RayJobsLauncherConf``, checked) and the errors.
- ``connection``: the Jobs API address (``http(s)://``, ``sagemaker_ray://`` for HyperPod) and the client.
- ``entrypoint``: each job's shell command, runtime_env and environment, as a :class:`JobSpec`.
- ``records``: what a job leaves on the submitting side (``ray_job.json``, ``ray_job.log``, ``result.json``,
  ``error.txt``) and its result read from its log or folder, as an :class:`Outcome`.
- ``runner``: :class:`RayJobsRunner`, which submits, polls, streams logs, times out, resubmits and collects.
- ``hydra_launch``: :func:`launch`, Hydra's ``Launcher.launch`` (``hydra_plugins/rlkit_launchers`` calls it).

The names below are the package's public surface; import them from here.
"""

from launchers.ray_jobs.connection import check_address, connect
from launchers.ray_jobs.entrypoint import RESULT_MARKER, JobSpec, build_entrypoint, job_env_vars, runtime_env_for
from launchers.ray_jobs.hydra_launch import BASIC_SWEEPER, launch
from launchers.ray_jobs.records import REFUSED, Outcome, log_tail, result_from_logs
from launchers.ray_jobs.runner import RayJobsRunner
from launchers.ray_jobs.settings import LauncherError, RayJobFailed, Settings

__all__ = [
    "BASIC_SWEEPER", "REFUSED", "RESULT_MARKER", "JobSpec", "LauncherError", "Outcome", "RayJobFailed",
    "RayJobsRunner", "Settings", "build_entrypoint", "check_address", "connect", "job_env_vars", "launch", "log_tail",
    "result_from_logs", "runtime_env_for",
]
