"""Ray runtime of backend=native_ray: settings, the placement-group layout, starting / joining Ray.

Layout (Ray placement groups, https://docs.ray.io/en/latest/ray-core/scheduling/placement-group.html):
one placement group holds one bundle per device, ``{"CPU": cpus_per_worker, "GPU": gpus_per_worker}``
(the GPU key only when gpus_per_worker > 0). Trainer rank ``r`` runs on bundle ``r``.

- ``colocate=true``: ``max(num_workers, num_rollout_workers)`` bundles; rollout worker ``j`` runs on
  bundle ``j``, beside trainer rank ``j``. Every actor asks for half of its bundle (fractional CPU /
  GPU), so a trainer and a rollout worker share one device; the loop runs them in turn (rollout,
  then update), never at the same time (so ``one_step_off_policy`` is refused here).
- ``colocate=false``: ``num_workers + num_rollout_workers`` bundles; rollout worker ``j`` runs on
  bundle ``num_workers + j`` and every actor owns its whole bundle.

The placement strategy (PACK by default: bundles on as few nodes as possible; STRICT_PACK, SPREAD,
STRICT_SPREAD as Ray defines them) is a config key. Ray's own dashboard and metrics are left as Ray
configures them; ``include_dashboard`` only applies when this process starts a local Ray instance.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any


STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")


class WorkersHungError(TimeoutError):
    """A call of the workers got no answer within ``backend.call_timeout_s``: a hung worker, i.e. a lost one
    (rlkit.recipes.heal)."""


class PlacementGroupTimeout(RuntimeError):
    """The placement group was not scheduled within its time: the cluster lacks the resources (yet: a replacement
    node may still be joining). The message lists the bundles asked for and what the cluster has free."""
#: how the trainer ranks hold the policy (RaySettings.strategy)
TRAINER_STRATEGIES = ("fsdp", "ddp")


@dataclass
class RaySettings:
    """The keys of conf/backend/native_ray.yaml (see there for the defaults people use).

    num_workers: data-parallel trainer ranks (FSDP2 world size).
    strategy: how the trainer ranks hold the policy. "fsdp": FSDP2, parameters sharded over the ranks
        and gathered block by block in every forward and backward (rlkit.distributed.fsdp). "ddp":
        every rank holds the whole policy and the ranks sum their LoRA gradients in one all-reduce a
        step (fsdp.ReplicatedRoot; PyTorch DDP's scheme), for a policy that fits one device; no
        mixed precision (the policy computes in its own dtype, policy.dtype).
    num_rollout_workers: rollout actors (None = num_workers).
    colocate: trainer and rollout actors share bundles (fractional resources) or get their own.
    cpus_per_worker: CPU cores per bundle (each actor uses max(1, int(cpus_per_worker)) torch threads).
    gpus_per_worker: GPUs per bundle (0 = CPU run: gloo; > 0: NCCL, one GPU per bundle expected).
    placement_strategy: PACK | STRICT_PACK | SPREAD | STRICT_SPREAD.
    address: Ray address; None = join the Ray cluster of the job this runs in (RAY_ADDRESS set,
        e.g. a Ray job) else start a local instance; "local" = always start one; "auto" or
        "host:port" / "ray://host:port" = ray.init(address=...).
    num_cpus / num_gpus: logical resources of a local instance (None = what the bundles need).
    include_dashboard: start Ray's dashboard with a local instance (off by default on CPU for speed).
    sync_timeout_s: how long a rollout worker waits for the expected adapter version (seconds).
    keep_versions: adapter versions kept under lora_sync (>= 1).
    mixed_precision: FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce); None = on with GPUs,
        off on CPU; true on CPU is a config error (CPU bf16 matmuls are slow and inexact here).
    dist_timeout_s: collective timeout of the trainers' process group (seconds).
    startup_timeout_s: how long placement-group scheduling and actor start-up may take (seconds).
    call_timeout_s: how long one call of the workers (a rollout, an update, an evaluation) may take
        (seconds); a worker that has not answered by then counts as hung, i.e. dead (trainer.max_failures).
    peer_check_s: when a worker raises, how long the driver waits (seconds) for Ray to report whether a worker of
        the group is gone (a dead rank breaks its peers' collective: that error heals; any other one stops the run).
        A killed process is reported within a second; a lost node after Ray's node health check (about 15 s by
        default), hence 30. The wait ends as soon as every worker has answered a ping (all alive).
    one_step_off_policy: sample step s + 1 on the rollout workers while the trainer ranks update on
        step s's batch, so step s + 1 samples with adapter v(s - 1) instead of v(s) (the loss's
        importance ratio and clip correct for that: its "old" logprobs are the sampling ones). As
        verl's one-step-off-policy trainer and PipelineRL's bounded lag; worth it when trainers and
        rollout workers have their own devices: it needs colocate=false and keep_versions >= 2.
    """

    num_workers: int = 1
    strategy: str = "fsdp"
    num_rollout_workers: int | None = None
    colocate: bool = True
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    placement_strategy: str = "PACK"
    address: str | None = None
    num_cpus: float | None = None
    num_gpus: float | None = None
    include_dashboard: bool = False
    sync_timeout_s: float = 300.0
    keep_versions: int = 2
    mixed_precision: bool | None = None
    dist_timeout_s: float = 1800.0
    startup_timeout_s: float = 600.0
    one_step_off_policy: bool = False
    call_timeout_s: float = 1800.0
    peer_check_s: float = 30.0

    def __post_init__(self) -> None:
        if self.num_rollout_workers is None:
            self.num_rollout_workers = self.num_workers

    def validate(self) -> None:
        """Raise ValueError naming the key for a value out of range."""
        if int(self.num_workers) < 1:
            raise ValueError(f"backend.num_workers={self.num_workers} must be >= 1")
        if int(self.num_rollout_workers) < 1:
            raise ValueError(f"backend.num_rollout_workers={self.num_rollout_workers} must be >= 1")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"backend.cpus_per_worker={self.cpus_per_worker} must be > 0")
        if self.gpus_per_worker < 0:
            raise ValueError(f"backend.gpus_per_worker={self.gpus_per_worker} must be >= 0")
        if self.strategy not in TRAINER_STRATEGIES:
            raise ValueError(f"backend.strategy={self.strategy!r}: use one of {', '.join(TRAINER_STRATEGIES)}")
        if self.strategy == "ddp" and self.mixed_precision:
            raise ValueError(
                "backend.mixed_precision=true is FSDP2's bf16/fp32 policy; backend.strategy=ddp computes in the "
                "policy's own dtype (policy.dtype): leave mixed_precision null or use strategy=fsdp"
            )
        if self.placement_strategy not in STRATEGIES:
            raise ValueError(f"backend.placement_strategy={self.placement_strategy!r}: use one of {', '.join(STRATEGIES)}")
        if self.keep_versions < 1:
            raise ValueError(f"backend.keep_versions={self.keep_versions} must be >= 1")
        if self.one_step_off_policy and self.colocate:
            raise ValueError(
                "backend.one_step_off_policy=true runs the rollout workers while the trainer ranks update, so "
                "they need devices of their own: set backend.colocate=false (colocated actors share a device "
                "and take turns)"
            )
        if self.one_step_off_policy and self.keep_versions < 2:
            raise ValueError(
                f"backend.keep_versions={self.keep_versions} with backend.one_step_off_policy=true: the rollout "
                "workers sample from the version before the one being published, so keep at least 2"
            )
        if self.sync_timeout_s <= 0:
            raise ValueError(f"backend.sync_timeout_s={self.sync_timeout_s} must be > 0 seconds")
        if self.call_timeout_s <= 0:
            raise ValueError(f"backend.call_timeout_s={self.call_timeout_s} must be > 0 seconds")
        if self.peer_check_s < 0:
            raise ValueError(f"backend.peer_check_s={self.peer_check_s} must be >= 0 seconds")
        if self.mixed_precision and self.gpus_per_worker == 0:
            raise ValueError(
                "backend.mixed_precision=true needs GPUs (backend.gpus_per_worker > 0); on CPU the trainer "
                "runs in float32 (leave mixed_precision null)"
            )

    @property
    def device_type(self) -> str:
        """"cuda" when bundles hold GPUs, else "cpu"."""
        return "cuda" if self.gpus_per_worker > 0 else "cpu"

    @property
    def use_mixed_precision(self) -> bool:
        if self.strategy == "ddp":
            return False
        return bool(self.mixed_precision) if self.mixed_precision is not None else self.device_type == "cuda"

    @property
    def threads_per_actor(self) -> int:
        """torch intra-op threads of every actor: the bundle's cores (at least 1)."""
        return max(1, int(self.cpus_per_worker))

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles (one per device), in bundle-index order."""
        n = max(self.num_workers, self.num_rollout_workers) if self.colocate else self.num_workers + self.num_rollout_workers
        bundle: dict[str, float] = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker > 0:
            bundle["GPU"] = float(self.gpus_per_worker)
        return [dict(bundle) for _ in range(n)]

    def trainer_bundle(self, rank: int) -> int:
        return rank

    def rollout_bundle(self, index: int) -> int:
        return index if self.colocate else self.num_workers + index

    def actor_resources(self) -> dict[str, float]:
        """Ray ``num_cpus`` / ``num_gpus`` of each actor: half a bundle when colocated, else all of it."""
        share = 0.5 if self.colocate else 1.0
        return {"num_cpus": self.cpus_per_worker * share, "num_gpus": self.gpus_per_worker * share}


def init_ray(settings: RaySettings, env_vars: dict[str, str] | None = None) -> tuple[bool, str | None]:
    """Start or join Ray as ``settings.address`` says (see RaySettings).

    Returns: (owned, dashboard_url): owned is True when this call initialised Ray in this process
    (started a local instance, or connected to a cluster): the caller calls ``stop_ray()`` at
    the end, which stops a local instance and only disconnects from a cluster. A local instance
    is also watched by rlkit.distributed.reaper: if this process dies without stop_ray (SIGKILL),
    the instance's processes are stopped within seconds. False when Ray was
    already initialised by the caller (a test, a notebook). dashboard_url is Ray's, or None.

    Raises: RuntimeError naming the address when Ray cannot be reached / started.
    """
    import ray

    if ray.is_initialized():  # a caller (a test, a notebook) owns the Ray instance
        return False, None
    address = settings.address
    if address is None:
        address = "auto" if os.environ.get("RAY_ADDRESS") else "local"
    kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": True, "logging_level": logging.WARNING}
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": dict(env_vars)}
    try:
        if address == "local":
            bundles = settings.bundles()
            num_cpus = settings.num_cpus if settings.num_cpus is not None else sum(b["CPU"] for b in bundles)
            num_gpus = settings.num_gpus if settings.num_gpus is not None else sum(b.get("GPU", 0.0) for b in bundles)
            ctx = ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                           include_dashboard=settings.include_dashboard, **kwargs)
            _watch_local_instance(ctx)
            return True, _url(ctx.dashboard_url)
        ctx = ray.init(address=address, **kwargs)
        return True, _url(ctx.dashboard_url)
    except Exception as e:  # ConnectionError, RuntimeError, ValueError from ray.init
        raise RuntimeError(
            f"could not {'start a local Ray instance' if address == 'local' else f'connect to Ray at {address!r}'}: "
            f"{type(e).__name__}: {e}. Set backend.address (null = local, or the cluster address), and "
            f"RAY_AUTH_MODE to match the cluster (token or disabled)."
        ) from e


_reaper: Any = None  # the watchdog of the local Ray instance this process started (rlkit.distributed.reaper)


def _watch_local_instance(ctx: Any) -> None:
    """Start the watchdog that stops this local Ray instance if this process dies without
    ``ray.shutdown()`` (SIGKILL); ``stop_ray`` ends it after a clean shutdown."""
    global _reaper
    from rlkit.distributed.reaper import start_reaper

    session_dir = (getattr(ctx, "address_info", None) or {}).get("session_dir")
    if session_dir:
        _reaper = start_reaper(os.path.basename(str(session_dir).rstrip("/")))


def stop_ray() -> None:
    """``ray.shutdown()``, then end the watchdog of a local instance (nothing left for it to stop)."""
    import ray

    global _reaper
    ray.shutdown()
    if _reaper is not None:
        _reaper.terminate()
        _reaper.wait(10)
        _reaper = None


def _url(address: str | None) -> str | None:
    if not address:
        return None
    return address if "://" in address else f"http://{address}"


def create_placement_group(settings: RaySettings, name: str, timeout_s: float) -> Any:
    """Create the placement group of ``settings.bundles()`` and wait until it is scheduled.

    Raises: PlacementGroupTimeout (a RuntimeError) listing the bundles asked for and the cluster's available
    resources when it cannot be scheduled within ``timeout_s`` seconds (the group is removed again).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = settings.bundles()
    pg = placement_group(bundles, strategy=settings.placement_strategy, name=name)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        available = ray.available_resources()
        remove_placement_group(pg)
        raise PlacementGroupTimeout(
            f"the placement group {name} ({len(bundles)} bundles of {bundles[0]}, strategy "
            f"{settings.placement_strategy}) could not be scheduled within {timeout_s:.0f}s; the cluster has "
            f"{ {k: v for k, v in available.items() if k in ('CPU', 'GPU')} } available. Lower "
            f"backend.num_workers / num_rollout_workers / cpus_per_worker / gpus_per_worker, set "
            f"backend.colocate=true, or add nodes."
        ) from None
    return pg
