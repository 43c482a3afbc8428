"""The local executor: the policy, its rollout engine and the optimizer in this process (CPU, or one GPU).

backend=native. The weights the engine samples with are the ones the update changes, so a step's rollouts
always use the adapter after ``step - 1`` updates (policy_version ``step - 1``) and nothing is published.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.evaluation import evaluate
from rlkit.faults import maybe_crash
from rlkit.plugins import instantiate_plugin
from rlkit.policy import make_engine
from rlkit.recipes.executor import ExecutorContext
from rlkit.rollout import rollout
from rlkit.stages.sft import demonstration_trajectories
from rlkit.update import grpo_update


class LocalExecutor:
    """Rollout, update, evaluation and demonstrations in this process (rlkit.recipes.executor.Executor)."""

    pipelined = False  # samples the next step only after the update (the engine holds the updated weights)
    heals = False  # no worker to lose: a failure here is the run's own

    def problems(self, cfg: Any) -> list[str]:
        """What this executor cannot run of ``cfg`` (nothing: the local loop runs every option)."""
        return []

    def start(self, ctx: ExecutorContext) -> None:
        """Build the policy (LoRA on the warm start at ``ctx.base_path``), its engine and AdamW."""
        self.ctx = ctx
        self.policy = instantiate_plugin(ctx.policy_cfg, "policy", base_path=ctx.base_path, train_mode="lora")
        self.engine = make_engine(self.policy, reuse_kv=ctx.reuse_kv_cache)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=ctx.lr, betas=tuple(ctx.optim.adam_betas),
                                           weight_decay=ctx.optim.weight_decay)
        self.tokenizer = self.policy.tokenizer

    def after_setup(self, step: int) -> None:
        """Nothing to publish: the engine samples from the live weights."""

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]:
        """``group_size`` samples of each task in ``seeds`` (B*G trajectories, groups contiguous) with the adapter
        after ``step - 1`` updates; no extra metrics."""
        return rollout(self.ctx.env_spec, self.policy, self.engine, seeds, group_size, sampling,
                       policy_version=step - 1), {}

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        """The solver's demonstration trajectory of each seed, the unsolved ones left out."""
        return demonstration_trajectories(self.ctx.env_spec, self.policy, seeds)

    def start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, aux_terms: list[AuxTerm],
                     generator: torch.Generator) -> dict[str, float]:
        """The whole GRPO update, now (rlkit.update.grpo_update); its policy/* metrics are the pending result."""
        return grpo_update(self.policy, self.optimizer, trajectories, advantages, self.ctx.algo,
                           temperature=self.ctx.temperature, generator=generator,
                           on_backward=lambda: maybe_crash("update", step), aux_terms=aux_terms)

    def finish_update(self, step: int, pending: dict[str, float]) -> dict[str, float]:
        return pending

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate's (metrics, per_task, trajectories) on ``seeds``, greedy."""
        metrics, per_task, trajs = evaluate(self.ctx.env_spec, self.policy, self.engine, seeds, greedy,
                                            policy_version=version, pass_k=pass_k, pass_k_sampling=pass_k_sampling)
        return metrics, per_task, trajs[:keep_trajectories] if keep_trajectories else []

    @contextlib.contextmanager
    def checkpoint_state(self) -> Iterator[None]:
        """The optimizer already holds its state here."""
        yield

    def shutdown(self) -> None:
        """Nothing runs outside this process."""
