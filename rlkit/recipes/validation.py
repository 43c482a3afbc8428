"""What the GRPO recipe refuses before any work: values out of range or at odds with each other, what the executor
cannot run, plug-ins that cannot be built, and stages the env cannot feed. Every problem is one line naming the key
and the fix; ``check_run`` (the recipe's one validation pass) and ``check_config`` (the config alone) raise them
together as one ConfigError, so a user fixes them in one go instead of one per run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from omegaconf import DictConfig, OmegaConf

from rlkit.config import CONF_DIR as CONF  # the package's conf/ (a wheel) or the checkout's
from rlkit.config import EvalConfig, check_ranges, stop_strings
from rlkit.env_check import check_env
from rlkit.errors import ConfigError
from rlkit.evaluation import task_sets
from rlkit.metrics_export import with_cluster_metrics
from rlkit.plugins import instantiate_plugin, instantiate_reward, to_dataclass
from rlkit.policy import SamplingParams
from rlkit.sampling.strategies import sampling_problems
from rlkit.stages import warm_start as ws
from rlkit.types import SupportsDemonstrations, SupportsGroundingQuestions, SupportsRecoveryDemonstrations

T = TypeVar("T")


@dataclass
class CheckedRun:
    """What ``check_run`` built to check a run, for the recipe to use: the env spec (played by check_env), the
    reward (a GuardedReward), the logger (its keys checked, not started), the warm start's job, the evaluation
    and trained-on task seeds (rlkit.evaluation.task_sets) and the run's stop strings."""

    env_spec: Any
    reward_fn: Any
    logger: Any
    job: ws.WarmStartJob
    eval_seeds: list[int]
    seen_seeds: list[int]
    stop: tuple[str, ...]


def check_run(cfg: DictConfig, executor_problems: list[str]) -> CheckedRun:
    """The one validation pass before any work (GRPORecipe.setup): every problem of ``cfg`` at once.

    Collected, in this order: ``config_problems``; ``executor_problems`` (the executor's ``problems(cfg)``); the
    env's build and contract (rlkit.env_check.check_env), the reward's and the logger's builds; then, with the env
    built: the evaluation task counts, ``capability_problems``, the grounding tasks (rlkit.stages.warm_start.
    grounding_problem) and the sampling settings with the run's stop strings. A check that reads a value already
    refused by its range (eval.num_tasks, eval.seen_tasks, train_tasks, seed; rollout.*) is skipped, so one bad
    value is named once. Builds the env, reward and logger (cheap: no model, no warm start).

    Raises: ConfigError with the one problem, or "N bad values: " and every problem joined by "; " (as
    ``check_config``)."""
    problems = config_problems(cfg) + list(executor_problems)
    env_spec = _built(problems, lambda: check_env(instantiate_plugin(cfg.env, "env"), cfg.env.get("name")))
    reward_fn = _built(problems, lambda: instantiate_reward(cfg.reward))  # GuardedReward: time limit and on_error
    logger = _built(problems, lambda: with_cluster_metrics(instantiate_plugin(cfg.logger, "logger")))
    sets = job = stop = None
    if env_spec is not None:
        if not _refused(problems, "eval.num_tasks", "eval.seen_tasks", "train_tasks", "seed"):
            sets = _built(problems, lambda: task_sets(env_spec, to_dataclass(cfg.eval, EvalConfig), cfg.seed,
                                                      cfg.get("train_tasks")))
        problems += _built(problems, lambda: capability_problems(cfg, env_spec)) or []
        job = _built(problems, lambda: ws.make_job(cfg, env_spec))
        problems += (_built(problems, lambda: [p for p in [ws.grounding_problem(job)] if p]) or []) if job else []
        stop = _built(problems, lambda: stop_strings(cfg.rollout, env_spec))
        if stop is not None and not _refused(problems, "rollout."):
            problems += _built(problems, lambda: _sampling_problems(cfg.rollout, stop)) or []
    _raise(problems)
    return CheckedRun(env_spec, reward_fn, logger, job, *sets, stop)


def _sampling_problems(r: Any, stop: tuple[str, ...]) -> list[str]:
    """What rlkit.policy.SamplingParams.validate refuses of ``rollout`` with the run's stop strings."""
    try:
        SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                       stop=stop).validate()
    except ValueError as e:
        return [f"rollout.{e}"]
    return []


def _built(problems: list[str], build: Callable[[], T]) -> T | None:
    """``build()``; None with its ConfigError's message appended to ``problems``; None when it raises anything else
    on a config already refused (``problems`` not empty: a check that breaks on a refused value adds nothing to
    what names it); otherwise what it raises."""
    try:
        return build()
    except ConfigError as e:
        problems.append(str(e))
    except Exception:
        if not problems:
            raise
    return None


def _refused(problems: list[str], *keys: str) -> bool:
    """Whether a problem already names one of ``keys`` (a key ``k`` as ``k=...``, a prefix ending in "." as is)."""
    return any(p.startswith(k if k.endswith(".") else f"{k}=") for p in problems for k in keys)


def _raise(problems: list[str]) -> None:
    """Raise one ConfigError with every problem (none: return)."""
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else f"{len(problems)} bad values: " + "; ".join(problems))



def config_problems(cfg: DictConfig) -> list[str]:
    """Every problem of a composed train config that needs no env and no model: RANGES (rlkit.config), the
    trainer's resume and checkpoint settings, the warm start's chain, the sampling strategy and the demonstration
    term; then the policy plug-in's own settings (``policy_problems``, which imports transformers) if nothing
    else is wrong."""
    problems = check_ranges(cfg)  # every typed field's valid range (rlkit.config.RANGES)
    trainer, sampling, aux = cfg.trainer, cfg.sampling, cfg.aux_loss
    if trainer.max_ckpts_to_keep < 0:
        problems.append(f"trainer.max_ckpts_to_keep={trainer.max_ckpts_to_keep} must be an integer >= 0 (0 = keep all)")
    if trainer.resume_mode == "from_path" and not trainer.resume_path:
        problems.append("trainer.resume_mode=from_path needs trainer.resume_path=<checkpoint dir>")
    if not cfg.policy.get("lora", {}).get("enabled", True):
        problems.append("policy.lora.enabled=false: GRPO trains a LoRA adapter on this backend (its checkpoints, "
                        "adapter sync and export are adapter-only), so full fine-tuning here is not supported "
                        "(backend=skyrl runs it); the warm-start stages (grounding, sft) already train every "
                        "weight. Remove the override, or adapt more with policy.lora.include_vision=true / "
                        "policy.lora.rank")
    problems += _start_from_problems(cfg)
    problems += sampling_problems(sampling)  # the strategy's own fields, and none of another's
    m = aux.demo_max_successes
    if m >= cfg.group_size >= 2:  # (a group_size below 2 is refused by its own range)
        problems.append(f"aux_loss.demo_max_successes={m}: a group of group_size={cfg.group_size} with that many "
                        f"successes has nothing left to demonstrate; use 0 (only all-fail tasks) .. {cfg.group_size - 1}")
    elif m > 0 and aux.demo_coef == 0.0:
        problems.append(f"aux_loss.demo_max_successes={m} picks the tasks of the demonstration loss, which is off "
                        "(aux_loss.demo_coef=0): set demo_coef > 0 (aux_loss=relift), or demo_max_successes to 0")
    problems += rollout_engine_problems(cfg)
    if not problems:  # last: it imports transformers (3 s), which a config refused for another reason need not wait for
        problems = policy_problems(cfg.policy)
    return problems


def rollout_engine_problems(cfg: DictConfig) -> list[str]:
    """What ``rollout.engine=vllm`` (rlkit.policy.vllm_engine) cannot sample faithfully, each with its fix: no vLLM
    environment; top-k / top-p (vLLM's logprobs are then of the truncated distribution, the update's old logprobs of
    the untruncated one); LoRA on the Conv3d patch embedding (vLLM ignores it silently: a target list naming ``proj`` reaches
    it); image-size bounds on the policy (vLLM sizes images with the
    checkpoint's processor); a CUDA policy (vLLM's CPU build); a LoRA rank vLLM has no slot for. [] for rlkit's engine."""
    r = cfg.rollout
    if r.get("engine", "rlkit") != "vllm":
        return []
    from rlkit.policy.vllm_engine import vllm_python_problem
    from rlkit.policy.vllm_facts import VLLM_LORA_RANKS, patch_embed_targets

    problems = []
    if (missing := vllm_python_problem()) is not None:
        problems.append(missing)
    if (r.top_k and r.top_k > 0) or r.top_p < 1.0:
        problems.append(f"rollout.engine=vllm with rollout.top_k={r.top_k} / rollout.top_p={r.top_p}: vLLM reports the "
                        "logprobs of the top-k / top-p truncated distribution, the update's old logprobs are the "
                        "untruncated one's (rlkit.policy.engine.sample_from_logits): set rollout.top_k=0 and "
                        "rollout.top_p=1.0, or use rollout.engine=rlkit")
    policy = cfg.policy
    lora = policy.get("lora", {}) or {}
    targets = lora.get("target_modules", "all-linear")
    targets = targets if isinstance(targets, str) else list(targets)
    conv = patch_embed_targets(targets)  # all-linear never takes it (rlkit.policy.lora.excluded_modules)
    if conv and lora.get("enabled", True):
        problems.append(f"rollout.engine=vllm: the LoRA targets {conv} adapt the vision tower's Conv3d patch embedding "
                        "(visual.patch_embed.proj), which vLLM does not apply (it samples without it, silently): use "
                        "policy.lora.target_modules=all-linear (linears only), or list the targets without 'proj', e.g. "
                        "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,qkv,"
                        "linear_fc1,linear_fc2]; or use rollout.engine=rlkit")
    bounds = [k for k in ("image_min_pixels", "image_max_pixels") if policy.get(k) is not None]
    if bounds:
        problems.append(f"rollout.engine=vllm with policy.{bounds[0]}={policy.get(bounds[0])}: vLLM sizes images with the "
                        "checkpoint's image processor, which this override does not reach; set the bounds in the "
                        "checkpoint (policy.tiny.* for a tiny build) and drop the override, or use rollout.engine=rlkit")
    if str(policy.get("device", "auto")).startswith("cuda"):
        problems.append(f"rollout.engine=vllm runs vLLM's CPU build (.venv-vllm), but policy.device={policy.device}: use "
                        "policy.device=cpu or auto on a CPU machine, or rollout.engine=rlkit")
    rank = lora.get("rank")
    if rank is not None and int(rank) > VLLM_LORA_RANKS[-1]:
        problems.append(f"rollout.engine=vllm: policy.lora.rank={rank} is above the largest LoRA rank vLLM serves "
                        f"({VLLM_LORA_RANKS[-1]}); lower it or use rollout.engine=rlkit")
    return problems


def check_config(cfg: DictConfig) -> None:
    """Raise one ConfigError with every ``config_problems`` of ``cfg`` (none: return)."""
    _raise(config_problems(cfg))


def _start_from_problems(cfg: DictConfig) -> list[str]:
    """``sft.start_from_env`` / ``sft.start_from_experiment``: a name that is not a config, both set, or set with
    a ``policy.path`` that names another start."""
    sft, problems = cfg.sft, []
    env_name, exp_name = sft.start_from_env, sft.start_from_experiment
    if not sft.enabled or not (env_name or exp_name):
        return problems
    for key, name, group in (("start_from_env", env_name, "env"), ("start_from_experiment", exp_name, "experiment")):
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        if name and options and name not in options:
            problems.append(f"sft.{key}={name!r} is not an {group} config: use one of {', '.join(options)}, or null")
    if env_name and exp_name:
        problems.append(f"sft.start_from_env={env_name} and sft.start_from_experiment={exp_name} both name a warm "
                        "start to start from: set one of them, the other null")
    if cfg.policy.get("path") is not None:
        key, name = ("start_from_env", env_name) if env_name else ("start_from_experiment", exp_name)
        problems.append(f"sft.{key}={name} starts the warm start from another job's warm start of policy.tiny, but "
                        f"policy.path={cfg.policy.path} names a checkpoint to start from: drop one of them")
    return problems


def policy_problems(policy: Any) -> list[str]:
    """What is wrong with ``policy`` (rlkit.policy.PolicyConfig.validate: dtype, device name, LoRA and tiny sizes,
    unknown keys; image pixel bounds that exclude each other), found before any build. Another policy plug-in
    than rlkit's checks its own settings."""
    from rlkit.policy.policy import PolicyConfig

    node = OmegaConf.to_container(policy, resolve=True)
    if node.get("_target_") != "rlkit.policy.load_policy":
        return []
    try:
        pc = PolicyConfig.from_dict(node)
    except (ValueError, TypeError) as e:
        return [str(e)]
    problems = []  # (the device is not checked here: backend=native_ray loads the policy on GPU workers)
    for where, lo, hi in (("policy", pc.image_min_pixels, pc.image_max_pixels),
                          ("policy.tiny", getattr(pc.tiny, "image_min_pixels", None),
                           getattr(pc.tiny, "image_max_pixels", None))):
        if lo is not None and hi is not None and lo > hi:
            problems.append(f"{where}.image_min_pixels={lo} > {where}.image_max_pixels={hi}: the image processor's "
                            "resize bounds exclude each other; raise the max or lower the min")
    if pc.tiny is not None and pc.image_max_pixels is not None and pc.image_min_pixels is None \
            and pc.tiny.image_min_pixels > pc.image_max_pixels:
        problems.append(f"policy.image_max_pixels={pc.image_max_pixels} is below the tiny build's "
                        f"policy.tiny.image_min_pixels={pc.tiny.image_min_pixels}; raise it or lower that")
    return problems


def capability_problems(cfg: DictConfig, env_spec: Any) -> list[str]:
    """The stages and terms this config turns on that the env cannot feed (rlkit.types' ``Supports*``
    capabilities), each with the override that avoids it (docs/adding-an-env.md says how to add one)."""
    cls = type(env_spec).__name__
    name = f"env {cfg.env.get('name')} ({cls})" if cfg.env.get("name") else f"env {cls}"
    problems = []
    demos = isinstance(env_spec, SupportsDemonstrations)
    if cfg.sft.enabled and not demos:
        problems.append(f"{name} has no solver (demonstration(seed), rlkit.types.SupportsDemonstrations), which the "
                        "SFT warm start needs: set sft.enabled=false (GRPO then starts from policy.path or the "
                        "untrained policy), or give the env a demonstration(seed) method")
    if cfg.aux_loss.demo_coef > 0 and not demos:
        problems.append(f"{name} has no solver (demonstration(seed), rlkit.types.SupportsDemonstrations), which the "
                        f"demonstration loss (aux_loss.demo_coef={cfg.aux_loss.demo_coef}) needs: set aux_loss=none")
    questions = isinstance(env_spec, SupportsGroundingQuestions)
    starts_elsewhere = cfg.sft.enabled and (cfg.sft.start_from_env or cfg.sft.start_from_experiment)
    if cfg.grounding.enabled and cfg.policy.get("path") is None and not starts_elsewhere and not questions:
        problems.append(f"{name} asks no grounding questions (grounding_example, rlkit.types."
                        "SupportsGroundingQuestions), which the grounding stage needs: set grounding.enabled=false")
    if cfg.sft.enabled and int(cfg.sft.grounding_mix or 0) > 0 and not questions:
        problems.append(f"{name} asks no grounding questions (rlkit.types.SupportsGroundingQuestions), which "
                        f"sft.grounding_mix={cfg.sft.grounding_mix} mixes into the warm start: set sft.grounding_mix=0")
    share = max([float(cfg.sft.get("recovery_share") or 0)]
                + [float(st.get("recovery_share") or 0) for st in cfg.sft.get("stages") or []])
    if cfg.sft.enabled and share > 0:
        if not isinstance(env_spec, SupportsRecoveryDemonstrations):
            problems.append(f"{name} shows no way back from a mistake (recovery_demonstration(seed, rng), rlkit.types."
                            f"SupportsRecoveryDemonstrations), which sft.recovery_share={share} draws: set "
                            "sft.recovery_share=0")
        elif env_spec.max_turns < 2:
            problems.append(f"sft.recovery_share={share} needs a multi-turn env (a mistake and a later turn to "
                            f"recover in); {name} has {env_spec.max_turns} turn (e.g. env.mode=plan): set "
                            "sft.recovery_share=0 or env.mode=interactive")
    if cfg.get("control") == "fixed_image":
        first = env_spec.make().reset(env_spec.eval_seeds()[0])
        if not first.images:
            problems.append(f"control=fixed_image: {name}'s observations have no image to fix; use "
                            "control=shuffled_reward")
    return problems
