"""Hydra Launcher plugins that run each sweep job as a Ray job (``launcher=ray``, ``launcher=hyperpod``).

Thin classes following Hydra's Launcher plugin API (``hydra.plugins.launcher.Launcher``): Hydra
instantiates the class named by ``hydra.launcher._target_`` with the remaining ``hydra.launcher``
keys, calls ``setup`` once and ``launch`` per batch of jobs. The configs are registered below in
Hydra's ConfigStore, group ``hydra/launcher`` (``rlkit_ray``, ``rlkit_hyperpod``), the way Hydra's
own launcher plugins register theirs; ``conf/launcher/{ray,hyperpod}.yaml`` select them.
Submission logic: ``launchers/ray_jobs.py``. Heavy imports (ray) happen only at launch time,
because Hydra imports this module in every run, including the remote jobs themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

from launchers.config import HyperPodLauncherConf, RayJobsLauncherConf

ConfigStore.instance().store(group="hydra/launcher", name="rlkit_ray", node=RayJobsLauncherConf,
                             provider="rlkit_launchers")
ConfigStore.instance().store(group="hydra/launcher", name="rlkit_hyperpod", node=HyperPodLauncherConf,
                             provider="rlkit_launchers")


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


class RayJobsLauncher(Launcher):
    """Submits every job of a sweep to a Ray cluster through the Ray Jobs API.

    Keyword arguments: the fields of ``launchers.config.RayJobsLauncherConf`` (see there for
    meanings and units). Raises ``launchers.ray_jobs.LauncherError`` from ``launch`` for a bad
    config or an unreachable cluster; failed jobs come back as FAILED ``JobReturn``s.
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
        from launchers.ray_jobs import launch

        return launch(self, job_overrides, initial_job_idx)


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
        if scheme not in ("sagemaker_ray", "http", "https"):
            raise LauncherError(
                f"launcher=hyperpod needs hydra.launcher.address=sagemaker_ray://<raycluster>/<namespace> "
                f"(got {self.settings.address!r}); see docs/hyperpod.md.")
        check_address(address)
        return super().launch(job_overrides, initial_job_idx)
