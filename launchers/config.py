"""Config schemas of the Ray Jobs launchers (``launcher=ray``, ``launcher=hyperpod``).

These dataclasses are stored in Hydra's ConfigStore under group ``hydra/launcher`` (names
``rlkit_ray`` and ``rlkit_hyperpod``) by ``hydra_plugins/rlkit_launchers``, the way Hydra's own
launcher plugins register theirs, so a typo in ``hydra.launcher.<key>`` fails at compose time.
Each field is a constructor argument of the launcher class named in ``_target_``.

Units: every ``*_s`` field is in seconds; ``entrypoint_memory`` is in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Paths never shipped with an uploaded working_dir (Ray's runtime_env "excludes" use .gitignore syntax).
DEFAULT_EXCLUDES = [
    ".venv/", ".venv-skyrl/", ".git/", "outputs/", "multirun/", "wandb/", ".cache/", "__pycache__/", "*.pyc",
    ".pytest_cache/", "checkpoints/", "ckpts/", "*.safetensors",
]


@dataclass
class RayJobsLauncherConf:
    """``launcher=ray``: each sweep job is a Ray job submitted through the Ray Jobs API."""

    _target_: str = "hydra_plugins.rlkit_launchers.ray_launchers.RayJobsLauncher"

    # Ray dashboard (Jobs API) address: http(s)://host:port, or <module>://... resolved by that module
    # (e.g. sagemaker_ray://). null: Ray's own resolution (RAY_API_SERVER_ADDRESS / RAY_ADDRESS, then
    # a local cluster). An explicit address wins over those environment variables.
    address: Optional[str] = "http://127.0.0.1:8265"
    # TLS verification for https addresses: true, false, or a CA bundle path (JobSubmissionClient(verify=)).
    verify: Any = True
    # Whether the cluster runs on this machine. null: true when the address host is 127.0.0.1/localhost.
    # A local cluster runs jobs in place with this interpreter (see working_dir, python).
    local_cluster: Optional[bool] = None

    # Cluster-side sweep folder the jobs write into (<sweep_dir>/<hydra.sweep.subdir>). null: the
    # sweep's own hydra.sweep.dir, made absolute on the submitting machine (right for a local cluster or
    # a filesystem both sides share). Resolved once per sweep, on the submitting side.
    sweep_dir: Optional[str] = None

    # Code the jobs run: "auto" (in_place for a local cluster, else upload), "in_place" (cd into
    # code_dir on the cluster node; no upload), "upload" (Ray packages code_dir as the job's
    # runtime_env.working_dir, minus `excludes` and .gitignore'd files), or a remote URI Ray accepts as
    # working_dir (s3://..., gs://..., https://...zip).
    working_dir: str = "auto"
    # Folder holding the task script and everything it imports. null: the folder of the script
    # running the sweep (sys.argv[0]), i.e. the repo root for train.py.
    code_dir: Optional[str] = None
    excludes: List[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDES))
    # Interpreter in the entrypoint. null: sys.executable for a local cluster, else "python".
    python: Optional[str] = None

    # Resources reserved for each job's entrypoint process (Ray Jobs API entrypoint_*). GPUs reserved
    # here belong to the driver process; a job that starts its own GPU actors/placement groups (the
    # skyrl backend) should reserve 0 GPUs here.
    entrypoint_num_cpus: float = 1.0
    entrypoint_num_gpus: float = 0.0
    entrypoint_memory: Optional[int] = None
    entrypoint_resources: Dict[str, float] = field(default_factory=dict)

    # Extra runtime_env fields merged into each job's runtime_env (pip, uv, py_executable, config, ...).
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    # Environment variables set for every job (non-secret values; they are visible in the dashboard).
    env_vars: Dict[str, str] = field(default_factory=dict)
    # Names copied from the submitting environment into the jobs' env_vars when set there. Ray stores
    # runtime_env in the cluster and shows it in the dashboard: list secrets here only for a cluster you
    # alone can reach; on shared clusters mount them from a Kubernetes Secret instead.
    pass_env: List[str] = field(default_factory=lambda: [
        "WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL", "HF_TOKEN",
    ])

    max_concurrent_jobs: int = 2
    poll_interval_s: float = 5.0
    # A job still PENDING this long after submission (no node with the entrypoint resources, or a slow
    # runtime_env build) is stopped and reported FAILED.
    pending_timeout_s: float = 600.0
    # Give up (jobs keep running on the cluster) when the Jobs API stays unreachable this long.
    unreachable_timeout_s: float = 300.0
    # Print each job's log lines as they arrive, prefixed with the job number.
    stream_logs: bool = True
    # Log lines quoted in a FAILED job's error.
    log_tail_lines: int = 40
    # A job that FAILED for another reason than a refused config or checkpoint or an error raised in a worker (a bug)
    # -- a killed driver, a replaced node, workers lost past trainer.max_failures -- is resubmitted into the same
    # folder this many times; it resumes from its latest checkpoint.
    max_retries: int = 1
    # A job STOPPED (`ray job stop`, the dashboard) was stopped by someone and stays stopped; true resubmits it like
    # a FAILED one (within max_retries).
    retry_stopped: bool = False


@dataclass
class HyperPodLauncherConf(RayJobsLauncherConf):
    """``launcher=hyperpod``: the Ray Jobs launcher against a HyperPod RayCluster's secured endpoint."""

    _target_: str = "hydra_plugins.rlkit_launchers.ray_launchers.HyperPodLauncher"
    # Required: sagemaker_ray://<raycluster>/<namespace>, resolved by toolkit-for-ray-on-sagemaker-ai
    # (or an http(s) dashboard address, e.g. a kubectl port-forward). null fails with the fix at launch.
    address: Optional[str] = None
    local_cluster: Optional[bool] = False
    # On the FSx for Lustre volume mounted at /shared in every pod (scripts/hyperpod_cluster.py).
    sweep_dir: Optional[str] = "/shared/rlkit/${hydra.sweep.dir}"
    working_dir: str = "upload"
    python: Optional[str] = "python"
    entrypoint_num_cpus: float = 1.0
    entrypoint_num_gpus: float = 0.0
    env_vars: Dict[str, str] = field(default_factory=lambda: {
        "RLKIT_SHARED_DIR": "/shared/rlkit",
        "RLKIT_CACHE_DIR": "/shared/rlkit/cache",
    })
    # Secrets (WANDB_API_KEY, HF_TOKEN) come from a Kubernetes Secret in the pod spec, not from here:
    # the HyperPod dashboard shows job environment variables to everyone who can open it.
    pass_env: List[str] = field(default_factory=lambda: ["WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"])
    # Each GRPO job uses the whole GPU worker group; raise this for smaller jobs.
    max_concurrent_jobs: int = 1
    poll_interval_s: float = 10.0
    pending_timeout_s: float = 1800.0


@dataclass
class LocalLauncherConf:
    """``launcher=local``: Hydra's basic launcher, keeping the sweep summary when a job fails."""

    _target_: str = "hydra_plugins.rlkit_launchers.ray_launchers.LocalLauncher"
