"""Compile the composed rlkit config into SkyRL's own configuration (skyrl 0.3.0, ``SkyRLTrainConfig``).

``compile_job(cfg, settings)`` is pure: it reads the composed Hydra config (env, reward, policy,
algorithm, trainer, rollout, eval, sft, logger, paths and the top-level knobs) plus the backend's
settings (conf/backend/skyrl.yaml) and returns a ``SkyRLJob``: the nested SkyRL overrides (only keys
of SkyRL's structured config, which SkyRL builds strictly), the task datasets to write, and the
environment variables the Ray task needs. It starts nothing and writes nothing.

What follows SkyRL's documented config (skyrl/train/config/config.py, utils.validate_cfg):

- GRPO: ``trainer.algorithm.advantage_estimator=grpo`` with ``grpo_norm_by_std`` (SkyRL's fixed
  epsilon 1e-6 on the std, the unbiased group std as rlkit), PPO clip with separate
  ``eps_clip_low/high``, dual clip as ``policy_loss_type=dual_clip`` + ``clip_ratio_c``.
- Loss reduction (rlkit -> SkyRL, both over a mini-batch): token_mean -> token_mean;
  seq_mean_token_mean -> sequence_mean; seq_mean_token_sum -> seq_mean_token_sum_norm with
  ``max_seq_len=1`` (SkyRL divides the token sum by max_seq_len; 1 makes it rlkit's plain sum).
- KL: SkyRL's KL loss is always reduced per sequence (token mean, then mean over sequences), so a
  KL coefficient is honoured only with ``loss_reduction=seq_mean_token_mean``; kl_coef 0 turns the
  loss (and the reference model) off (``use_kl_loss=false``).
- Batch geometry: ``tasks_per_step`` prompts (``train_batch_size``) x ``group_size`` samples
  (``n_samples_per_prompt``); ``mini_batch_size`` sequences -> ``policy_mini_batch_size`` prompts.
- Steps: the training dataset holds exactly ``steps * tasks_per_step`` task seeds, one epoch, and
  ``max_training_steps=steps``. The seeds come from ``rlkit.tasks.TaskSampler(seed, env.is_eval_seed, train_tasks)``,
  the stream the native backend draws from, so both backends train on the same tasks (SkyRL's
  dataloader shuffles their order with ``trainer.seed``).
- Intervals: SkyRL evaluates/checkpoints/exports every N steps and at the last step, as rlkit does; an
  rlkit interval of 0 ("only at the end") becomes N = steps.
- LR schedule: rlkit warmup counts GRPO steps, SkyRL's ``num_warmup_steps`` counts optimizer steps:
  warmup_steps x (optimizer steps per GRPO step). constant -> constant_with_warmup, cosine -> cosine
  (transformers' schedulers, stepped per optimizer step).

Options SkyRL cannot honour raise ``SkyRLConfigError`` naming every such option and the fix
(docs/skyrl.md has the full table).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml
from omegaconf import DictConfig, OmegaConf

from rlkit.backends.skyrl.settings import SkyRLSettings
from rlkit.config import (
    AlgorithmConfig,
    AuxLossConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    SFTConfig,
    TrainerConfig,
    stop_strings,
)
from rlkit.errors import ConfigError
from rlkit.plugins import instantiate_plugin, instantiate_reward, to_dataclass
from rlkit.recipes.common import sweep_group

#: The SkyRL release whose config schema this module targets.
SKYRL_VERSION = "0.3.0"
#: The module that ``python -m`` runs: SkyRL's main_base flow plus rlkit's env registration.
ENTRYPOINT_MODULE = "rlkit.backends.skyrl.entrypoint"
#: skyrl-gym id of rlkit's wrapper env (the env package's adapter scored by the rlkit reward).
REWARDED_ENV_ID = "rlkit-rewarded"
#: Dataset column that carries the task spec (env adapter, env kwargs, reward) as a JSON string.
TASK_KEY = "rlkit_task"
#: skyrl-gym id of the one adapter over rlkit's env protocol (rlkit.backends.skyrl.env_adapter), and the
#: "module:function" that registers it (named here so that compiling imports nothing of skyrl-gym).
SPEC_ENV_ID = "rlkit-env"
ADAPTER_REGISTER = "rlkit.backends.skyrl.env_adapter:register"
#: SkyRL's GRPO adds this fixed epsilon to the group std (compute_grpo_outcome_advantage).
SKYRL_GRPO_EPS = 1e-6

_LOSS_REDUCTIONS = {
    "token_mean": "token_mean",
    "seq_mean_token_mean": "sequence_mean",
    "seq_mean_token_sum": "seq_mean_token_sum_norm",
}
_LR_SCHEDULES = {"constant": "constant_with_warmup", "cosine": "cosine"}
_POLICY_TARGETS = ("rlkit.policy.load_policy", "rlkit.policy.policy.load_policy")
_WANDB_TARGET = "rlkit.loggers.WandbLogger"
_CONSOLE_TARGET = "rlkit.loggers.ConsoleLogger"


class SkyRLConfigError(ConfigError):
    """The composed config asks for something backend=skyrl cannot do; the message names each option."""


@dataclass
class SkyRLJob:
    """A compiled job: SkyRL's config overrides plus what the rlkit side must prepare.

    config: nested mapping of SkyRL config keys (data, trainer, generator, environment) -> values;
        unspecified keys keep SkyRL's defaults.
    env_vars: set in the Ray task before SkyRL starts (W&B entity/group/mode).
    train_seeds / eval_seeds: task seeds of the training and evaluation datasets.
    task: the per-row task spec (``register`` "module:function" of the skyrl-gym adapter, ``env_id``,
        ``target`` the env's ``_target_``, ``env`` its kwargs, ``reward`` node with ``_target_``).
    eval_set_name: the env's evaluation set (the eval rows' ``data_source``).
    run_dir: the run's folder on the shared filesystem.
    """

    config: dict[str, Any]
    env_vars: dict[str, str]
    train_seeds: list[int]
    eval_seeds: list[int]
    task: dict[str, Any]
    eval_set_name: str
    max_turns: int
    run_dir: str
    run_name: str
    notes: list[str] = field(default_factory=list)

    @property
    def train_data(self) -> str:
        return self.config["data"]["train_data"][0]

    @property
    def eval_data(self) -> str:
        return self.config["data"]["val_data"][0]

    def overrides(self) -> list[str]:
        """The config as SkyRL command-line overrides (``key.path=value``, OmegaConf dotlist syntax)."""
        return [f"{k}={_cli_value(v)}" for k, v in _flatten(self.config)]

    def command(self) -> str:
        """The equivalent shell command (env vars, ``python -m <entrypoint>``, one override a line)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env_vars.items()))
        lines = [f"{env + ' ' if env else ''}python -m {ENTRYPOINT_MODULE}"]
        lines += [f"  {shlex.quote(o)}" for o in self.overrides()]
        return " \\\n".join(lines)

    def overrides_yaml(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------------- compile


def compile_job(cfg: DictConfig, settings: SkyRLSettings) -> SkyRLJob:
    """Compile the composed rlkit config ``cfg`` into a ``SkyRLJob`` (see the module docstring).

    Instantiates the env spec (for its turn budget and task sets) and the reward (to fail early on a
    bad reward config); imports nothing of SkyRL.

    Raises:
        SkyRLConfigError: options SkyRL cannot honour, or a cluster/batch shape SkyRL would reject
            or silently truncate (all problems in one message, each naming its key).
        ConfigError: an env, reward or policy config that cannot be built.
    """
    problems: list[str] = []
    groups = _groups(cfg, problems)
    _check_unsupported(groups.algo, groups.optim, groups.sampling, groups.aux, groups.trainer, groups.sft,
                       groups.eval_cfg, groups.steps, groups.group_size, problems)
    if cfg.get("control") is not None:
        problems.append(f"control={cfg.control}: control runs (fixed_image, shuffled_reward) are built by "
                        "backend=native, native_ray and native_ray_ddp; run the control there")
    env_spec, task = _env_and_reward(cfg)
    policy = _policy(cfg, problems)
    project, run_name, logger_name, skyrl_logger, env_vars = _logger(cfg, settings, problems)
    if policy["vision_lora"] and settings.engine_init_kwargs.get("enable_tower_connector_lora", True) is not True:
        problems.append("backend.engine_init_kwargs.enable_tower_connector_lora=false with LoRA on the vision side "
                        "(policy.lora): vLLM would sample without those modules, silently; remove the override, or "
                        "set policy.lora.include_vision=false")
    shared = str(cfg.paths.shared).rstrip("/")
    run_dir = settings.run_dir or f"{shared}/skyrl/{_slug(project)}/{run_name}"
    batches = _batch_geometry(groups, settings, problems)
    engines = _inference_engines(settings, problems)
    if problems:
        raise SkyRLConfigError(
            "backend=skyrl cannot run this config:\n" + "\n".join(f"  - {p}" for p in problems)
            + "\nSee docs/skyrl.md for what maps to SkyRL."
        )
    train_seeds, eval_seeds = _datasets(cfg, groups, env_spec)
    max_turns = int(env_spec.max_turns)
    config: dict[str, Any] = {
        "data": {
            "train_data": [f"{run_dir}/data/train.jsonl"],
            "val_data": [f"{run_dir}/data/eval.jsonl"],
            "dataloader": {"num_workers": 0},
        },
        "trainer": _trainer(cfg, groups, settings, policy, batches, run_dir,
                            (project, logger_name, skyrl_logger)),
        "generator": _generator(groups, settings, policy, engines, max_turns, stop_strings(groups.rollout, env_spec)),
        "environment": {
            "env_class": REWARDED_ENV_ID,
            "skyrl_gym": {"max_env_workers": settings.max_env_workers},
        },
    }
    notes = [
        f"env {task['env_id']} ({_target(cfg.env)}) with {max_turns} policy turn(s); "
        f"eval set {env_spec.eval_set_name}: {len(eval_seeds)} tasks; {len(train_seeds)} training tasks",
    ]
    return SkyRLJob(
        config=config, env_vars=env_vars, train_seeds=train_seeds, eval_seeds=eval_seeds, task=task,
        eval_set_name=env_spec.eval_set_name, max_turns=max_turns, run_dir=run_dir, run_name=run_name,
        notes=notes,
    )


@dataclass(frozen=True)
class _Groups:
    """The composed config's groups that ``compile_job`` maps, typed (rlkit.config's dataclasses), and its
    top-level knobs."""

    algo: AlgorithmConfig
    rollout: RolloutConfig
    trainer: TrainerConfig
    sft: SFTConfig
    eval_cfg: EvalConfig
    optim: OptimConfig
    aux: AuxLossConfig
    sampling: Any  # the strategy's node (rlkit.sampling.strategies)
    steps: int
    group_size: int
    tasks_per_step: int


def _groups(cfg: DictConfig, problems: list[str]) -> _Groups:
    """``cfg``'s groups typed, appending to ``problems`` the range problems (rlkit.config.check_ranges) that apply
    to SkyRL (not sft.*, which SkyRL refuses whole, nor trainer.resume_mode, checked by ``_check_unsupported``).

    Raises: ConfigError (rlkit.plugins.to_dataclass) on a group that does not fit its dataclass."""
    algo: AlgorithmConfig = to_dataclass(cfg.algorithm, AlgorithmConfig)
    rollout: RolloutConfig = to_dataclass(cfg.rollout, RolloutConfig)
    trainer: TrainerConfig = to_dataclass(cfg.trainer, TrainerConfig)
    sft: SFTConfig = to_dataclass(cfg.sft, SFTConfig)
    eval_cfg: EvalConfig = to_dataclass(cfg.eval, EvalConfig)
    steps, group_size, tasks_per_step = int(cfg.steps), int(cfg.group_size), int(cfg.tasks_per_step)

    from rlkit.config import check_ranges

    problems.extend(p for p in check_ranges(cfg) if not p.startswith(("sft.", "trainer.resume_mode")))
    return _Groups(algo=algo, rollout=rollout, trainer=trainer, sft=sft, eval_cfg=eval_cfg,
                   optim=to_dataclass(cfg.optim, OptimConfig), aux=to_dataclass(cfg.aux_loss, AuxLossConfig),
                   sampling=cfg.sampling, steps=steps, group_size=group_size, tasks_per_step=tasks_per_step)


@dataclass(frozen=True)
class _Batches:
    """The step's batch in SkyRL's units: prompts per mini-batch, sequences per micro-batch per GPU, and optimizer
    steps per GRPO step."""

    mini_prompts: int
    micro: int
    opt_steps_per_step: int


def _batch_geometry(groups: _Groups, settings: SkyRLSettings, problems: list[str]) -> _Batches:
    """The batch geometry (SkyRL's validate_batch_sizes, stated in rlkit's terms), appending to ``problems`` each
    shape SkyRL would reject or silently truncate."""
    algo, group_size, world = groups.algo, groups.group_size, settings.world_size
    num_seqs = groups.tasks_per_step * group_size
    mini_seqs = algo.mini_batch_size or num_seqs
    if algo.mini_batch_size is not None and (mini_seqs % group_size or num_seqs % mini_seqs):
        problems.append(
            f"algorithm.mini_batch_size={algo.mini_batch_size}: SkyRL's mini-batches are whole groups that "
            f"split the step's batch evenly; use a multiple of group_size={group_size} that divides "
            f"tasks_per_step*group_size={num_seqs}, or null (one mini-batch)"
        )
    if num_seqs % world or mini_seqs % world:
        problems.append(
            f"tasks_per_step*group_size={num_seqs} sequences (mini-batch {mini_seqs}) do not split evenly over "
            f"backend.num_nodes*backend.gpus_per_node={world} GPUs; SkyRL would drop the remainder. Choose "
            f"tasks_per_step so that tasks_per_step*group_size is a multiple of {world}"
        )
    per_gpu_mini = max(mini_seqs // world, 1)
    micro = settings.micro_batch_size_per_gpu or min(algo.micro_batch_size, per_gpu_mini)
    if per_gpu_mini % micro:
        problems.append(
            f"backend.micro_batch_size_per_gpu={micro} must divide the per-GPU mini-batch of {per_gpu_mini} "
            f"sequences (mini-batch {mini_seqs} / {world} GPUs)"
        )
    return _Batches(mini_prompts=max(mini_seqs // group_size, 1), micro=micro,
                    opt_steps_per_step=(num_seqs // mini_seqs) * algo.update_epochs)


def _inference_engines(settings: SkyRLSettings, problems: list[str]) -> int:
    """The number of vLLM engines (SkyRL's placement validation), appending to ``problems`` a cluster shape SkyRL
    would reject (then 1, so that the other checks still run)."""
    world = settings.world_size
    engines = settings.num_inference_engines
    if engines is None:
        if not settings.colocate_all:
            problems.append("backend.num_inference_engines must be set when backend.colocate_all=false")
            engines = 1
        elif world % settings.tensor_parallel_size:
            problems.append(
                f"backend.tensor_parallel_size={settings.tensor_parallel_size} must divide the "
                f"{world} GPUs (num_nodes*gpus_per_node) when num_inference_engines is null"
            )
            engines = 1
        else:
            engines = world // settings.tensor_parallel_size
    if settings.colocate_all and engines * settings.tensor_parallel_size != world:
        problems.append(
            f"backend.colocate_all=true needs num_inference_engines*tensor_parallel_size == num_nodes*gpus_per_node "
            f"(got {engines}*{settings.tensor_parallel_size} vs {world})"
        )
    return engines


def _datasets(cfg: DictConfig, groups: _Groups, env_spec: Any) -> tuple[list[int], list[int]]:
    """(training seeds, eval seeds): ``steps * tasks_per_step`` seeds from the native backend's training sampler, and
    the env's eval set (its first ``eval.num_tasks`` when set)."""
    from rlkit.tasks import training_sampler

    train_seeds = training_sampler(env_spec, int(cfg.seed), pool_size=cfg.get("train_tasks")).sample(
        groups.steps * groups.tasks_per_step)
    eval_seeds = list(env_spec.eval_seeds())
    if groups.eval_cfg.num_tasks:
        eval_seeds = eval_seeds[: groups.eval_cfg.num_tasks]
    return train_seeds, eval_seeds


def _trainer(cfg: DictConfig, groups: _Groups, settings: SkyRLSettings, policy: dict[str, Any], batches: _Batches,
             run_dir: str, tracker: tuple[str, str, str]) -> dict[str, Any]:
    """SkyRL's ``trainer`` section. ``policy``: ``_policy``'s mapping; ``tracker``: (project, run name for the
    tracker, SkyRL logger), from ``_logger``."""
    trainer, algo = groups.trainer, groups.algo
    project, logger_name, skyrl_logger = tracker

    def interval(n: int) -> int:
        return n if n > 0 else groups.steps

    return {
        "placement": {
            "colocate_all": settings.colocate_all,
            "policy_num_nodes": settings.num_nodes,
            "policy_num_gpus_per_node": settings.gpus_per_node,
            "ref_num_nodes": settings.num_nodes,
            "ref_num_gpus_per_node": settings.gpus_per_node,
        },
        "strategy": "fsdp",
        "policy": _trainer_policy(cfg, groups, settings, policy, batches, run_dir),
        "algorithm": _trainer_algorithm(groups),
        "gradient_checkpointing": bool(policy["gradient_checkpointing"]),
        "seed": int(cfg.seed),
        "resume_mode": trainer.resume_mode,
        "resume_path": trainer.resume_path,
        "log_path": f"{run_dir}/logs",
        "ckpt_path": f"{run_dir}/ckpts",
        "max_ckpts_to_keep": int(trainer.max_ckpts_to_keep),
        "ckpt_interval": interval(trainer.ckpt_interval),
        "hf_save_interval": interval(trainer.export_interval),
        "export_path": f"{run_dir}/exports",
        "bf16": True,
        "epochs": 1,
        "max_training_steps": groups.steps,
        "update_epochs_per_batch": int(algo.update_epochs),
        "train_batch_size": groups.tasks_per_step,
        "policy_mini_batch_size": batches.mini_prompts,
        "micro_train_batch_size_per_gpu": batches.micro,
        "micro_forward_batch_size_per_gpu": batches.micro,
        "remove_microbatch_padding": False,
        "eval_batch_size": settings.eval_batch_size,
        "eval_before_train": bool(trainer.eval_before_train),
        "eval_interval": interval(trainer.eval_interval),
        "max_prompt_length": settings.max_prompt_length,
        "flash_attn": policy["flash_attn"],
        "project_name": project,
        "run_name": logger_name,
        "logger": skyrl_logger,
        "tags": list(OmegaConf.select(cfg, "logger.tags", default=None) or []) or None,
        "dump_eval_results": True,
        "print_example_interval": 0 if trainer.quiet else 1,
    }


def _trainer_policy(cfg: DictConfig, groups: _Groups, settings: SkyRLSettings, policy: dict[str, Any],
                    batches: _Batches, run_dir: str) -> dict[str, Any]:
    """SkyRL's ``trainer.policy``: the model and its LoRA adapter, the optimizer (warmup counted in optimizer
    steps), FSDP."""
    lora, optim = policy["lora"], groups.optim
    return {
        "model": {
            "path": policy["path"],
            "lora": {
                "rank": lora["rank"],
                "alpha": lora["alpha"],
                "dropout": lora["dropout"],
                "lora_sync_path": f"{run_dir}/lora_sync",
                "target_modules": lora["target_modules"],
                "exclude_modules": lora["exclude_modules"],
            },
        },
        "optimizer_config": {
            "lr": float(cfg.lr),
            "adam_betas": [float(b) for b in optim.adam_betas],
            "weight_decay": float(optim.weight_decay),
            "max_grad_norm": float(groups.algo.max_grad_norm),
            "num_warmup_steps": int(optim.warmup_steps) * batches.opt_steps_per_step,
            "scheduler": _LR_SCHEDULES[optim.lr_schedule],
        },
        "fsdp_config": {"cpu_offload": settings.fsdp_cpu_offload},
    }


def _trainer_algorithm(groups: _Groups) -> dict[str, Any]:
    """SkyRL's ``trainer.algorithm``: GRPO with rlkit's clip, loss reduction and KL (see the module docstring)."""
    algo, rollout = groups.algo, groups.rollout
    return {
        "advantage_estimator": "grpo",
        "grpo_norm_by_std": bool(algo.norm_adv_by_std),
        "zero_variance_filter": False,
        "eps_clip_low": float(algo.eps_clip_low),
        "eps_clip_high": float(algo.eps_clip_high),
        "policy_loss_type": "regular" if algo.clip_ratio_c is None else "dual_clip",
        **({} if algo.clip_ratio_c is None else {"clip_ratio_c": float(algo.clip_ratio_c)}),
        "loss_reduction": _LOSS_REDUCTIONS[algo.loss_reduction],
        **({"max_seq_len": 1} if algo.loss_reduction == "seq_mean_token_sum" else {}),
        "use_kl_loss": algo.kl_coef > 0,
        "kl_loss_coef": float(algo.kl_coef),
        "kl_estimator_type": algo.kl_estimator,
        "use_kl_in_reward": False,
        "use_entropy_loss": False,
        "temperature": float(rollout.temperature) if rollout.temperature > 0 else 1.0,
    }


def _generator(groups: _Groups, settings: SkyRLSettings, policy: dict[str, Any], engines: int, max_turns: int,
               stop: tuple[str, ...]) -> dict[str, Any]:
    """SkyRL's ``generator`` section: the vLLM engines, the multi-turn rollout and its sampling (``stop``: the
    rollout's stop strings, rlkit.config.stop_strings)."""
    rollout = groups.rollout
    max_input = settings.max_input_length if max_turns > 1 else settings.max_prompt_length
    # vLLM applies LoRA to the vision tower and merger only with enable_tower_connector_lora, and otherwise
    # drops those modules without an error (issue 63; rlkit.serve.vllm)
    tower = {"enable_tower_connector_lora": True} if policy["vision_lora"] else {}
    return {
        "inference_engine": {
            "model_dtype": "bfloat16",
            "run_engines_locally": True,
            "num_engines": engines,
            "backend": "vllm",
            "weight_sync_backend": "nccl",
            "tensor_parallel_size": settings.tensor_parallel_size,
            "gpu_memory_utilization": float(settings.gpu_memory_utilization),
            "enforce_eager": False,
            "engine_init_kwargs": {"max_model_len": max_input + rollout.max_new_tokens, **tower,
                                   **settings.engine_init_kwargs},
        },
        "n_samples_per_prompt": groups.group_size,
        "batched": False,
        "max_turns": max_turns,
        "max_input_length": max_input,
        "sampling_params": _sampling(rollout.temperature, rollout.top_p, rollout.top_k, rollout.max_new_tokens, stop),
        "use_conversation_multi_turn": True,
        # a turn ended by a stop string is closed with the end-of-turn token, as rlkit's native rollout does
        "append_eos_token_after_stop_str_in_multi_turn": True,
        "eval_sampling_params": _sampling(rollout.eval_temperature, 1.0, 0, rollout.max_new_tokens, stop),
        "eval_n_samples_per_prompt": 1,
        "zero_reward_on_non_stop": False,
        "apply_overlong_filtering": bool(groups.algo.overlong_filtering),
        "step_wise_trajectories": False,
        "vision_language_generator": settings.vision_language_generator,
    }


# ------------------------------------------------------------------------------------------ the groups


def _check_unsupported(algo: AlgorithmConfig, optim: OptimConfig, sampling: Any, aux: AuxLossConfig,
                       trainer: TrainerConfig, sft: SFTConfig, eval_cfg: EvalConfig,
                       steps: int, group_size: int, problems: list[str]) -> None:
    """Append one line per rlkit option whose value SkyRL 0.3.0 cannot honour."""
    if steps < 1:
        problems.append(f"steps={steps}: SkyRL trains at least one step (use the eval script for eval only)")
    if group_size < 2:
        problems.append(
            f"group_size={group_size}: SkyRL's GRPO gives a lone sample its raw reward as advantage (rlkit gives 0); "
            "use group_size >= 2"
        )
    if sft.enabled:
        problems.append(
            "sft.enabled=true: rlkit's SFT warm start runs only in the native backend; set sft.enabled=false "
            "and point policy.path at the SFT checkpoint"
        )
    if algo.filter_zero_variance_groups:
        problems.append(
            "algorithm.filter_zero_variance_groups=true: SkyRL applies its zero_variance_filter only to "
            "response-level rewards, and its multi-turn generators return token-level rewards; set it to false"
        )
    from rlkit.sampling.strategies import sampling_problems, strategy_name

    mixed = sampling_problems(sampling)  # a mixed or bad sampling node, named with its fix
    problems.extend(mixed)
    if not mixed and strategy_name(sampling) != "plain":
        problems.append(
            f"sampling={strategy_name(sampling)}: rlkit's dynamic sampling runs only in the native backends; use "
            "sampling=plain (SkyRL has its own, trainer.algorithm.dynamic_sampling, which rlkit does not map)"
        )
    if algo.adv_eps != SKYRL_GRPO_EPS:
        problems.append(
            f"algorithm.adv_eps={algo.adv_eps}: SkyRL's GRPO uses a fixed epsilon of {SKYRL_GRPO_EPS}; set it to {SKYRL_GRPO_EPS}"
        )
    if aux.demo_coef != 0.0 or aux.demo_max_successes != 0:
        problems.append(
            f"aux_loss.demo_coef={aux.demo_coef}: the auxiliary terms run in backend=native and native_ray only "
            "(SkyRL's trainer computes its own loss); use aux_loss=none"
        )
    if algo.entropy_coef != 0.0:
        problems.append(
            f"algorithm.entropy_coef={algo.entropy_coef}: SkyRL averages its entropy term per micro-batch "
            f"(token mean), not with algorithm.loss_reduction={algo.loss_reduction} over the mini-batch; set it to 0"
        )
    if algo.kl_coef < 0:
        problems.append(f"algorithm.kl_coef={algo.kl_coef} must be >= 0")
    elif algo.kl_coef > 0 and algo.loss_reduction != "seq_mean_token_mean":
        problems.append(
            f"algorithm.kl_coef={algo.kl_coef} with algorithm.loss_reduction={algo.loss_reduction}: SkyRL reduces the "
            "KL loss per sequence (token mean, then mean over sequences) whatever the policy-loss reduction; use "
            "loss_reduction=seq_mean_token_mean or kl_coef=0"
        )
    if algo.kl_estimator not in ("k1", "k2", "k3"):
        problems.append(f"algorithm.kl_estimator={algo.kl_estimator!r}: use k1, k2 or k3")
    if algo.loss_reduction not in _LOSS_REDUCTIONS:
        problems.append(f"algorithm.loss_reduction={algo.loss_reduction!r}: use one of {sorted(_LOSS_REDUCTIONS)}")
    if optim.lr_schedule not in _LR_SCHEDULES:
        problems.append(f"optim.lr_schedule={optim.lr_schedule!r}: use constant or cosine")
    if algo.clip_ratio_c is not None and algo.clip_ratio_c <= 1.0:
        problems.append(f"algorithm.clip_ratio_c={algo.clip_ratio_c} must be > 1 (dual clip) or null")
    if trainer.resume_mode not in ("latest", "none", "from_path"):
        problems.append(f"trainer.resume_mode={trainer.resume_mode!r}: use latest, none or from_path")
    if trainer.resume_mode == "from_path" and not trainer.resume_path:
        problems.append("trainer.resume_mode=from_path needs trainer.resume_path=<SkyRL global_step_N folder>")
    if trainer.num_threads is not None:
        problems.append(
            f"trainer.num_threads={trainer.num_threads}: SkyRL's Ray workers set their own threads; leave it null"
        )
    if trainer.build_threads is not None:
        problems.append(f"trainer.build_threads={trainer.build_threads}: SkyRL runs no warm-start builds "
                        "(sft.enabled=false, a pretrained policy.path); leave it null")
    if trainer.deterministic:
        problems.append("trainer.deterministic=true: SkyRL has no deterministic mode (vLLM sampling); set it to false")
    if trainer.max_failures:
        problems.append(f"trainer.max_failures={trainer.max_failures}: SkyRL's trainer does not replace a lost worker "
                        "inside a job; a failed job is resubmitted by the launcher (hydra.launcher.max_retries) and "
                        "resumes from its latest checkpoint (trainer.resume_mode=latest). Set trainer.max_failures=0")
    if trainer.max_ckpts_to_keep == 0 or trainer.max_ckpts_to_keep < -1:
        problems.append(f"trainer.max_ckpts_to_keep={trainer.max_ckpts_to_keep}: use N >= 1, or -1 to keep all")
    if eval_cfg.seen_tasks:
        problems.append(f"eval.seen_tasks={eval_cfg.seen_tasks}: SkyRL evaluates its fixed set only; set eval.seen_tasks=0")
    if eval_cfg.pass_k:
        problems.append(
            f"eval.pass_k={eval_cfg.pass_k}: SkyRL evaluates with one sampling config (greedy here); set eval.pass_k=0"
        )


def _target(node: Any) -> str:
    return str(OmegaConf.select(node, "_target_", default="") or "")


def _env_and_reward(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The env spec and the rows' task spec: every env runs through the one adapter over rlkit's env protocol
    (rlkit.backends.skyrl.env_adapter, ``rlkit-env``), built in the Ray job from ``target`` + ``env``."""
    env_spec = instantiate_plugin(cfg.env, "env")
    instantiate_reward(cfg.reward)  # fail here, not in the Ray job, on a bad reward config
    env_kwargs = OmegaConf.to_container(cfg.env, resolve=True)
    env_kwargs.pop("_target_", None)
    task = {
        "register": ADAPTER_REGISTER,
        "env_id": SPEC_ENV_ID,
        "target": _target(cfg.env),
        "env": env_kwargs,
        "reward": OmegaConf.to_container(cfg.reward, resolve=True),
    }
    return env_spec, task


def _policy(cfg: DictConfig, problems: list[str]) -> dict[str, Any]:
    """The policy group (conf/policy/*.yaml, validated by rlkit.policy.PolicyConfig) in SkyRL's terms."""
    target = _target(cfg.policy)
    if target not in _POLICY_TARGETS:
        raise SkyRLConfigError(f"policy._target_={target}: backend=skyrl reads rlkit.policy.load_policy configs only")
    from rlkit.policy.policy import PolicyConfig

    try:
        pc = PolicyConfig.from_dict(OmegaConf.to_container(cfg.policy, resolve=True))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config group 'policy' ({target}) is invalid: {e}") from e
    if pc.path is None:
        problems.append("policy.path=null (the tiny CPU model): vLLM needs a checkpoint dir or a Hub id")
    if pc.dtype not in ("auto", "bfloat16"):  # auto is bfloat16 on GPU (rlkit.hardware; rlkit.run resolves it so)
        problems.append(f"policy.dtype={pc.dtype}: SkyRL trains in bf16 mixed precision; use auto (bfloat16 on GPU) "
                        "or bfloat16")
    if pc.device not in ("auto", "cuda"):
        problems.append(f"policy.device={pc.device}: SkyRL places its workers on the Ray cluster's GPUs; use auto")
    if pc.attn_implementation == "eager":
        problems.append("policy.attn_implementation=eager: SkyRL offers flash_attention_2 or sdpa")
    if pc.seed != int(cfg.seed):
        problems.append(
            f"policy.seed={pc.seed} differs from seed={cfg.seed}: SkyRL seeds the LoRA init with trainer.seed; "
            f"set policy.seed={cfg.seed} (or policy.seed='${{seed}}')"
        )
    if pc.image_min_pixels is not None or pc.image_max_pixels is not None:
        problems.append(
            "policy.image_min_pixels/image_max_pixels: vLLM renders the images in SkyRL's VLM generator with the "
            "checkpoint's processor bounds; leave them null"
        )
    lo = pc.lora
    if lo.enabled and float(lo.alpha) != int(lo.alpha):
        problems.append(f"policy.lora.alpha={lo.alpha}: SkyRL's lora.alpha is an integer")
    if isinstance(lo.target_modules, str) and lo.target_modules != "all-linear":
        problems.append(
            f"policy.lora.target_modules={lo.target_modules!r} (a regex): SkyRL {SKYRL_VERSION} writes "
            "list(target_modules) into the adapter_config.json it syncs to vLLM, which splits a string into "
            "characters; use all-linear or a list of module names"
        )
    targets, exclude = _lora_targets(lo.target_modules, lo.include_vision)
    from rlkit.policy.vllm_facts import patch_embed_targets, targets_reach_vision

    conv = patch_embed_targets(lo.target_modules) if lo.enabled else []
    if conv:
        problems.append(
            f"policy.lora.target_modules={list(lo.target_modules)}: {conv} also matches Qwen3-VL's Conv3d "
            "visual.patch_embed.proj, and SkyRL samples with vLLM, which never applies LoRA to it (it samples "
            "without it, silently: a train/sample mismatch). Leave it out (e.g. [q_proj,k_proj,v_proj,o_proj,"
            "gate_proj,up_proj,down_proj,qkv,linear_fc1,linear_fc2]), or use target_modules=all-linear with "
            "policy.lora.include_vision=false (language model) or true (peft's all-linear takes the tower's "
            "linears, not the Conv3d)")
    return {
        "vision_lora": bool(lo.enabled) and targets_reach_vision(lo.target_modules, lo.include_vision),
        "path": pc.path,
        "flash_attn": pc.attn_implementation == "flash_attention_2",
        "gradient_checkpointing": pc.gradient_checkpointing,
        "lora": {
            "rank": int(lo.rank) if lo.enabled else 0,
            "alpha": int(lo.alpha),
            "dropout": float(lo.dropout),
            "target_modules": targets,
            "exclude_modules": exclude,
        },
    }


#: peft fullmatches a string ``exclude_modules`` against module names: the Qwen-VL vision tower.
VISION_EXCLUDE_REGEX = r"(?:.*\.)?visual\..*"


def _lora_targets(target_modules: Any, include_vision: bool) -> tuple[Any, str | None]:
    """rlkit's LoRA targets as SkyRL's (peft) ``target_modules`` and ``exclude_modules``.

    "all-linear" in rlkit means the language model's linears (not the vision tower unless
    include_vision, never lm_head); peft's "all-linear" also takes the vision tower, so it is
    excluded with a regex (peft full-matches a string ``exclude_modules`` against module names;
    the adapter SkyRL syncs to vLLM then holds language-model weights only). A list of module
    names passes through as a list (peft matches each as the whole name or a ``.name`` suffix, as
    rlkit does); SkyRL's field is typed ``str`` but its FSDP code takes ``list(target_modules)``.
    """
    if isinstance(target_modules, str):
        exclude = None if (include_vision or target_modules != "all-linear") else VISION_EXCLUDE_REGEX
        return target_modules, exclude
    return [str(n) for n in target_modules], None


def _logger(cfg: DictConfig, settings: SkyRLSettings,
            problems: list[str]) -> tuple[str, str, str, str, dict[str, str]]:
    """(project, run name for folders, run name for the tracker, SkyRL logger, env vars) from the logger
    group. W&B: project/name/tags go to SkyRL's tracker; entity, group and mode travel as WANDB_ENTITY,
    WANDB_RUN_GROUP and WANDB_MODE (wandb.init reads them); mode disabled -> SkyRL's console logger."""
    target = _target(cfg.logger)
    env_vars: dict[str, str] = {}
    skyrl_logger = "console"
    overrides = job_overrides(cfg)
    derived = _slug(",".join(overrides)) or "default"
    if target == _WANDB_TARGET:
        lg = cfg.logger
        project = str(lg.get("project") or "rlkit")
        name = settings.run_name or lg.get("name") or derived
        if lg.get("entity"):
            env_vars["WANDB_ENTITY"] = str(lg.entity)
        group = lg.get("group") or sweep_group()
        if group:
            env_vars["WANDB_RUN_GROUP"] = str(group)
        mode = str(lg.get("mode") or "auto")
        skyrl_logger = "console" if mode == "disabled" else "wandb"
        if mode in ("online", "offline"):
            env_vars["WANDB_MODE"] = mode
        elif mode not in ("auto", "disabled"):
            problems.append(f"logger.mode={mode!r}: use auto, online, offline or disabled")
    elif target == _CONSOLE_TARGET:
        project = "rlkit"
        name = settings.run_name or derived
    else:
        raise SkyRLConfigError(f"logger._target_={target}: backend=skyrl supports the wandb and console loggers")
    if skyrl_logger == "console":
        env_vars.pop("WANDB_ENTITY", None)
        env_vars.pop("WANDB_RUN_GROUP", None)
    return project, _slug(str(name)), str(name), skyrl_logger, env_vars


def job_overrides(cfg: DictConfig | None = None) -> list[str]:
    """The job's Hydra task overrides (from the running job, else from a composed ``hydra`` node),
    without the ones that do not change the experiment (``backend.dry_run``, ``backend.run_name``)."""
    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        if cfg is not None:
            overrides = list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
    skip = ("backend.dry_run", "+backend.dry_run", "backend.run_name", "backend.run_dir")
    return [o for o in overrides if o.split("=", 1)[0] not in skip]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:120]


def _sampling(temperature: float, top_p: float, top_k: int, max_new_tokens: int,
              stop: tuple[str, ...] = ()) -> dict[str, Any]:
    """SkyRL ``SamplingParams``; rlkit's top_k 0 (off) is vLLM's -1; no stop strings is vLLM's None."""
    return {
        "stop": list(stop) or None,
        "max_generate_length": int(max_new_tokens),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "top_k": int(top_k) if top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": 1,
    }


# -------------------------------------------------------------------------------------- command line


def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _cli_value(v: Any) -> str:
    """A value in OmegaConf's dotlist syntax that parses back to ``v`` (strings quoted when YAML
    would read them as something else)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        try:
            plain_ok = yaml.safe_load(v) == v and v.strip() == v and v != "" and not any(c in v for c in ",[]{}'\"#")
        except yaml.YAMLError:
            plain_ok = False
        return v if plain_ok else "'" + v.replace("'", "''") + "'"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{_cli_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_cli_value(x) for x in v) + "]"
    return json.dumps(v)
