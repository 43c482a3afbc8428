"""The options of conf/backend/skyrl.yaml: what only the SkyRL backend has (cluster shape, vLLM engines).

Everything the two backends share (algorithm, rollout, trainer, env, reward, policy) stays in its own
group; this dataclass holds the knobs that exist only because SkyRL runs vLLM and FSDP2 on a Ray cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from rlkit.errors import ConfigError


@dataclass
class SkyRLSettings:
    """conf/backend/skyrl.yaml (every key is a constructor argument of ``SkyRLBackend``).

    dry_run: compile and print the SkyRL config and command line; start nothing.
    num_nodes, gpus_per_node: the Ray cluster's GPU nodes used by the job (SkyRL
        ``trainer.placement.policy_num_nodes`` / ``policy_num_gpus_per_node``; the reference model,
        when a KL loss needs one, gets the same placement).
    colocate_all: vLLM engines and FSDP2 workers share the same GPUs (SkyRL
        ``trainer.placement.colocate_all``); vLLM sleeps while the trainer runs.
    num_inference_engines: vLLM engines (``generator.inference_engine.num_engines``); null =
        num_nodes * gpus_per_node / tensor_parallel_size (required when colocate_all is false).
    tensor_parallel_size: GPUs per vLLM engine.
    gpu_memory_utilization: vLLM's share of each GPU's memory (0 < x <= 1).
    vision_language_generator: SkyRL's multi-modal generator (``SkyRLVLMGymGenerator``), needed
        for observations with images.
    max_prompt_length: tokens allowed in a dataset prompt (``trainer.max_prompt_length``).
    max_input_length: tokens the whole multi-turn context may hold before a turn is generated
        (``generator.max_input_length``); single-turn envs use max_prompt_length.
    micro_batch_size_per_gpu: sequences per forward/backward on one GPU; null =
        min(algorithm.micro_batch_size, the per-GPU mini-batch).
    eval_batch_size: prompts per evaluation generation batch (``trainer.eval_batch_size``).
    fsdp_cpu_offload: FSDP2 parameter/optimizer offload to CPU (``trainer.policy.fsdp_config.cpu_offload``).
    max_env_workers: threads that run env.init/env.step (``environment.skyrl_gym.max_env_workers``).
    run_name: the run's name for the logger and its folder; null = ``logger.name``, else the job's
        Hydra overrides (stable across restarts of the same job, so resume finds the checkpoints).
    run_dir: where checkpoints, exports, datasets, logs and the LoRA sync folder go; null =
        ``{paths.shared}/skyrl/{project}/{run_name}`` (must be on a filesystem every node mounts).
    engine_init_kwargs: passed to vLLM's engine as is (``generator.inference_engine.engine_init_kwargs``);
        ``max_model_len`` defaults to max_input_length + rollout.max_new_tokens.

    Raises:
        ConfigError: a value out of range (the message names ``backend.<key>``).
    """

    dry_run: bool = False
    num_nodes: int = 1
    gpus_per_node: int = 1
    colocate_all: bool = True
    num_inference_engines: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.8
    vision_language_generator: bool = True
    max_prompt_length: int = 1024
    max_input_length: int = 8192
    micro_batch_size_per_gpu: int | None = None
    eval_batch_size: int = 64
    fsdp_cpu_offload: bool = False
    max_env_workers: int = 16
    run_name: str | None = None
    run_dir: str | None = None
    engine_init_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node", "tensor_parallel_size", "max_prompt_length",
                     "max_input_length", "eval_batch_size", "max_env_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"backend.{name}={value!r} must be an int >= 1")
        for name in ("num_inference_engines", "micro_batch_size_per_gpu"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"backend.{name}={value!r} must be null or an int >= 1")
        if not 0.0 < float(self.gpu_memory_utilization) <= 1.0:
            raise ConfigError(f"backend.gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]")
        if self.max_input_length < self.max_prompt_length:
            raise ConfigError(
                f"backend.max_input_length={self.max_input_length} must be >= backend.max_prompt_length="
                f"{self.max_prompt_length} (SkyRL's multi-turn context holds the first prompt)"
            )
        if not isinstance(self.engine_init_kwargs, Mapping):
            raise ConfigError(f"backend.engine_init_kwargs must be a mapping, got {self.engine_init_kwargs!r}")
        self.engine_init_kwargs = dict(self.engine_init_kwargs)

    @property
    def world_size(self) -> int:
        """GPUs of the trainer (FSDP2 data-parallel ranks; no sequence parallelism)."""
        return self.num_nodes * self.gpus_per_node

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]
