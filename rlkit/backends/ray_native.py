"""backend=native_ray: the native GRPO loop with rollout and training on Ray actors (docs/distributed.md).

The driver (this process) runs NativeRun's loop unchanged: task sampling, rewards, group
advantages, the LR schedule, evaluation bookkeeping, checkpoints, resume, metrics and result.json.
What runs on workers is swapped in through NativeRun's hooks:

- ``_build_policy``: instead of a policy in this process, a RayCluster (rlkit.distributed.cluster):
  ``num_workers`` FSDP2 trainer ranks and ``num_rollout_workers`` rollout workers in one placement
  group. The driver keeps a stand-in policy (``RemotePolicy``: save/load adapter) and a shadow
  AdamW over uninitialised tensors of the LoRA shapes, so the LR scheduler and the checkpoint's
  optimizer.pt keep the single-process format (a checkpoint of either backend resumes in the other).
- ``_rollout``: the rollout workers load exactly adapter version ``step - 1`` (the weights the
  previous step's update produced; v0 = the initial adapter) and sample; every trajectory records
  that version.
- ``_update``: the trainer ranks run the data-parallel update (gradients equal the single-rank
  update's, the ``algorithm.demo_coef`` term included), then rank 0 publishes ``v<step>`` through
  ``paths.shared`` (rlkit.sync).
- ``_demonstration_trajectories`` (``algorithm.demo_coef``): the rollout workers encode the solver
  demonstrations of the step's all-fail tasks.
- ``_evaluate``: the rollout workers, on version ``step``.
- ``train_step`` with ``backend.one_step_off_policy``: step s's update is sent to the trainer ranks,
  and while they run it the driver samples step s + 1 on the rollout workers with version s - 1
  (``NativeRun._sample_batch``); then it waits for the update. Steps that end at a checkpoint (and
  the last step) do not sample ahead, so a checkpoint holds no half-made batch and a resumed run
  samples exactly what the uninterrupted one did.
- ``_save``: the optimizer state is gathered from the ranks into the shadow optimizer first.

The SFT warm start (when ``sft.enabled``) stays in the driver process, as in backend=native; its
result is cached under ``paths.cache_dir`` and the workers load it from there (on a cluster that
folder must be shared by all nodes, like ``paths.shared``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlkit.backends.native import NativeRun, SampledBatch
from rlkit.distributed.runtime import RaySettings
from rlkit.run import ConfigError
from rlkit.update import make_scheduler

log = logging.getLogger(__name__)


class RayNativeBackend:
    """conf/backend/native_ray.yaml; the keyword arguments are RaySettings' fields (see there).

    Raises: ConfigError naming the key for an invalid value.
    """

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = RaySettings(**settings)
            self.settings.validate()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"backend=native_ray: {e}") from e

    def run(self, cfg: DictConfig) -> dict:
        return RayNativeRun(cfg, self.settings).execute()


class RemotePolicy:
    """The driver's stand-in for a policy whose weights live on the trainer ranks.

    ``save_adapter`` copies the newest published version (the ranks' current weights: every update
    and the start of a run publish one); ``load_adapter`` loads a saved adapter into the ranks.
    """

    def __init__(self, run: "RayNativeRun") -> None:
        self._run = run

    def save_adapter(self, path: str | os.PathLike, version: int | None = None) -> Any:
        """Write the current adapter as a plain PEFT adapter directory at ``path`` (atomically).

        ``version`` is accepted for Policy.save_adapter's signature and not used: the copy keeps the
        published version's own number (its step) in rlkit_adapter.json.

        Returns: rlkit.policy.AdapterInfo of what was written.
        Raises: RuntimeError when nothing has been published yet.
        """
        from rlkit.policy.lora import read_adapter_info, umask_permissions
        from rlkit.sync import ADAPTER_CONFIG, ADAPTER_META, ADAPTER_WEIGHTS, version_dir

        if self._run.published_version is None:
            raise RuntimeError("no adapter version has been published yet; nothing to save")
        src = version_dir(self._run.sync_root, self._run.published_version)
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


class RayNativeRun(NativeRun):
    """NativeRun with rollout, update and evaluation on Ray workers (module doc)."""


    def __init__(self, cfg: DictConfig, settings: RaySettings) -> None:
        super().__init__(cfg)
        from rlkit.sync import run_key_for, sync_root

        self.settings = settings
        self.cluster: Any = None
        self.sync_root = sync_root(cfg.paths.shared, run_key_for(self.out))
        self.published_version: int | None = None
        self._prefetched: SampledBatch | None = None  # one_step_off_policy: the next step's batch
        self._sample_version: int | None = None  # the version rollouts load; None = step - 1

    def _route_pass_problem(self) -> str | None:
        """FSDP ranks run their forwards together and must agree on images; a route pass's second sequence has none,
        so a rank's share of text-only sequences beside another's with pictures would stop the update."""
        if self.cfg.env.get("route_context", "picture") != "text":
            return None
        s = self.settings
        if s.strategy == "fsdp" and s.num_workers > 1:
            return ("env.route_context=text trains sequences with and without pictures in one update, which FSDP ranks "
                    f"cannot split (backend.strategy=fsdp, backend.num_workers={s.num_workers}); use backend="
                    "native_ray_ddp (replicated ranks), backend.num_workers=1, or backend=native")
        return None

    # ------------------------------------------------------------------ setup
    def _build_policy(self, base_path: str | None) -> None:
        from rlkit.distributed.cluster import RayCluster
        from rlkit.distributed.workers import RolloutSpec, TrainerSpec

        cfg, s = self.cfg, self.settings
        policy_node = OmegaConf.to_container(cfg.policy, resolve=True)
        if str(policy_node.get("device", "auto")).startswith("cuda") and s.gpus_per_worker == 0:
            raise ConfigError("policy.device is cuda but backend.gpus_per_worker=0: give the workers GPUs "
                              "(backend.gpus_per_worker=1) or use policy.device=auto")
        common = dict(policy=policy_node, base_path=base_path, sync_root=str(self.sync_root),
                      threads=s.threads_per_actor, device_type=s.device_type, deterministic=self.trainer.deterministic)
        trainer_spec = TrainerSpec(algorithm=self.algo, lr=float(cfg.lr), keep_versions=s.keep_versions,
                                   mixed_precision=s.use_mixed_precision, dist_timeout_s=s.dist_timeout_s,
                                   strategy=s.strategy, **common)
        rollout_spec = RolloutSpec(env=OmegaConf.to_container(cfg.env, resolve=True), sync_timeout_s=s.sync_timeout_s,
                                   reuse_kv_cache=self.rollout_cfg.reuse_kv_cache,
                                   fixed_image_seed=self.fixed_image_seed, **common)
        self.cluster = RayCluster(s, trainer_spec, rollout_spec)
        self.cluster.start()
        self.progress.say(
            f"native_ray: {s.num_workers} trainer rank(s) "
            f"({ {'fsdp': 'FSDP2', 'ddp': 'DDP'}.get(self.cluster.strategy, self.cluster.strategy)}, "
            f"{'nccl' if s.device_type == 'cuda' else 'gloo'}) + "
            f"{s.num_rollout_workers} rollout worker(s), {'colocated' if s.colocate else 'separate'} bundles, "
            f"ready in {self.cluster.startup_s:.0f}s; adapter sync under {self.sync_root}"
            + (f"; Ray dashboard {self.cluster.dashboard_url}" if self.cluster.dashboard_url else "")
        )
        self.policy = RemotePolicy(self)
        self.engine = None
        shadow = [torch.nn.Parameter(torch.empty(shape)) for _, shape in self.cluster.param_specs]
        self.optimizer = torch.optim.AdamW(shadow, lr=cfg.lr, betas=tuple(self.algo.adam_betas),
                                           weight_decay=self.algo.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, self.algo, cfg.steps)

    def setup(self) -> None:
        """NativeRun.setup (which resumes into the ranks and the shadow optimizer), then hand a
        resumed optimizer state to the ranks and publish the starting version ``v<step>``."""
        from rlkit.sync import remove_versions_after

        super().setup()
        if self.optimizer.state:
            self.cluster.set_optimizer_state(self.optimizer.state_dict()["state"])
            self._clear_shadow_state()
        remove_versions_after(self.sync_root, self.state.step)
        self._publish(self.state.step)

    def _publish(self, version: int) -> dict[str, Any]:
        pub = self.cluster.publish(version)
        self.published_version = version
        return pub

    def _clear_shadow_state(self) -> None:
        self.optimizer.state = defaultdict(dict)

    # ---------------------------------------------------------------- steps
    def _rollout(self, step: int, seeds: list[int], sampling: Any,
                 group_size: int | None = None) -> tuple[list[Any], dict[str, float]]:
        version = step - 1 if self._sample_version is None else self._sample_version
        return self.cluster.rollout(seeds, group_size or self.cfg.group_size, sampling, version=version)

    def _update(self, step: int, trajs: list[Any], advantages: torch.Tensor,
                demonstrations: list[Any] | None = None) -> dict[str, float]:
        return self._finish_update(step, self._start_update(step, trajs, advantages, demonstrations))

    def _start_update(self, step: int, trajs: list[Any], advantages: torch.Tensor,
                      demonstrations: list[Any] | None) -> list[Any]:
        """Send step ``step``'s update to the ranks (it publishes ``v<step>``) and advance the LR
        schedule; returns the pending results for ``_finish_update``."""
        lr = self.optimizer.param_groups[0]["lr"]  # set by the scheduler on the shadow optimizer
        temperature = self.rollout_cfg.temperature if self.rollout_cfg.temperature > 0 else 1.0
        t0 = time.time()
        routes = self._route_questions(step)
        self._route_s = None if routes is None else time.time() - t0
        pending = self.cluster.start_update(trajs, advantages, self.algo, temperature, self.shuffle_gen, lr,
                                            version=step, demonstrations=demonstrations, route_questions=routes)
        with warnings.catch_warnings():
            # the shadow optimizer never steps (the ranks' optimizers do); the schedule is unaffected
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
            self.scheduler.step()
        return pending

    def _finish_update(self, step: int, pending: list[Any]) -> dict[str, float]:
        metrics = self.cluster.finish_update(pending)
        self.published_version = step
        if getattr(self, "_route_s", None) is not None:  # drawing and encoding them (their forward is the ranks')
            metrics["timing/route"] = self._route_s
        return metrics

    def _demonstration_trajectories(self, seeds: list[int]) -> list[Any]:
        # the driver holds no policy (RemotePolicy); the rollout workers have the env and the chat template
        return self.cluster.demonstrations(seeds)

    def _route_questions(self, step: int) -> list[Any] | None:
        # drawn and encoded on a rollout worker (the driver holds no policy), as NativeRun draws them
        if self.algo.route_coef <= 0:
            return None
        return self.cluster.route_questions(int(self.cfg.seed), step, self.algo.route_batch)

    def train_step(self, step: int) -> dict[str, float]:
        metrics = self._pipelined_step(step) if self.settings.one_step_off_policy else super().train_step(step)
        # the adapter's way from the trainer to the engines in this step: load (before the rollout) +
        # publish (after the update, this step's version)
        metrics["timing/sync"] = metrics.get("timing/load", 0.0) + metrics.get("timing/publish", 0.0)
        return metrics

    def _pipelined_step(self, step: int) -> dict[str, float]:
        """backend.one_step_off_policy (module doc): update on step ``step``'s batch while sampling the next.

        The batch of step s + 1 is sampled with adapter v(s - 1) (its trajectories record that
        version; ``sync/staleness`` = s - 1 - version is 1 for such a batch, 0 for a batch sampled
        after the previous update). Its metrics (reward/*, timing/rollout...) are logged with step
        s + 1; ``timing/prefetch`` is the time this step spent sampling ahead, ``timing/train`` the
        wait for the update after that, ``timing/step`` the whole step.
        """
        t0 = time.time()
        batch, self._prefetched = self._prefetched, None
        if batch is None or batch.step != step:
            batch = self._sample_batch(step)
        pending = self._start_update(step, batch.trajectories, batch.advantages, batch.demonstrations)
        prefetch_s = 0.0
        if self._may_sample_ahead(step):
            t1 = time.time()
            self._sample_version = step - 1
            try:
                self._prefetched = self._sample_batch(step + 1)
            except BaseException:
                self._settle(pending)  # the update in flight: its own error is logged, not lost
                raise
            finally:
                self._sample_version = None
            prefetch_s = time.time() - t1
        t2 = time.time()
        with self.progress.phase("update", step, self.cfg.steps):
            update = self._finish_update(step, pending)
        return {**batch.metrics, **update, "sync/staleness": float(step - 1 - batch.metrics.get("sync/version", step - 1)),
                "timing/prefetch": prefetch_s, "timing/train": time.time() - t2, "timing/step": time.time() - t0}

    def _settle(self, pending: list[Any]) -> None:
        """Wait for an update in flight when sampling ahead failed; log (not raise) its own error, so the
        sampling error, which the caller re-raises, stays the one reported."""
        try:
            self.cluster.finish_update(pending)
        except Exception as e:  # noqa: BLE001 - reported, the sampling error follows
            log.error("the update in flight when sampling ahead failed also failed: %s", e)

    def _may_sample_ahead(self, step: int) -> bool:
        """Not after the last step, nor after a step that ends at a checkpoint (the checkpoint then
        holds the sampler's state before step + 1's draw, as the resumed run will need it)."""
        interval = self.trainer.ckpt_interval
        return step < self.cfg.steps and not (interval and step % interval == 0)

    def _evaluate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        return self.cluster.evaluate(self.eval_seeds, self.greedy, version=step)

    def _evaluate_seen(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        return self.cluster.evaluate(self.seen_seeds, self.greedy, version=step, keep_trajectories=0)[:2]

    # ---------------------------------------------------------------- checkpoints
    def _save(self, step: int) -> None:
        state = self.cluster.optimizer_state()
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        try:
            super()._save(step)
        finally:
            self._clear_shadow_state()

    def execute(self) -> dict:
        try:
            return super().execute()
        finally:
            if self.cluster is not None:
                self.cluster.shutdown()

