"""Typed schemas of the config groups the GRPO loop reads field by field.

Registered in Hydra's ConfigStore as the base of conf/train.yaml (``rlkit_train_schema``), so a
typo in any of these groups (``algorithm.eps_clip_hihg=0.3``) or an unknown top-level key fails at
compose time with Hydra's error. Plug-in groups (env, reward, policy, logger, backend) are
instantiated from their ``_target_``; their keys are constructor arguments, so an unknown key fails
with a TypeError naming it when the run starts (``rlkit.run.instantiate_plugin``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class AlgorithmConfig:
    """GRPO hyperparameters (rlkit/algorithms/grpo.py documents the math and its sources).

    Batch geometry: a step samples ``tasks_per_step`` tasks x ``group_size`` samples = N sequences.
    The update makes ``update_epochs`` passes; each pass splits the N sequences into mini-batches of
    ``mini_batch_size`` sequences (one optimizer step each), each computed in micro-batches of
    ``micro_batch_size`` sequences (gradient accumulation).
    """

    name: str = "grpo"
    norm_adv_by_std: bool = True  # False = Dr. GRPO
    adv_eps: float = 1e-6
    filter_zero_variance_groups: bool = False  # DAPO dynamic-sampling style: drop groups with no signal
    # DAPO dynamic sampling: up to this many extra rollout rounds per step (tasks_per_step new tasks
    # each) until tasks_per_step groups with differing rewards are found; the update trains on those
    # groups only. 0 = off. Reward/env metrics stay over everything sampled.
    dynamic_sampling_max_rounds: int = 0
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28  # DAPO clip-higher
    clip_ratio_c: Optional[float] = None  # dual clip; None = off
    loss_reduction: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum
    kl_coef: float = 0.0  # KL-to-reference loss coefficient; 0 = reference never computed
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    update_epochs: int = 1
    mini_batch_size: Optional[int] = None  # None = the whole step's batch (one optimizer step per epoch)
    micro_batch_size: int = 8
    # Shared-prefix update (native backends): the samples of a group in one micro-batch run their
    # common prompt (image + text; the longest common token prefix with the same images) once and
    # share its KV cache; same logprobs, loss and gradients as the full-sequence forward within
    # float32 rounding, fewer FLOPs. Each mini-batch is ordered group by group before it is cut
    # into micro-batches, so a micro-batch holds whole groups where micro_batch_size allows (a
    # group cut by a micro-batch boundary recomputes its prefix in each part). Falls back to the
    # full-sequence forward with FSDP over > 1 rank and with gradient checkpointing (see
    # rlkit.update). SkyRL computes its own forward; this switch does not apply there.
    shared_prefix: bool = True
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    lr_schedule: str = "constant"  # constant | cosine


@dataclass
class RolloutConfig:
    """Sampling for training rollouts and greedy evaluation (units: tokens)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 48  # per policy turn
    eval_temperature: float = 0.0  # 0 = greedy


@dataclass
class TrainerConfig:
    """Loop cadence, checkpoints and resume."""

    eval_interval: int = 10  # steps; 0 = only before and after training
    eval_before_train: bool = True
    ckpt_interval: int = 10  # steps; 0 = only the final checkpoint
    max_ckpts_to_keep: int = 2
    export_interval: int = 0  # steps between plain-PEFT adapter exports; 0 = only at the end
    resume_mode: str = "latest"  # latest | none | from_path
    resume_path: Optional[str] = None
    overwrite: bool = False  # resume_mode=none into a dir with checkpoints
    num_threads: Optional[int] = None  # torch intra-op threads; None = 1 (tiny models; shared cores)
    deterministic: bool = False
    quiet: bool = False  # no progress bars (CI)


@dataclass
class SFTConfig:
    """Supervised warm start from solver demonstrations on training seeds (never evaluation seeds).

    Trains the full weights of the base policy (the analogue of the VisGym SFT checkpoint) until the
    greedy success on ``val_tasks`` held-out training seeds reaches ``target_success`` (checked every
    ``eval_every`` optimizer steps) or ``max_steps`` is reached. The result is cached under
    ``paths.cache_dir/sft/<hash of this config, the env and the policy>`` and reused.
    """

    enabled: bool = True
    num_demos: int = 4000  # size of a fixed demonstration pool; 0 = a fresh batch of tasks every step
    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    target_success: float = 0.45
    val_tasks: int = 64
    eval_every: int = 50
    seed: int = 1234


@dataclass
class EvalConfig:
    """Evaluation on the env's fixed evaluation set."""

    num_tasks: Optional[int] = None  # None = the whole set (64 for visgym_easy_64); smoke uses a few
    pass_k: int = 0  # >0: also sample k times per task at rollout.temperature and report pass@k


@dataclass
class PathsConfig:
    output_dir: str = MISSING  # this job's folder (hydra's runtime output dir)
    cache_dir: str = MISSING  # built tiny models and SFT checkpoints, shared by jobs
    shared: str = MISSING  # shared filesystem for adapter sync (/shared on HyperPod)


@dataclass
class TrainConfig:
    """Root of conf/train.yaml. Top-level knobs are the ones people sweep."""

    seed: int = 0
    lr: float = 1e-4
    steps: int = 40
    group_size: int = 8
    tasks_per_step: int = 8
    env: Any = MISSING
    reward: Any = MISSING
    policy: Any = MISSING
    backend: Any = MISSING
    logger: Any = MISSING
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="rlkit_train_schema", node=TrainConfig)


register_configs()
