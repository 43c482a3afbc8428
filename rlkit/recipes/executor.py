"""The executor contract: where the GRPO recipe's rollouts, updates and evaluations run.

The recipe (rlkit.recipes.grpo) holds one executor and calls it; it never asks which one it holds.
``LocalExecutor`` (rlkit.recipes.local, backend=native) runs everything in this process; ``RayExecutor``
(rlkit.recipes.ray, backend=native_ray / native_ray_ddp) runs rollout workers and data-parallel trainer
ranks as Ray actors and syncs the adapter between them through a shared folder (rlkit.sync).
"""

from __future__ import annotations

import contextlib
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
    (``rollout_engine``: "rlkit" | "vllm", rollout.engine)."""

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


class Executor(Protocol):
    """Where a GRPO run's work runs (module doc). After ``start``: ``policy`` (save_adapter / load_adapter),
    ``optimizer`` (the one checkpoints hold), ``tokenizer`` (the policy's, or a checkpoint folder to load it
    from). ``pipelined``: the recipe samples step s + 1 while step s's update runs. ``heals``: its workers can
    be lost and replaced (``shutdown`` then ``start`` again, ``wait_s`` seconds at most for the new group's
    resources; rlkit.recipes.heal); ``dead_workers()`` names those found gone after a worker raised."""

    pipelined: bool
    heals: bool
    policy: Any
    optimizer: torch.optim.Optimizer
    tokenizer: Any

    def problems(self, cfg: Any) -> list[str]: ...

    def start(self, ctx: ExecutorContext, wait_s: float | None = None) -> None: ...

    def dead_workers(self) -> list[str]: ...

    def after_setup(self, step: int) -> None: ...

    def rollout(self, step: int, seeds: list[int], sampling: Any, group_size: int) -> tuple[list[Any], dict[str, float]]: ...

    def demonstrations(self, seeds: list[int]) -> list[Any]: ...

    def start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, aux_terms: list[AuxTerm],
                     generator: torch.Generator) -> Any: ...

    def finish_update(self, step: int, pending: Any) -> dict[str, float]: ...

    def evaluate(self, seeds: list[int], greedy: Any, version: int, pass_k: int = 0, pass_k_sampling: Any = None,
                 keep_trajectories: int = 8) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]: ...

    def checkpoint_state(self) -> contextlib.AbstractContextManager[None]: ...

    def shutdown(self) -> None: ...
