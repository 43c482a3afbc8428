"""Typed schemas of the config groups the GRPO loop reads field by field.

Registered in Hydra's ConfigStore as the base of conf/train.yaml (``rlkit_train_schema``), so a
typo in any of these groups (``algorithm.eps_clip_hihg=0.3``) or an unknown top-level key fails at
compose time with Hydra's error. Plug-in groups (env, reward, policy, logger, backend) are
instantiated from their ``_target_``; their keys are constructor arguments, so an unknown key fails
with a TypeError naming it when the run starts (``rlkit.plugins.instantiate_plugin``). The sampling
strategy is named by ``_target_`` too, and checked before any build (rlkit.sampling.strategies).
Importing this module registers the schema (``register_configs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from rlkit.cache_dir import register_resolver
from rlkit.types import SupportsStopStrings


@dataclass
class AlgorithmConfig:
    """GRPO hyperparameters (rlkit/algorithms/grpo.py documents the math and its sources).

    Batch geometry: a step samples ``tasks_per_step`` tasks x ``group_size`` samples = N sequences.
    The update makes ``update_epochs`` passes; each pass splits the N sequences into mini-batches of
    ``mini_batch_size`` sequences (one optimizer step each; with the shared-prefix update, whole
    groups packed up to ``mini_batch_size``), each computed in micro-batches of ``micro_batch_size``
    sequences (gradient accumulation).
    """

    name: str = "grpo"
    norm_adv_by_std: bool = True  # False = Dr. GRPO
    adv_eps: float = 1e-6
    filter_zero_variance_groups: bool = False  # DAPO dynamic-sampling style: drop groups with no signal
    # DAPO overlong filtering (Yu et al. 2025, section 3.4; SkyRL's generator.apply_overlong_filtering):
    # trajectories with a turn cut at rollout.max_new_tokens (no end-of-turn token) are left out of the
    # update's loss. Their rewards still count in their group's advantages and in the logged metrics.
    overlong_filtering: bool = False
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
    # common prompt (image + text) once and share its KV cache; same logprobs, loss and gradients as the
    # full-sequence forward within float32 rounding (rlkit.update). SkyRL computes its own forward.
    shared_prefix: bool = True
    # Identical samples run once (native backends), weighted by their number (rlkit.update.identical_samples);
    # same loss and gradients within float rounding. SkyRL computes its own forward.
    dedup_identical_samples: bool = True
    max_grad_norm: float = 1.0  # 0 = no clipping (the norm is still logged)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule for the GRPO update (the base lr is the top-level ``lr``)."""

    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    warmup_steps: int = 0  # GRPO steps of linear warmup
    lr_schedule: str = "constant"  # constant | cosine (to 0 at ``steps``; rlkit.algorithms.schedules)


@dataclass
class AuxLossConfig:
    """Auxiliary supervised terms of the GRPO update (conf/aux_loss/; rlkit.algorithms.nll.AuxTerm).

    ``demo_coef`` > 0: the demonstration loss on the tasks RL cannot reach (after ReLIFT, Ma et al. 2025,
    "Learning What Reinforcement Learning Can't"): each step, the tasks whose group had at most
    ``demo_max_successes`` successes (0: the all-fail ones) get the env's solver demonstration
    (rlkit.types.SupportsDemonstrations), and demo_coef x its mean NLL per token joins the update's first
    optimizer step; at most ``demo_max_tasks`` a step. Native backends only.
    """

    demo_coef: float = 0.0
    demo_max_tasks: int = 16
    demo_max_successes: int = 0


@dataclass
class RolloutConfig:
    """Sampling for training rollouts and greedy evaluation (units: tokens)."""

    temperature: float = 0.7  # conf/train.yaml's CPU default (the tiny policy's recipe); SkyRL's examples use 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 48  # per policy turn
    eval_temperature: float = 0.0  # 0 = greedy
    # strings that end a policy turn as soon as its text contains one (as vLLM's `stop`; the turn is then
    # closed with the end-of-turn token, loss mask 0). null = the env's (EnvSpec.stop_strings, e.g. VisGym's
    # "</answer>"); [] = only the end-of-turn token ends a turn.
    stop: Optional[list[str]] = None
    # multi-turn episodes keep their KV cache (and image encodings) across turns and prefill only the
    # new user turn (native backends; same tokens and logprobs as re-prefilling, rlkit.policy.engine;
    # under backend=skyrl vLLM caches prefixes itself). May change on resume.
    reuse_kv_cache: bool = True
    # who samples the rollouts and greedy evaluations of the native backends: rlkit (rlkit.policy.engine, in the policy's
    # process) | vllm (vLLM's CPU engine in a process of its own from .venv-vllm, the adapter hot-swapped in at every
    # version; rlkit.policy.vllm_engine). backend=skyrl samples with SkyRL's own vLLM engines whatever this says.
    engine: str = "rlkit"


def stop_strings(rollout: Any, env_spec: Any) -> tuple[str, ...]:
    """The stop strings of a run: ``rollout.stop``, or, when that is null, the env's ``stop_strings``
    (rlkit.types.SupportsStopStrings; none, ``()``, for an env without them)."""
    stop = rollout.get("stop") if hasattr(rollout, "get") else getattr(rollout, "stop", None)
    if stop is None:
        return tuple(env_spec.stop_strings) if isinstance(env_spec, SupportsStopStrings) else ()
    return tuple(stop)


@dataclass
class TrainerConfig:
    """Loop cadence, checkpoints and resume."""

    eval_interval: int = 10  # steps; 0 = only before and after training
    eval_before_train: bool = True
    ckpt_interval: int = 10  # steps; 0 = only the final checkpoint
    max_ckpts_to_keep: int = 2  # native backends: 0 = keep all; SkyRL: -1 = keep all
    export_interval: int = 0  # steps between plain-PEFT adapter exports; 0 = only at the end
    resume_mode: str = "latest"  # latest | none | from_path
    resume_path: Optional[str] = None
    overwrite: bool = False  # resume_mode=none into a dir with checkpoints
    num_threads: Optional[int] = None  # torch intra-op threads; None = 1 (tiny models; shared cores)
    # torch intra-op threads of the one-time builds (grounding stage, SFT warm start), which run alone in the
    # driver before the rollout and trainer workers start; None = $OMP_NUM_THREADS when set (the Ray launcher
    # sets it for a job to its entrypoint_num_cpus), else the cores this process may use under its cgroup's
    # CPU quota (rlkit.recipes.threads.build_threads). Training then uses num_threads. A build's numbers depend on
    # its thread count (float summation order), which its record keeps; the key does not (the same inputs).
    # A chain's stages (sft.start_from_*) are built with this job's value, whatever their own configs say.
    build_threads: Optional[int] = None
    deterministic: bool = False
    quiet: bool = False  # no progress bars (CI)
    # A worker (rollout worker, trainer rank) that dies or hangs (backend.call_timeout_s) is replaced this many
    # times in a job: the workers restart and the run goes on from its latest checkpoint, exactly (rlkit.recipes.heal).
    # 0 = stop at the first loss, saying which step a rerun resumes from. Backends with workers only.
    max_failures: int = 2
    # How long the new worker group of such a restart may wait for its resources (seconds, in all): a replacement
    # node still joining the cluster (HyperPod replaces a faulty one). Past it the run stops; a rerun resumes.
    restart_wait_s: float = 1800.0


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
    # constant | cosine: after the warmup, a half cosine from lr to 0 at max_steps (a stop at
    # target_success before max_steps ends the stage earlier, at a higher lr)
    lr_schedule: str = "constant"
    target_success: float = 0.45
    # The stop also needs val success >= the val tasks' answer prior + this (rlkit.evaluation.answer_prior: the best
    # success one fixed answer reaches on them), so a warm start that learned an answer prior, not to read, trains
    # on. 0: target_success alone (the rule before issue 75).
    answer_prior_margin: float = 0.1
    val_tasks: int = 64
    eval_every: int = 25
    seed: int = 1234
    # N > 0: N questions of the grounding stage's tasks (grounding.tasks, e.g. walls) join
    # every batch, on their own training mazes, so the warm start keeps reading the picture instead of
    # overwriting what grounding taught (after SFT alone the policy answers no walls question). The loss is the
    # mean over all answer tokens of the batch. Needs an env with grounding questions (not the grounding stage).
    grounding_mix: int = 0
    # Share (0..1) of the demonstrations drawn as recovery demonstrations (rlkit.types.SupportsRecoveryDemonstrations):
    # the solver's episode with one mistake in it, not learned (loss mask 0), and the solver's way on from where it
    # leads, learned; the states after an error that plain demonstrations never show (DART, Laskey et al. 2017).
    # Multi-turn envs only. Each demonstration is drawn as one with this probability. 0 = off.
    recovery_share: float = 0.0
    # Later stages of the warm start, run after this one in the same job: each a mapping of sft keys
    # (max_steps, lr, lr_schedule, target_success, seed, ...) set over this config (not over the stage
    # before: a key a stage does not set has this config's value), trained from the previous stage's
    # checkpoint with a fresh AdamW and cached on its own (keyed as the job that starts from that checkpoint
    # through policy.path would key it). [] = one stage.
    stages: list[Any] = field(default_factory=list)
    # A sequence of envs (e.g. maze sizes): the name of another env config (conf/env/<name>.yaml) whose warm
    # start, as `python train.py env=<name>` builds it with this job's policy (that env's grounding stage, recipe
    # and image size included), is built or reused first; this env's warm start then starts from it instead of
    # from this env's grounding stage (which is skipped), as a job with policy.path=<that warm start> would, with
    # the image size of this env (policy.tiny.image_max_pixels). null = off. On 9x9 from the 7x7 default's warm
    # start: session 23, docs/experiments.md; conf/experiment/tiny_9x9_from_7x7.yaml.
    start_from_env: str | None = None
    # The same from another experiment's warm start: the name of an experiment config (conf/experiment/<name>.yaml)
    # whose warm start, as `python train.py experiment=<name>` builds it (that job's whole config, its policy and
    # its own sft.start_from_* included), is built or reused first; this job's warm start trains on from it at this
    # env's image size. At most one of start_from_env / start_from_experiment. null = off. 7x7 from the 9x9
    # chain's warm start: session 24, docs/experiments.md; conf/experiment/tiny_7x7_from_9x9.yaml.
    start_from_experiment: str | None = None


@dataclass
class GroundingConfig:
    """Visual grounding pretraining of a tiny base policy, before the SFT warm start (rlkit.stages.grounding).

    Trains the full weights on the env's grounding questions (training seeds only) until the
    exact-match accuracy on ``val_questions`` held-out questions about wall bits reaches
    ``target_accuracy`` (checked every ``eval_every`` steps) or after ``max_steps``. Cached under
    ``paths.cache_dir/grounding/<hash>`` and reused; the SFT warm start starts from it. Only for
    policies built from ``policy.tiny`` (a pretrained checkpoint already reads its images).
    ``tasks``: the env's grounding task names the questions are drawn from, uniformly (empty = every task
    the env offers).
    """

    enabled: bool = False
    max_steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    target_accuracy: float = 0.99
    val_questions: int = 256
    eval_every: int = 25
    tasks: list[str] = field(default_factory=list)
    seed: int = 4321


@dataclass
class EvalConfig:
    """Evaluation on the env's fixed evaluation set."""

    num_tasks: Optional[int] = None  # None = the whole set (64 for visgym_easy_64); smoke uses a few
    pass_k: int = 0  # >0: also sample k times per task at rollout.temperature and report pass@k
    # >0: at every evaluation also run the policy greedily on the first N tasks the run draws for training
    # (tasks it has trained on), logged as eval_seen/*: beside eval/* it shows the generalisation gap
    seen_tasks: int = 0


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
    control: Optional[str] = None  # null | fixed_image | shuffled_reward (rlkit/controls.py)
    train_tasks: Optional[int] = None  # null: a fresh training task every draw; N: a fixed pool of N (rlkit/tasks.py)
    env: Any = MISSING
    reward: Any = MISSING
    policy: Any = MISSING
    backend: Any = MISSING
    logger: Any = MISSING
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # the sampling strategy, a typed class named by ``_target_`` with only its own fields (conf/sampling/,
    # rlkit.sampling.strategies: checked by sampling_problems, built by sampling_strategy)
    sampling: Any = field(default_factory=lambda: {"_target_": "rlkit.sampling.PlainSampling"})
    aux_loss: AuxLossConfig = field(default_factory=AuxLossConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore and add the ``${rlkit_cache_dir:}`` resolver conf/train.yaml's
    ``paths.cache_dir`` uses (rlkit.cache_dir); idempotent."""
    register_resolver()
    cs = ConfigStore.instance()
    cs.store(name="rlkit_train_schema", node=TrainConfig)


register_configs()
