"""The local executor: the policy, its rollout engine and the optimizer in this process (CPU, or one GPU).

backend=native. The weights the engine samples with are the ones the update changes, so a step's rollouts
always use the adapter after ``step - 1`` updates (policy_version ``step - 1``). With rlkit's engine
(``rollout.engine=rlkit``) nothing is published. With ``rollout.engine=vllm`` the engine is vLLM in a process of its
own (rlkit.policy.vllm_engine): the adapter reaches it as on Ray, through the shared folder (rlkit.sync): the start
and every update publish version ``v<step>``, and before each rollout or evaluation the engine loads the version it
samples with (a new LoRA id per version), so vLLM samples exactly the weights rlkit's engine would.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.demonstrations import demonstration_trajectories
from rlkit.evaluation import evaluate
from rlkit.faults import maybe_crash
from rlkit.plugins import instantiate_plugin
from rlkit.policy import make_engine
from rlkit.recipes.executor import ExecutorContext
from rlkit.rollout import rollout
from rlkit.update import grpo_update


class LocalExecutor:
    """Rollout, update, evaluation and demonstrations in this process (rlkit.recipes.executor.Executor).

    ``sync_root``: where ``rollout.engine=vllm`` publishes the adapter versions (rlkit.sync.sync_root of
    ``paths.shared``; None: a temporary folder, removed at shutdown). ``log_dir``: where vLLM's log goes
    (``vllm_engine.log``; None: the temp dir). Both unused with rlkit's engine.
    """

    pipelined = False  # samples the next step only after the update (the engine holds the updated weights)
    heals = False  # no worker to lose: a failure here is the run's own

    def __init__(self, sync_root: str | Path | None = None, log_dir: str | Path | None = None) -> None:
        self.sync_root = None if sync_root is None else Path(sync_root)
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.engine: Any = None
        self._tmp_root: Path | None = None
        self._engine_version: int | None = None
        self._startup_metric: dict[str, float] = {}

    def problems(self, cfg: Any) -> list[str]:
        """What this executor cannot run of ``cfg`` (nothing: the local loop runs every option)."""
        return []

    def start(self, ctx: ExecutorContext, wait_s: float | None = None) -> None:
        """Build the policy (LoRA on the warm start at ``ctx.base_path``), its engine and AdamW (``wait_s``: unused,
        there are no resources to wait for)."""
        self.ctx = ctx
        self.policy = instantiate_plugin(ctx.policy_cfg, "policy", base_path=ctx.base_path, train_mode="lora")
        if getattr(ctx, "rollout_engine", "rlkit") == "vllm":
            from rlkit.policy.vllm_engine import VllmEngine, max_images_for

            if self.sync_root is None:
                self._tmp_root = self.sync_root = Path(tempfile.mkdtemp(prefix="rlkit-sync-"))
            self.engine = VllmEngine(self.policy, max_images=max_images_for(ctx.env_spec),
                                     prefix_caching=ctx.reuse_kv_cache, threads=torch.get_num_threads(),
                                     log_path=None if self.log_dir is None else self.log_dir / "vllm_engine.log")
            ctx.progress.say(f"rollout.engine=vllm: vLLM starting in process {self.engine.pid} (log "
                             f"{self.engine.log_path}); adapter versions under {self.sync_root}")
        else:
            self.engine = make_engine(self.policy, reuse_kv=ctx.reuse_kv_cache)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=ctx.lr, betas=tuple(ctx.optim.adam_betas),
                                           weight_decay=ctx.optim.weight_decay)
        self.tokenizer = self.policy.tokenizer

    def dead_workers(self) -> list[str]:
        """No workers to lose: []."""
        return []

    @property
    def _vllm(self) -> bool:
        return getattr(self.ctx, "rollout_engine", "rlkit") == "vllm"

    def after_setup(self, step: int) -> None:
        """rlkit's engine samples from the live weights: nothing to do. vLLM: publish the starting weights (fresh or
        resumed) as ``v<step>``, dropping versions an abandoned run left after it."""
        if self._vllm:
            from rlkit.sync import remove_versions_after

            remove_versions_after(self.sync_root, step)
            self._publish(step)

    def _publish(self, version: int) -> float:
        """Publish the live adapter as ``v<version>`` (rlkit.sync.publish_adapter); seconds."""
        from rlkit.policy.lora import adapter_payload
        from rlkit.sync import publish_adapter

        tensors, config = adapter_payload(self.policy.model, self.policy.checkpoint)
        return publish_adapter(self.sync_root, version, tensors, config, base_model=self.policy.checkpoint,
                               keep_versions=2).seconds

    def _load(self, version: int) -> dict[str, float]:
        """Make ``v<version>`` vLLM's adapter (verified against its manifest first); timing/load, the engine's start-up
        on its first use, and the probe's largest logprob difference when one ran."""
        from rlkit.sync import verify_version, version_dir

        out: dict[str, float] = {"timing/load": 0.0}  # 0: the version was live already
        if self.engine.startup_s is None:
            self._startup_metric = {"timing/engine_startup": self.engine.wait_ready()}  # logged with the next rollout
            self.ctx.progress.say(f"rollout.engine=vllm: vLLM ready after {self.engine.startup_s:.0f} s "
                                  f"({', '.join(f'{k} {v}' for k, v in self.engine.versions.items())})")
        if self._engine_version != version:
            t0 = time.perf_counter()
            verify_version(self.sync_root, version)
            self.engine.load_adapter(version_dir(self.sync_root, version))
            self._engine_version = version
            out["timing/load"] = time.perf_counter() - t0
        out["sync/version"] = float(version)
        return out

    def _probe_metrics(self) -> dict[str, float]:
        p = getattr(self.engine, "last_probe", None)
        return {} if not p else {"sync/probe_logprob_diff": float(p["max_logprob_diff"])}

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]:
        """``group_size`` samples of each task in ``seeds`` (B*G trajectories, groups contiguous) with the adapter
        after ``step - 1`` updates; with vLLM, that version's load and probe metrics."""
        if not self._vllm:
            return rollout(self.ctx.env_spec, self.policy, self.engine, seeds, group_size, sampling,
                           policy_version=step - 1), {}
        extra = self._load(step - 1)
        trajs = rollout(self.ctx.env_spec, self.policy, self.engine, seeds, group_size, sampling, policy_version=step - 1)
        extra.update(self._startup_metric)
        self._startup_metric = {}
        return trajs, {**extra, **self._probe_metrics()}

    @contextlib.contextmanager
    def sample_with(self, version: int) -> Iterator[None]:
        """Nothing to do: this executor never samples ahead (``pipelined`` is False), its engine samples the live
        weights."""
        yield

    def settle(self, pending: dict[str, float]) -> None:
        """Nothing to wait for: the update is done when ``start_update`` returns."""

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        """The solver's demonstration trajectory of each seed, the unsolved ones left out."""
        return demonstration_trajectories(self.ctx.env_spec, self.policy, seeds)

    def start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, aux_terms: list[AuxTerm],
                     generator: torch.Generator) -> dict[str, float]:
        """The whole GRPO update, now (rlkit.update.grpo_update); its policy/* metrics are the pending result. With
        vLLM, the updated adapter is then published as ``v<step>`` (timing/publish)."""
        metrics = grpo_update(self.policy, self.optimizer, trajectories, advantages, self.ctx.algo,
                              temperature=self.ctx.temperature, generator=generator,
                              on_backward=lambda: maybe_crash("update", step), aux_terms=aux_terms)
        if self._vllm:
            metrics["timing/publish"] = self._publish(step)
        return metrics

    def finish_update(self, step: int, pending: dict[str, float]) -> dict[str, float]:
        """The update ran in ``start_update``: its metrics."""
        return pending

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate's (metrics, per_task, trajectories) on ``seeds``, greedy (with vLLM: adapter
        ``v<version>``)."""
        if self._vllm:
            self._load(version)
        metrics, per_task, trajs = evaluate(self.ctx.env_spec, self.policy, self.engine, seeds, greedy,
                                            policy_version=version, pass_k=pass_k, pass_k_sampling=pass_k_sampling)
        return metrics, per_task, trajs[:keep_trajectories] if keep_trajectories else []

    @contextlib.contextmanager
    def checkpoint_state(self) -> Iterator[None]:
        """The optimizer already holds its state here."""
        yield

    def shutdown(self) -> None:
        """Stop vLLM's process (rlkit's engine runs in this one) and remove a temporary sync folder."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        if self._tmp_root is not None:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            self._tmp_root = None
