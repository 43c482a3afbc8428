"""The local executor: the policy, its rollout engine and the optimizer in this process (CPU, or one GPU).

backend=native. The weights the engine samples with are the ones the update changes, so a step's rollouts
always use the adapter after ``step - 1`` updates (policy_version ``step - 1``). The engine is
rlkit.engines.open_engine's for ``rollout.engine``: the start and every update publish version ``v<step>`` for it,
and before each rollout or evaluation it loads the version it samples with. With rlkit's engine, which samples the
live weights, both do nothing; vLLM, in a process of its own, gets each version as on Ray, through the shared folder
(rlkit.sync), so it samples exactly the weights rlkit's engine would.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.demonstrations import demonstration_trajectories
from rlkit.engines import EngineHandle, open_engine
from rlkit.evaluation import evaluate
from rlkit.faults import maybe_crash
from rlkit.plugins import instantiate_plugin
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
        self.engine: EngineHandle | None = None

    def problems(self, cfg: Any) -> list[str]:
        """What this executor cannot run of ``cfg`` (nothing: the local loop runs every option)."""
        return []

    def start(self, ctx: ExecutorContext, wait_s: float | None = None) -> None:
        """Build the policy (LoRA on the warm start at ``ctx.base_path``), its engine (rlkit.engines.open_engine) and
        AdamW (``wait_s``: unused, there are no resources to wait for)."""
        self.ctx = ctx
        self.policy = instantiate_plugin(ctx.policy_cfg, "policy", base_path=ctx.base_path, train_mode="lora")
        self.engine = open_engine(ctx.rollout_engine, self.policy, ctx.env_spec, reuse_kv=ctx.reuse_kv_cache,
                                  threads=torch.get_num_threads(), sync_root=self.sync_root,
                                  log_path=None if self.log_dir is None else self.log_dir / "vllm_engine.log",
                                  say=ctx.progress.say)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=ctx.lr, betas=tuple(ctx.optim.adam_betas),
                                           weight_decay=ctx.optim.weight_decay)
        self.tokenizer = self.policy.tokenizer

    def dead_workers(self) -> list[str]:
        """No workers to lose: []."""
        return []

    def after_setup(self, step: int) -> None:
        """Publish the starting weights (fresh or resumed) as ``v<step>`` for the engine (EngineHandle.publish: a
        no-op with rlkit's engine)."""
        self.engine.publish(step)

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]:
        """``group_size`` samples of each task in ``seeds`` (B*G trajectories, groups contiguous) with the adapter
        after ``step - 1`` updates, and the engine's metrics: that version's load, its own (none with rlkit's
        engine; rlkit.engines)."""
        loaded = self.engine.load_version(step - 1)
        trajs = rollout(self.ctx.env_spec, self.policy, self.engine.engine, seeds, group_size, sampling,
                        policy_version=step - 1)
        return trajs, {**loaded, **self.engine.metrics()}

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
        """The whole GRPO update, now (rlkit.update.grpo_update); its policy/* metrics are the pending result. The
        updated adapter is then published as ``v<step>`` for the engine (with vLLM: timing/publish)."""
        metrics = grpo_update(self.policy, self.optimizer, trajectories, advantages, self.ctx.algo,
                              temperature=self.ctx.temperature, generator=generator,
                              on_backward=lambda: maybe_crash("update", step), aux_terms=aux_terms)
        metrics.update(self.engine.publish(step))
        return metrics

    def finish_update(self, step: int, pending: dict[str, float]) -> dict[str, float]:
        """The update ran in ``start_update``: its metrics."""
        return pending

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate's (metrics, per_task, trajectories) on ``seeds``, greedy, with adapter
        ``v<version>`` loaded into the engine."""
        self.engine.load_version(version)
        metrics, per_task, trajs = evaluate(self.ctx.env_spec, self.policy, self.engine.engine, seeds, greedy,
                                            policy_version=version, pass_k=pass_k, pass_k_sampling=pass_k_sampling)
        return metrics, per_task, trajs[:keep_trajectories] if keep_trajectories else []

    @contextlib.contextmanager
    def checkpoint_state(self) -> Iterator[None]:
        """The optimizer already holds its state here."""
        yield

    def shutdown(self) -> None:
        """Close the engine (vLLM: its process and a temporary sync folder)."""
        if self.engine is not None:
            self.engine.close()
