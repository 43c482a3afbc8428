"""The executor contract: where the GRPO recipe's rollouts, updates and evaluations run.

The recipe (rlkit.recipes.grpo) holds one executor and calls it; it never asks which one it holds.
``LocalExecutor`` (rlkit.recipes.local, backend=native) runs everything in this process; ``RayExecutor``
(rlkit.recipes.ray, backend=native_ray / native_ray_ddp) runs rollout workers and data-parallel trainer
ranks as Ray actors and syncs the adapter between them through a shared folder (rlkit.sync).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.config import AlgorithmConfig, OptimConfig


@dataclass
class ExecutorContext:
    """What an executor needs to start: the policy config (a plain dict) and the warm start it loads
    (``base_path``, None: the policy config's own weights), the env (its spec; its config for workers that build
    their own), the typed groups the update reads, the base lr and the sampling temperature of the logprobs
    (rollout.temperature, or 1 for greedy), whether multi-turn rollouts keep their KV cache, the fixed-image
    control's task (None: the real run), torch's determinism switch, the console (``say``), and who samples
    (``rollout_engine``: rollout.engine, a key of rlkit.engines.ENGINES: "rlkit" | "vllm")."""

    policy_cfg: Any
    base_path: str | None
    env_spec: Any
    env_cfg: dict[str, Any]
    algo: AlgorithmConfig
    optim: OptimConfig
    lr: float
    temperature: float
    reuse_kv_cache: bool
    fixed_image_seed: int | None
    deterministic: bool
    progress: Any
    rollout_engine: str = "rlkit"


class AdapterHolder(Protocol):
    """An executor's ``policy`` as the recipe uses it: the trained adapter saved to and loaded from a folder."""

    def save_adapter(self, path: str | os.PathLike, version: int | None = None) -> Any:
        """Write the adapter after ``version`` updates (None: the current one) as a PEFT adapter folder at ``path``;
        returns rlkit.policy.AdapterInfo."""
        ...

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load a saved adapter folder (resume)."""
        ...


class Executor(Protocol):
    """Where a GRPO run's work runs (module doc): everything rlkit.recipes.grpo.GRPORecipe, rlkit.recipes.heal and
    rlkit.recipes.pipeline call on it, no more (tests/recipes/test_executor_contract.py checks both executors
    against it, and the recipe against it). An executor with nothing to do for a member implements it as a no-op.

    After ``start``: ``policy`` (save_adapter / load_adapter), ``optimizer`` (the one checkpoints hold; its lr is
    the scheduler's), ``tokenizer`` (the policy's, or, for an executor that holds no policy in this process, the
    checkpoint folder to load it from; None: no tokenizer to check answers with). ``pipelined``: the recipe samples
    step s + 1 (inside ``sample_with(s - 1)``) while step s's update runs. ``heals``: its workers can be lost and
    replaced (``shutdown`` then ``start`` again, ``wait_s`` seconds at most for the new group's resources;
    rlkit.recipes.heal); ``dead_workers()`` names those found gone after a worker raised."""

    pipelined: bool
    heals: bool
    policy: AdapterHolder
    optimizer: torch.optim.Optimizer
    tokenizer: Any  # PreTrainedTokenizerBase | str (a checkpoint folder) | None

    def problems(self, cfg: Any) -> list[str]:
        """What this executor cannot run of ``cfg`` (a composed train config), one line each with its fix."""
        ...

    def start(self, ctx: ExecutorContext, wait_s: float | None = None) -> None:
        """Build the policy, its engine(s) and the optimizer from ``ctx`` (``ctx.env_spec`` is the spec every
        rollout, evaluation and demonstration uses); ``wait_s``: seconds its resources may take to appear."""
        ...

    def dead_workers(self) -> list[str]:
        """The workers found gone after a worker raised ([] without workers)."""
        ...

    def after_setup(self, step: int) -> None:
        """The run starts (fresh or resumed) at ``step``: make the adapter of ``step`` updates the one sampled."""
        ...

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]:
        """``group_size`` samples of each task in ``seeds`` with the adapter after ``step - 1`` updates (or the
        version ``sample_with`` names): (B*G trajectories, groups contiguous; extra metrics)."""
        ...

    def sample_with(self, version: int) -> contextlib.AbstractContextManager[None]:
        """Rollouts inside sample with adapter ``version`` (a pipelined executor samples ahead of an update in
        flight); a no-op for an executor that never samples ahead."""
        ...

    def settle(self, pending: Any) -> None:
        """Sampling ahead failed while ``pending`` (``start_update``'s) was in flight: wait for it and log, not raise,
        its own error; a no-op where the update is done when ``start_update`` returns."""
        ...

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        """The solver's demonstration trajectory of each seed (rlkit.demonstrations), the unsolved ones left out."""
        ...

    def start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, aux_terms: list[AuxTerm],
                     generator: torch.Generator) -> Any:
        """Start step ``step``'s GRPO update (advantages [N] float32, one per trajectory) at the optimizer's current
        lr; returns what ``finish_update`` takes."""
        ...

    def finish_update(self, step: int, pending: Any) -> dict[str, float]:
        """Wait for the update ``pending`` names; its policy/* (and sync/*, timing/*) metrics."""
        ...

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate's (metrics, per-task outcomes, the first ``keep_trajectories`` trajectories) on
        ``seeds`` with adapter ``version``, pass@k included when ``pass_k`` > 0."""
        ...

    def checkpoint_state(self) -> contextlib.AbstractContextManager[None]:
        """Inside, ``optimizer`` holds the whole optimizer state, for a checkpoint."""
        ...

    def shutdown(self) -> None:
        """Stop what ``start`` started (idempotent)."""
        ...
