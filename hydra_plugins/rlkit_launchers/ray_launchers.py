"""Hydra Launcher plugins that run each sweep job as a Ray job (``launcher=ray``, ``launcher=hyperpod``).

Thin classes following Hydra's Launcher plugin API (``hydra.plugins.launcher.Launcher``): Hydra
instantiates the class named by ``hydra.launcher._target_`` with the remaining ``hydra.launcher``
keys, calls ``setup`` once and ``launch`` per batch of jobs. The configs are registered below in
Hydra's ConfigStore, group ``hydra/launcher`` (``rlkit_ray``, ``rlkit_hyperpod``), the way Hydra's
own launcher plugins register theirs; ``conf/launcher/{ray,hyperpod}.yaml`` select them.
Submission logic: ``launchers/ray_jobs/``. Heavy imports (ray) happen only at launch time,
because Hydra imports this module in every run, including the remote jobs themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

from launchers.config import HyperPodLauncherConf, LocalLauncherConf, RayJobsLauncherConf

ConfigStore.instance().store(group="hydra/launcher", name="rlkit_ray", node=RayJobsLauncherConf,
                             provider="rlkit_launchers")
ConfigStore.instance().store(group="hydra/launcher", name="rlkit_hyperpod", node=HyperPodLauncherConf,
                             provider="rlkit_launchers")


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


class LaunchRefused(CompactHydraException):
    """A ``launchers.ray_jobs.LauncherError`` (bad launcher settings, an unreachable cluster) as Hydra's compact
    error: Hydra prints its one message, ``[rlkit] launcher error: ...``, without a traceback through Hydra
    and the launcher (the message names the fix; ``HYDRA_FULL_ERROR=1`` still shows the traceback).
    The original error is ``__cause__``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"[rlkit] launcher error: {error}")


class RayJobsLauncher(Launcher):
    """Submits every job of a sweep to a Ray cluster through the Ray Jobs API.

    Keyword arguments: the fields of ``launchers.config.RayJobsLauncherConf`` (see there for
    meanings and units). Raises ``launchers.ray_jobs.LauncherError`` from ``launch`` for a bad
    config or an unreachable cluster (as :class:`LaunchRefused`, its ``__cause__``); failed jobs come back as
    FAILED ``JobReturn``s.
    """

    def __init__(self, **kwargs: Any) -> None:
        from launchers.ray_jobs import Settings

        names = {f.name for f in dataclasses.fields(Settings)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown hydra.launcher keys {unknown}")
        self.settings = Settings(**{k: _plain(v) for k, v in kwargs.items()})
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None
        self.cluster_sweep_dir: Optional[str] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launchers.ray_jobs import LauncherError, launch

        try:
            return launch(self, job_overrides, initial_job_idx)
        except LauncherError as e:
            raise LaunchRefused(e) from e


class HyperPodLauncher(RayJobsLauncher):
    """The Ray Jobs launcher for a SageMaker HyperPod RayCluster (``sagemaker_ray://<cluster>/<ns>``).

    Same behaviour as :class:`RayJobsLauncher`; the address must use the ``sagemaker_ray`` scheme
    (resolved by toolkit-for-ray-on-sagemaker-ai: EKS token from the kubeconfig, then a session
    cookie for the cluster's secured dashboard endpoint) or be an http(s) dashboard address, e.g. a
    ``kubectl port-forward``.
    """

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launchers.ray_jobs import LauncherError, check_address

        address = self.settings.address or ""
        scheme = address.split("://", 1)[0] if "://" in address else ""
        try:
            if scheme not in ("sagemaker_ray", "http", "https"):
                raise LauncherError(
                    f"launcher=hyperpod needs hydra.launcher.address=sagemaker_ray://<raycluster>/<namespace> "
                    f"(got {self.settings.address!r}); see docs/hyperpod.md.")
            check_address(address)
        except LauncherError as e:
            raise LaunchRefused(e) from e
        return super().launch(job_overrides, initial_job_idx)


# ----------------------------------------------------------------------------------------------
# launcher=local


ConfigStore.instance().store(group="hydra/launcher", name="rlkit_local", node=LocalLauncherConf,
                             provider="rlkit_launchers")


def _job_error(ret: JobReturn) -> str:
    try:
        ret.return_value  # a FAILED JobReturn raises its job's exception here
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return "failed"


class LocalLauncher(Launcher):
    """Hydra's basic launcher (jobs one after another in this process) that keeps the sweep summary
    when a job fails.

    Hydra's BasicLauncher already runs every job of a batch even if one raises; its BasicSweeper
    then raises the first failure right after ``launch`` returns, which skips ``on_multirun_end``,
    so the summary table and CSV of the jobs that did finish were lost. This launcher logs every
    failed job and runs the ``on_multirun_end`` callbacks before returning in that case; the
    multirun still exits non-zero with the first failure's error, as before.
    """

    def __init__(self) -> None:
        from hydra._internal.core_plugins.basic_launcher import BasicLauncher

        self._basic = BasicLauncher()
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self._basic.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import logging

        from hydra.core.utils import JobStatus

        from launchers.ray_jobs import BASIC_SWEEPER

        returns = self._basic.launch(job_overrides, initial_job_idx)
        failed = [(initial_job_idx + i, r) for i, r in enumerate(returns) if r.status == JobStatus.FAILED]
        if failed:
            log = logging.getLogger(__name__)
            log.error("%d of %d jobs failed: %s", len(failed), len(returns),
                      "; ".join(f"#{n} {' '.join(r.overrides or [])}: {_job_error(r)}" for n, r in failed))
            if str(OmegaConf.select(self.config, "hydra.sweeper._target_", default="")) == BASIC_SWEEPER:
                self.hydra_context.callbacks.on_multirun_end(
                    config=self.config,
                    config_name=OmegaConf.select(self.config, "hydra.job.config_name", default=None))
        return returns
