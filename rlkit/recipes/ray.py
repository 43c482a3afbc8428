"""The Ray executor: rollout workers and data-parallel trainer ranks as Ray actors (docs/distributed.md).

backend=native_ray / native_ray_ddp. The recipe runs in the driver (this process) unchanged: task sampling,
rewards, group advantages, the LR schedule, evaluation bookkeeping, checkpoints, resume, metrics and
result.json. What runs on workers:

- ``start``: a RayCluster (rlkit.distributed.cluster): ``num_workers`` trainer ranks (FSDP2, or replicated under
  strategy=ddp) and ``num_rollout_workers`` rollout workers in one placement group. The driver keeps a stand-in
  policy (``RemotePolicy``: save/load adapter) and a shadow AdamW over uninitialised tensors of the LoRA shapes,
  so the LR scheduler and the checkpoint's optimizer.pt keep the single-process format (a checkpoint of either
  backend resumes in the other).
- ``rollout``: the rollout workers load exactly adapter version ``step - 1`` (the weights the previous step's
  update produced; v0 = the initial adapter) and sample; every trajectory records that version.
- ``start_update`` / ``finish_update``: the trainer ranks run the data-parallel update (gradients equal the
  single-rank update's, the auxiliary terms included), then rank 0 publishes ``v<step>`` through
  ``paths.shared`` (rlkit.sync).
- ``demonstrations``: the rollout workers encode the solver demonstrations.
- ``evaluate``: the rollout workers, on version ``step`` (eval/pass@k too with ``eval.pass_k`` > 0).
- ``pipelined`` (``backend.one_step_off_policy``): the recipe samples step s + 1 on the rollout workers with
  version s - 1 (``sample_with``) while the ranks run step s's update.
- ``checkpoint_state``: the optimizer state is gathered from the ranks into the shadow optimizer for the save.

The one-time builds (grounding, SFT warm start) stay in the driver; their results are cached under
``paths.cache_dir`` and the workers load them from there (on a cluster that folder must be shared by all nodes,
like ``paths.shared``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.distributed.runtime import RaySettings
from rlkit.errors import ConfigError
from rlkit.recipes.executor import ExecutorContext

log = logging.getLogger(__name__)


class RemotePolicy:
    """The driver's stand-in for a policy whose weights live on the trainer ranks.

    ``save_adapter`` copies the newest published version (the ranks' current weights: every update
    and the start of a run publish one); ``load_adapter`` loads a saved adapter into the ranks.
    """

    def __init__(self, executor: "RayExecutor") -> None:
        self._run = executor

    def save_adapter(self, path: str | os.PathLike, version: int | None = None) -> Any:
        """Write the adapter after ``version`` updates (None: the newest published) as a plain PEFT adapter
        directory at ``path`` (atomically): a copy of that published version, whose rlkit_adapter.json keeps its
        number, as Policy.save_adapter(path, version) writes it.

        Returns: rlkit.policy.AdapterInfo of what was written.
        Raises: RuntimeError when nothing has been published yet, or ``version`` is not among the published
        versions still kept (backend.keep_versions).
        """
        from rlkit.policy.lora import read_adapter_info, umask_permissions
        from rlkit.sync import ADAPTER_CONFIG, ADAPTER_META, ADAPTER_WEIGHTS, version_dir

        if self._run.published_version is None:
            raise RuntimeError("no adapter version has been published yet; nothing to save")
        src = version_dir(self._run.sync_root, self._run.published_version if version is None else int(version))
        if not (src / ADAPTER_META).is_file():
            raise RuntimeError(f"adapter version {version} is not published under {self._run.sync_root} (the newest "
                               f"is {self._run.published_version}; backend.keep_versions keeps the last few)")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_META):
                shutil.copyfile(src / name, tmp / name)
            umask_permissions(tmp)
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return read_adapter_info(path)

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load a saved adapter directory into every trainer rank (resume)."""
        self._run.cluster.load_adapter(path)


class RayExecutor:
    """Rollout, update and evaluation on Ray workers (module doc; rlkit.recipes.executor.Executor).

    ``settings``: the backend's RaySettings; ``sync_root``: where the adapter versions are published
    (rlkit.sync.sync_root of ``paths.shared`` and the run folder); ``log_dir``: where the rollout workers' vLLM
    engines write their logs with rollout.engine=vllm (None: the temp dir).
    """

    def __init__(self, settings: RaySettings, sync_root: Path, log_dir: Path | None = None) -> None:
        self.settings = settings
        self.sync_root = sync_root
        self.log_dir = log_dir
        self.cluster: Any = None
        self.published_version: int | None = None
        self._sample_version: int | None = None  # the version rollouts load; None = step - 1
        self.pipelined = bool(settings.one_step_off_policy)
        self.heals = True  # a lost worker is replaced (rlkit.recipes.heal)

    def problems(self, cfg: Any) -> list[str]:
        """What this executor cannot run of ``cfg``: a CUDA policy on workers without GPUs."""
        device = str(cfg.policy.get("device", "auto"))
        if device.startswith("cuda") and self.settings.gpus_per_worker == 0:
            return ["policy.device is cuda but backend.gpus_per_worker=0: give the workers GPUs "
                    "(backend.gpus_per_worker=1) or use policy.device=auto"]
        return []

    def start(self, ctx: ExecutorContext, wait_s: float | None = None) -> None:
        """Start the cluster on the warm start at ``ctx.base_path``; the stand-in policy and the shadow AdamW.

        ``wait_s``: how long the placement group may wait for its resources (seconds; None: backend.startup_timeout_s).
        Raises: rlkit.distributed.runtime.PlacementGroupTimeout when they do not appear within it (the message
        lists the bundles and what the cluster has free); what RayCluster.start raises otherwise.
        """
        from rlkit.distributed.cluster import RayCluster
        from rlkit.distributed.workers import RolloutSpec, TrainerSpec

        s = self.settings
        self.ctx = ctx
        common = dict(policy=ctx.policy_cfg, base_path=ctx.base_path, sync_root=str(self.sync_root),
                      threads=s.threads_per_actor, device_type=s.device_type, deterministic=ctx.deterministic)
        trainer_spec = TrainerSpec(algorithm=ctx.algo, optim=ctx.optim, lr=float(ctx.lr), keep_versions=s.keep_versions,
                                   mixed_precision=s.use_mixed_precision, dist_timeout_s=s.dist_timeout_s,
                                   strategy=s.strategy, **common)
        rollout_spec = RolloutSpec(env=ctx.env_cfg, sync_timeout_s=s.sync_timeout_s, reuse_kv_cache=ctx.reuse_kv_cache,
                                   fixed_image_seed=ctx.fixed_image_seed, engine=ctx.rollout_engine,
                                   log_dir=None if self.log_dir is None else str(self.log_dir), **common)
        self.cluster = RayCluster(s, trainer_spec, rollout_spec)
        self.cluster.start(pg_timeout_s=wait_s)
        ctx.progress.say(
            f"native_ray: {s.num_workers} trainer rank(s) "
            f"({ {'fsdp': 'FSDP2', 'ddp': 'DDP'}.get(self.cluster.strategy, self.cluster.strategy)}, "
            f"{'nccl' if s.device_type == 'cuda' else 'gloo'}) + "
            f"{s.num_rollout_workers} rollout worker(s), "
            f"{'colocated' if s.colocate else 'separate'} bundles, "
            f"ready in {self.cluster.startup_s:.0f}s"
            + (f" (vLLM started in {self.cluster.engine_startup_s:.0f}s)" if self.cluster.engine_startup_s else "")
            + f"; adapter sync under {self.sync_root}"
            + (f"; Ray dashboard {self.cluster.dashboard_url}" if self.cluster.dashboard_url else ""))
        self.policy = RemotePolicy(self)
        shadow = [torch.nn.Parameter(torch.empty(shape)) for _, shape in self.cluster.param_specs]
        self.optimizer = torch.optim.AdamW(shadow, lr=ctx.lr, betas=tuple(ctx.optim.adam_betas),
                                           weight_decay=ctx.optim.weight_decay)
        self.tokenizer = ctx.base_path or ctx.policy_cfg.get("path")  # the driver holds no tokenizer: its folder

    def dead_workers(self) -> list[str]:
        """The workers of the group found gone (RayCluster.dead_workers), waiting up to backend.peer_check_s for
        Ray to tell; [] when all are alive (or none is started)."""
        if self.cluster is None or not (self.cluster.trainers or self.cluster.rollouts):
            return []
        return self.cluster.dead_workers(self.settings.peer_check_s)

    def after_setup(self, step: int) -> None:
        """Hand a resumed optimizer state to the ranks and publish the starting version ``v<step>``."""
        from rlkit.sync import remove_versions_after

        if self.optimizer.state:
            self.cluster.set_optimizer_state(self.optimizer.state_dict()["state"])
            self._clear_shadow_state()
        remove_versions_after(self.sync_root, step)
        self.cluster.publish(step)
        self.published_version = step

    def _clear_shadow_state(self) -> None:
        self.optimizer.state = defaultdict(dict)

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]:
        version = step - 1 if self._sample_version is None else self._sample_version
        return self.cluster.rollout(seeds, group_size, sampling, version=version)

    @contextlib.contextmanager
    def sample_with(self, version: int) -> Iterator[None]:
        """Rollouts inside sample with adapter ``version`` (sampling ahead of an update in flight)."""
        self._sample_version = version
        try:
            yield
        finally:
            self._sample_version = None

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        # the driver holds no policy (RemotePolicy); the rollout workers have the env and the chat template
        return self.cluster.demonstrations(seeds)

    def start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, aux_terms: list[AuxTerm],
                     generator: torch.Generator) -> list[Any]:
        """Send step ``step``'s update to the ranks at the scheduler's current lr (it publishes ``v<step>``);
        returns the pending results for ``finish_update``."""
        lr = self.optimizer.param_groups[0]["lr"]  # set by the scheduler on the shadow optimizer
        return self.cluster.start_update(trajectories, advantages, self.ctx.algo, self.ctx.temperature, generator, lr,
                                         version=step, aux_terms=aux_terms)

    def finish_update(self, step: int, pending: list[Any]) -> dict[str, float]:
        metrics = self.cluster.finish_update(pending)
        self.published_version = step
        return metrics

    def settle(self, pending: list[Any]) -> None:
        """Wait for an update in flight when sampling ahead failed; log (not raise) its own error, so the
        sampling error, which the caller re-raises, stays the one reported."""
        try:
            self.cluster.finish_update(pending)
        except Exception as e:  # noqa: BLE001 - reported, the sampling error follows
            log.error("the update in flight when sampling ahead failed also failed: %s", e)

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate on the rollout workers with adapter ``version`` (RayCluster.evaluate), pass@k
        included when ``pass_k`` > 0 (``pass_k_sampling``; worker j's seed offset as its rollouts')."""
        return self.cluster.evaluate(seeds, greedy, version=version, keep_trajectories=keep_trajectories,
                                     pass_k=pass_k, pass_k_sampling=pass_k_sampling)

    @contextlib.contextmanager
    def checkpoint_state(self) -> Iterator[None]:
        """The ranks' optimizer state in the shadow optimizer for the checkpoint, cleared after it."""
        state = self.cluster.optimizer_state()
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        try:
            yield
        finally:
            self._clear_shadow_state()

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()


def ray_settings(settings: dict[str, Any]) -> RaySettings:
    """conf/backend/native_ray.yaml's keys as RaySettings. Raises: ConfigError naming the key for a bad value."""
    try:
        out = RaySettings(**settings)
        out.validate()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"backend=native_ray: {e}") from e
    return out
