"""The native backend: PyTorch + transformers + peft in this process (CPU, or one GPU).

setup -> train -> cleanup, in the torchtune recipe shape. One GRPO step (DESIGN.md):
sample B tasks -> rollout G episodes each -> reward -> group advantages -> update -> (weights are
live in this process: the engine samples from the updated model, version = step) -> eval every
``eval_interval`` -> atomic checkpoint every ``ckpt_interval`` -> metrics to the logger.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
import shutil
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from rlkit import checkpoint as ckpt
from rlkit.algorithms.grpo import group_advantages, zero_variance_groups
from rlkit.config import (KEYS_ADDED_LATER, AlgorithmConfig, EvalConfig, GroundingConfig, RolloutConfig, SFTConfig,
                          TrainerConfig, check_ranges, stop_strings)
from rlkit.console import Progress
from rlkit.evaluation import evaluate, write_outcomes
from rlkit.faults import maybe_crash
from rlkit.loggers import MetricsFile
from rlkit.rollout import rollout, rollout_stats
from rlkit.run import ConfigError, instantiate_plugin, instantiate_reward, to_dataclass
from rlkit.tasks import SolvedTaskFilter, training_sampler
from rlkit.update import grpo_update, make_scheduler, mask_unexecuted

log = logging.getLogger(__name__)

#: Config keys (dotted; a key covers everything under it) that may change when a run resumes. The new
#: values apply from the resumed step on: ``steps`` (train to the new total; a cosine schedule
#: stretches to it), ``lr`` (the base learning rate; the schedule's factor at the resumed step is
#: kept), loop cadence and checkpointing (``trainer``), where metrics go (``logger``), how the job runs
#: (``backend``, ``paths``), the extra pass@k evaluation, the reward's guard (time limit, on_error) and
#: ``rollout.reuse_kv_cache`` (how multi-turn rollouts are computed, not what they sample: exact).
#: A change to any other key (env, reward, policy, algorithm, rollout, sft, seed, group_size,
#: tasks_per_step, eval.num_tasks, ...) makes it another experiment: resuming is refused, listing them.
#: Each resume that changes something appends what changed, and from which step, to resumes.jsonl.
RESUMABLE_KEYS = ("steps", "lr", "trainer", "logger", "backend", "paths", "eval.pass_k", "eval.seen_tasks", "reward.timeout_s",
                  "reward.on_error", "rollout.reuse_kv_cache")


def build_threads(setting: int | None) -> int:
    """torch intra-op threads (an int >= 1) for the one-time builds (``trainer.build_threads``).

    ``setting`` when given; else ``$OMP_NUM_THREADS`` when set (its first level, as OpenMP reads
    ``"4,2"``; the Ray launcher sets it for a job's entrypoint to ``entrypoint_num_cpus``), else the
    cores this process may run on (``os.sched_getaffinity``, ``os.cpu_count()`` where that is missing),
    capped by the container's CPU quota (cgroup ``cpu.max``), which a pod or ``docker --cpus`` limit
    sets while the affinity still lists every core of the host. An ``$OMP_NUM_THREADS`` that is not a
    whole number >= 1 is warned about and ignored. Measured on a 2-core machine
    (scripts/bench_sft.py, a bf16 warm-start step of 32 demonstrations): 0.86 s on 1 thread, 0.60 s on 2.
    """
    if setting is not None:
        return int(setting)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        first = env.split(",")[0].strip()
        if first.isdigit() and int(first) >= 1:
            return int(first)
        log.warning("OMP_NUM_THREADS=%r is not a whole number >= 1: ignored; the builds use the usable cores "
                    "(trainer.build_threads=N sets them)", env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(1, min(cores, quota) if quota else cores)


def cgroup_cpu_limit(root: str | os.PathLike = "/sys/fs/cgroup") -> int | None:
    """CPUs the cgroup mounted at ``root`` may use, rounded up: a container's own limit, as it sees its cgroup
    at /sys/fs/cgroup (v2 ``cpu.max``: ``"<quota> <period>"`` in microseconds; v1 ``cpu/cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``; the kernel's CFS bandwidth control). None without a limit or a readable file."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        q, p = int(quota), int(period)
    except (OSError, ValueError):
        try:
            q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
            p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            return None
    if q <= 0 or p <= 0:
        return None
    return max(1, -(-q // p))


@dataclass
class RunState:
    step: int = 0
    run_id: str | None = None
    wall_time_s: float = 0.0  # training wall time accumulated over resumed segments
    eval_success_before: float | None = None


@dataclass
class SampledBatch:
    """What one GRPO step's update trains on (NativeRun._sample_batch).

    trajectories: the kept groups (N = groups x G trajectories, groups contiguous); advantages [N];
    demonstrations: the demo_coef term's solver trajectories (None when demo_coef is 0);
    metrics: the sampling half's reward/*, env/*, dynamic/*, screening/*, sync/* and timing/* metrics.
    """

    step: int
    trajectories: list[Any]
    advantages: torch.Tensor
    demonstrations: list[Any] | None
    metrics: dict[str, float]


class NativeBackend:
    """conf/backend/native.yaml. No options yet: the loop reads the typed groups."""

    def run(self, cfg: DictConfig) -> dict:
        return NativeRun(cfg).execute()


class NativeRun:
    #: algorithm.selective_rollout_explore's rlkit.tasks.SolvedTaskFilter (set in setup; None = off)
    task_filter: SolvedTaskFilter | None = None

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.algo: AlgorithmConfig = to_dataclass(cfg.algorithm, AlgorithmConfig)
        self.rollout_cfg: RolloutConfig = to_dataclass(cfg.rollout, RolloutConfig)
        self.trainer: TrainerConfig = to_dataclass(cfg.trainer, TrainerConfig)
        self.sft_cfg: SFTConfig = to_dataclass(cfg.sft, SFTConfig)
        self.grounding_cfg: GroundingConfig = to_dataclass(cfg.grounding, GroundingConfig)
        self.eval_cfg: EvalConfig = to_dataclass(cfg.eval, EvalConfig)
        self.out = Path(cfg.paths.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.metrics_file = MetricsFile(self.out / "metrics.jsonl")
        self.progress = Progress(quiet=self.trainer.quiet)
        # the start_from jobs (sft.start_from_*) whose warm starts this one's builds on, outermost first
        self._start_chain: list[str] = []
        # (evaluation set, env.holdout) of the chain's outermost job: a job in the chain that evaluates on the
        # same set holds out what that job holds out (None: this job is the outermost)
        self._chain_holdout: tuple[str, str] | None = None
        # (informative, sampled) groups of the last dynamic-sampling step: sizes the next adaptive round
        self.informative_counts: tuple[int, int] = (1, 1)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg = self.cfg
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        self._validate()
        # 1 thread unless told otherwise: the tiny policy's matmuls are small, and on a shared 2-core
        # machine a 2-thread OpenMP pool waiting for a busy core ran up to 10x slower (bench_policy.py)
        threads = self.trainer.num_threads or 1
        torch.set_num_threads(threads)
        if self.trainer.deterministic:
            torch.use_deterministic_algorithms(True)
        _seed_everything(cfg.seed)
        self.env_spec = instantiate_plugin(cfg.env, "env")
        self.reward_fn = instantiate_reward(cfg.reward)  # GuardedReward: time limit and on_error
        from rlkit.metrics_export import with_cluster_metrics

        # built (and its keys checked) before the long SFT warm start; started after resume
        self.logger = with_cluster_metrics(instantiate_plugin(cfg.logger, "logger"))
        seeds = self.env_spec.eval_seeds()
        n_eval = self.eval_cfg.num_tasks
        if n_eval is not None and not 1 <= n_eval <= len(seeds):
            raise ConfigError(f"eval.num_tasks={n_eval}: use null (all) or 1..{len(seeds)} "
                              f"(the size of {self.env_spec.eval_set_name})")
        self.eval_seeds = seeds[:n_eval] if n_eval else seeds
        n_seen, pool_size = self.eval_cfg.seen_tasks, cfg.get("train_tasks")
        if n_seen and pool_size is not None and n_seen > pool_size:
            raise ConfigError(f"eval.seen_tasks={n_seen} is more than the train_tasks={pool_size} the run trains on; "
                              f"use eval.seen_tasks <= {pool_size}")
        if self.algo.demo_coef > 0 and not callable(getattr(self.env_spec.make(), "demonstration", None)):
            raise ConfigError(f"algorithm.demo_coef={self.algo.demo_coef}: env {cfg.env.get('name', '?')} has no "
                              "demonstration() (a solver) to teach its all-fail tasks; set algorithm.demo_coef=0")
        from rlkit.sft import route_mix_problem, sft_stage_configs

        for stage in (sft_stage_configs(cfg.sft) if self.sft_cfg.enabled else []):  # before any build
            problem = route_mix_problem(self.env_spec, int(stage.get("route_mix") or 0))
            if problem:
                raise ConfigError(problem)
        problem = route_mix_problem(self.env_spec, self.algo.route_coef, "algorithm.route_coef")
        if problem:
            raise ConfigError(problem)
        problem = self._grounding_curriculum_problem()
        if problem:
            raise ConfigError(problem)
        from rlkit.policy import SamplingParams, load_policy, make_engine

        # sampling settings are checked here, before the warm start
        self.stop = stop_strings(self.rollout_cfg, self.env_spec)
        try:
            SamplingParams(temperature=self.rollout_cfg.temperature, top_p=self.rollout_cfg.top_p,
                           top_k=self.rollout_cfg.top_k, max_new_tokens=self.rollout_cfg.max_new_tokens,
                           stop=self.stop).validate()
        except ValueError as e:
            raise ConfigError(f"rollout.{e}") from None
        resume_from = self._resume_path()  # refuse a changed experiment before minutes of warm start, not after
        if resume_from is not None:
            self._check_same_experiment(resume_from)
        if self.sft_cfg.enabled or self.grounding_cfg.enabled:
            # answers the rollouts would cut are refused before minutes (a chain: an hour) of builds, not after
            self._check_answer_fits(self._tokenizer_before_builds())
        # the builds (grounding, warm start) run here alone, before any worker starts, on trainer.build_threads
        torch.set_num_threads(build_threads(self.trainer.build_threads))
        recorded = self._recorded_base(resume_from) if resume_from is not None else None
        try:
            if recorded is not None:  # the adapter goes back on the weights it was trained on, whatever keys them now
                base_path = recorded
                self.progress.say(f"resuming on the warm start the run started from: {recorded}")
            else:
                base_path = (self._warm_start(load_policy, make_engine, SamplingParams) if self.sft_cfg.enabled
                             else self._grounded_base())
        finally:
            torch.set_num_threads(threads)
        if resume_from is not None and recorded is None:
            self._warn_if_other_base(resume_from, base_path)
        self.base_path = base_path  # the warm start (or grounded base) this run starts from; result.json names it
        # control=fixed_image: a training task whose first picture every env shows (after the warm start, so
        # the control starts from the same policy). Drawn before _build_policy: native_ray's rollout workers
        # wrap their own envs with it (RolloutSpec.fixed_image_seed).
        self.fixed_image_seed: int | None = None
        if cfg.get("control") == "fixed_image":
            from rlkit.controls import fixed_image_seed

            self.fixed_image_seed = fixed_image_seed(cfg.seed, self.env_spec)
        self._build_policy(base_path)
        self._check_answer_fits(getattr(self.policy, "tokenizer", None) or base_path or cfg.policy.get("path"))
        if self.fixed_image_seed is not None:
            from rlkit.controls import FixedImageEnvSpec

            self.env_spec = FixedImageEnvSpec(self.env_spec, self.fixed_image_seed)
            self.progress.say(f"control=fixed_image: every image shown is task {self.fixed_image_seed}'s first observation")
        self.sampling = SamplingParams(
            temperature=self.rollout_cfg.temperature, top_p=self.rollout_cfg.top_p,
            top_k=self.rollout_cfg.top_k, max_new_tokens=self.rollout_cfg.max_new_tokens, n=1, seed=cfg.seed,
            stop=self.stop,
        )
        self.greedy = SamplingParams(temperature=self.rollout_cfg.eval_temperature, top_p=1.0, top_k=0,
                                     max_new_tokens=self.rollout_cfg.max_new_tokens, n=1, seed=cfg.seed,
                                     stop=self.stop)
        self.sampler = training_sampler(self.env_spec, cfg.seed, pool_size=cfg.get("train_tasks"))
        self.seen_seeds = self._seen_seeds(self.eval_cfg.seen_tasks, cfg.get("train_tasks"))
        explore = self.algo.selective_rollout_explore
        self.task_filter = (SolvedTaskFilter(cfg.seed, explore, key=getattr(self.env_spec, "task_key", None),
                                             explore_hard=self.algo.selective_rollout_explore_hard)
                            if explore is not None else None)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed)
        self.state = RunState()
        self._resume(resume_from)
        self.state.run_id = self.logger.start(
            self.out, OmegaConf.to_container(cfg, resolve=True), run_name=_run_name(), group=_sweep_group(),
            resume_id=self.state.run_id, resume_step=self.state.step,
        )
        if self.state.step > 0 and hasattr(self.logger, "resume_history"):
            # a crash loses the sink's last rows and the resumed run re-does the steps after the
            # checkpoint: let it match metrics.jsonl (already cut back to the checkpoint) first
            self.logger.resume_history(self.metrics_file.read(), self.state.step)

    def _build_policy(self, base_path: str | None) -> None:
        """Hook: ``self.policy``, ``self.engine``, ``self.optimizer`` and ``self.scheduler`` (in this
        process; backend=native_ray builds the policy on Ray workers and overrides this)."""
        from rlkit.policy import make_engine

        self.policy = instantiate_plugin(self.cfg.policy, "policy", base_path=base_path, train_mode="lora")
        self.engine = make_engine(self.policy, reuse_kv=self.rollout_cfg.reuse_kv_cache)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr, betas=tuple(self.algo.adam_betas),
                                           weight_decay=self.algo.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, self.algo, self.cfg.steps)

    def _validate(self) -> None:
        cfg = self.cfg
        problems = check_ranges(cfg)  # every typed field's valid range (rlkit.config.RANGES)
        if self.trainer.max_ckpts_to_keep < 0:
            problems.append(f"trainer.max_ckpts_to_keep={self.trainer.max_ckpts_to_keep} must be an integer >= 0 "
                            "(0 = keep all)")
        if self.trainer.resume_mode == "from_path" and not self.trainer.resume_path:
            problems.append("trainer.resume_mode=from_path needs trainer.resume_path=<checkpoint dir>")
        route_problem = self._route_pass_problem()
        if route_problem:
            problems.append(route_problem)
        if not cfg.policy.get("lora", {}).get("enabled", True):
            problems.append("policy.lora.enabled=false: GRPO trains a LoRA adapter on this backend (its checkpoints, "
                            "adapter sync and export are adapter-only), so full fine-tuning here is not supported "
                            "(backend=skyrl runs it); the warm-start stages (grounding, sft) already train every "
                            "weight. Remove the override, or adapt more with policy.lora.include_vision=true / "
                            "policy.lora.rank")
        env_name, exp_name = self.sft_cfg.start_from_env, self.sft_cfg.start_from_experiment
        if self.sft_cfg.enabled and (env_name or exp_name):
            conf = Path(__file__).resolve().parents[2] / "conf"
            for key, name, group in (("start_from_env", env_name, "env"), ("start_from_experiment", exp_name,
                                                                           "experiment")):
                options = sorted(p.stem for p in (conf / group).glob("*.yaml"))
                if name and options and name not in options:
                    problems.append(f"sft.{key}={name!r} is not an {group} config: use one of {', '.join(options)}, "
                                    "or null")
            if env_name and exp_name:
                problems.append(f"sft.start_from_env={env_name} and sft.start_from_experiment={exp_name} both name a "
                                "warm start to start from: set one of them, the other null")
            if cfg.policy.get("path") is not None:
                key, name = ("start_from_env", env_name) if env_name else ("start_from_experiment", exp_name)
                problems.append(f"sft.{key}={name} starts the warm start from another job's warm start of "
                                f"policy.tiny, but policy.path={cfg.policy.path} names a checkpoint to start from: "
                                "drop one of them")
        k = self.algo.screening_samples
        if k == 1 or k >= max(cfg.group_size, 2):
            problems.append(f"algorithm.screening_samples={k}: screening needs 2 <= screening_samples < group_size="
                            f"{cfg.group_size} (one sample cannot show rewards that differ, and the screening samples "
                            "are part of each kept group of group_size); use 0 (off)"
                            + (f" or 2..{cfg.group_size - 1}" if cfg.group_size > 2 else " or group_size >= 3"))
        m = self.algo.demo_max_successes
        if m >= cfg.group_size >= 2:  # (a group_size below 2 is refused by its own range)
            problems.append(f"algorithm.demo_max_successes={m}: a group of group_size={cfg.group_size} with that many "
                            "successes has nothing left to demonstrate; use 0 (only all-fail tasks) .. "
                            f"{cfg.group_size - 1}")
        elif m > 0 and self.algo.demo_coef == 0.0:
            problems.append(f"algorithm.demo_max_successes={m} picks the tasks of the demonstration loss, which is off "
                            "(algorithm.demo_coef=0): set demo_coef > 0, or demo_max_successes to 0")
        if self.algo.dynamic_sampling_adaptive_batch and (self.algo.dynamic_sampling_max_rounds == 0 or k > 0):
            problems.append("algorithm.dynamic_sampling_adaptive_batch=true sizes dynamic sampling's rounds: it needs "
                            "algorithm.dynamic_sampling_max_rounds > 0 and algorithm.screening_samples=0 (screening "
                            "sizes its own rounds); set those, or dynamic_sampling_adaptive_batch=false")
        if self.algo.decoupled_loss and (self.algo.update_epochs != 1 or self.algo.mini_batch_size is not None):
            problems.append("algorithm.decoupled_loss=true takes the proximal policy from the update's own forward, "
                            "so it needs one optimizer step an update: set algorithm.update_epochs=1 and "
                            "algorithm.mini_batch_size=null, or decoupled_loss=false")
        if self.algo.behav_imp_weight_cap is not None and not self.algo.decoupled_loss:
            problems.append(f"algorithm.behav_imp_weight_cap={self.algo.behav_imp_weight_cap} caps the decoupled "
                            "loss's importance weights: set algorithm.decoupled_loss=true, or the cap to null")
        if self.algo.selective_rollout_explore_hard is not None and self.algo.selective_rollout_explore is None:
            problems.append(f"algorithm.selective_rollout_explore_hard={self.algo.selective_rollout_explore_hard} "
                            "is part of the selective rollout filter, which algorithm.selective_rollout_explore "
                            "turns on: set that too (1.0 never skips solved tasks), or explore_hard to null")
        if not problems:  # last: it imports transformers (3 s), which a config refused for another reason need not wait for
            problems = self._policy_problems()
        if problems:
            raise ConfigError(problems[0] if len(problems) == 1 else
                              f"{len(problems)} bad values: " + "; ".join(problems))

    def _route_pass_problem(self) -> str | None:
        """Why this backend cannot run the env's route pass (``env.route_context=text``, rlkit.rollout), or None."""
        return None

    def _policy_problems(self) -> list[str]:
        """What is wrong with ``policy`` (rlkit.policy.PolicyConfig.validate: dtype, device name, LoRA and tiny
        sizes, unknown keys; image pixel bounds that exclude each other), found
        before any build: load_policy would find it only once the grounding stage or warm start began."""
        from rlkit.policy.policy import PolicyConfig

        node = OmegaConf.to_container(self.cfg.policy, resolve=True)
        if node.get("_target_") != "rlkit.policy.load_policy":
            return []  # another policy plug-in checks its own settings
        try:
            pc = PolicyConfig.from_dict(node)
        except (ValueError, TypeError) as e:
            return [str(e)]
        problems = []  # (the device is not checked here: backend=native_ray loads the policy on GPU workers)
        for where, lo, hi in (("policy", pc.image_min_pixels, pc.image_max_pixels),
                              ("policy.tiny", getattr(pc.tiny, "image_min_pixels", None),
                               getattr(pc.tiny, "image_max_pixels", None))):
            if lo is not None and hi is not None and lo > hi:
                problems.append(f"{where}.image_min_pixels={lo} > {where}.image_max_pixels={hi}: the image "
                                "processor's resize bounds exclude each other; raise the max or lower the min")
        if pc.tiny is not None and pc.image_max_pixels is not None and pc.image_min_pixels is None \
                and pc.tiny.image_min_pixels > pc.image_max_pixels:
            problems.append(f"policy.image_max_pixels={pc.image_max_pixels} is below the tiny build's "
                            f"policy.tiny.image_min_pixels={pc.tiny.image_min_pixels}; raise it or lower that")
        return problems

    def _grounded_base(self) -> str | None:
        """Path of the visually grounded base checkpoint (rlkit.grounding), built when missing.

        None when grounding is off or the policy is not a tiny build (a pretrained checkpoint
        already reads images). Cached under paths.cache_dir/grounding/<hash of grounding, env and
        policy configs>, built under a file lock and saved atomically, like the SFT warm start.
        """
        from rlkit.grounding import format_table, train_grounding
        from rlkit.sft import cache_key_inputs, cache_key_of, partial_dir

        cfg = self.cfg
        if not self.grounding_cfg.enabled or cfg.policy.get("path") is not None:
            return None
        # the same content hash, over the grounding config; its questions put the agent and the goal on random
        # cells of its own tree mazes whatever the env's training tasks are, so those options do not count; nor does
        # where the route is written (env.route_context): no grounding question asks for one
        env = {k: v for k, v in OmegaConf.to_container(cfg.env, resolve=True).items()
               if k not in ("train_room_endpoints", "train_open_passage", "route_context")}
        inputs = cache_key_inputs(cfg.grounding, env, cfg.policy)
        out_dir = Path(cfg.paths.cache_dir) / "grounding" / cache_key_of(inputs)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(out_dir.with_suffix(".lock")):
            if (out_dir / "grounding_summary.json").is_file():
                summary = json.loads((out_dir / "grounding_summary.json").read_text())
                self.progress.say(f"grounding: reusing {out_dir} (held-out {summary['stop_metric']} accuracy "
                                  f"{summary['final'][summary['stop_metric']]:.1%})")
                shutil.rmtree(partial_dir(out_dir), ignore_errors=True)  # left by a build killed as it finished
                return str(out_dir)
            self.progress.say(f"grounding: building {out_dir} (cached for later runs)")
            base = instantiate_plugin(cfg.policy, "policy", base_path=None, train_mode="full")
            summary = train_grounding(self.env_spec, base, self.grounding_cfg, out_dir,
                                      progress=self.progress.grounding, build={"stage": "grounding", "inputs": inputs},
                                      on_resume=lambda step: self.progress.say(
                                          f"grounding: resuming the stopped build at step {step} "
                                          f"(its progress: {partial_dir(out_dir)})"))
            self.progress.say(f"grounding: {summary['steps']} steps, {summary['wall_time_s']:.0f}s; held-out "
                              f"exact-match accuracy by task:\n" + format_table({"image": summary["final"]}))
            del base
        return str(out_dir)

    def _tokenizer_before_builds(self) -> Any:
        """The policy's tokenizer without its weights, for ``_check_answer_fits`` before any build: the
        checkpoint folder at ``policy.path`` (loaded there), the tokenizer the tiny build of ``policy.tiny``
        gets (rlkit.policy.tokenizer.build_tiny_tokenizer, deterministic), or None (no ``policy.tiny`` and no
        path: nothing to check yet; the check runs again on the loaded policy)."""
        path = self.cfg.policy.get("path")
        if path:
            return path
        tiny = OmegaConf.select(self.cfg, "policy.tiny")
        if tiny is None:
            return None
        from rlkit.policy.tiny import TinyVLSizes
        from rlkit.policy.tokenizer import build_tiny_tokenizer

        vocab = tiny.get("vocab_size") or TinyVLSizes.vocab_size
        return build_tiny_tokenizer(vocab)

    def _check_answer_fits(self, tokenizer: Any) -> None:
        """Raise ConfigError when the solver's answer to an evaluation task needs more tokens in one turn than
        ``rollout.max_new_tokens``: such an answer would be cut, so a task would count as failed however well
        the policy learned it (plan formats that write notes, e.g. env.parser=plan_cells, need more).

        ``tokenizer``: the policy's, or a checkpoint folder to load it from (a driver that holds no model:
        backend=native_ray); None or a hub name skips the check."""
        from rlkit.sft import longest_demonstration

        if isinstance(tokenizer, (str, os.PathLike)):
            if not Path(tokenizer).is_dir():
                return
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        if tokenizer is None:
            return
        need, seed = longest_demonstration(self.env_spec, tokenizer, self.eval_seeds, self.stop or ())
        have = self.rollout_cfg.max_new_tokens
        if need > have:
            raise ConfigError(f"rollout.max_new_tokens={have} cuts answers: the solver's answer to evaluation task "
                              f"{seed} is {need} tokens in env.parser={self.cfg.env.get('parser', '?')}'s format; "
                              f"set rollout.max_new_tokens={need} or more")

    def _warm_start(self, load_policy: Any, make_engine: Any, SamplingParams: Any) -> str:
        """Path of the SFT warm-start checkpoint; builds it (full fine-tune) when missing.

        With grounding.enabled, a tiny policy is first visually grounded (``_grounded_base``) and SFT
        starts from that. With ``sft.start_from_env`` / ``sft.start_from_experiment``, it starts instead from
        another job's warm start (``_other_warm_start``), keyed as the job ``policy.path=<that warm start>
        ~policy.tiny policy.image_max_pixels=<this env's>`` keys its own. With ``sft.stages``, each later stage then
        continues from the previous one's checkpoint (rlkit.sft.sft_stage_configs); the last stage's
        checkpoint is the warm start.
        """
        from rlkit.sft import cache_key_inputs, cache_key_of, prompt_fingerprint, sft_stage_config, sft_stage_configs

        cfg = self.cfg
        stages = sft_stage_configs(cfg.sft)
        sft_key = sft_stage_config(cfg.sft)
        # the greedy validation that decides where the stage stops decodes with these
        decoding = {"max_new_tokens": self.rollout_cfg.max_new_tokens, "stop": list(self.stop or [])}
        prompt = prompt_fingerprint(self.env_spec)  # the demonstrations answer this prompt (code, not config)
        label = "" if len(stages) == 1 else f" stage 1/{len(stages)}"
        source = self._start_from()
        if source:
            start = self._other_warm_start(source, load_policy, make_engine, SamplingParams)
            if self.grounding_cfg.enabled:
                self.progress.say(f"grounding: not run on this env; the warm start starts from the warm start of "
                                  f"{source} (sft.start_from_{source.split('=')[0]})")
            policy = self._chained_policy(start)
            inputs = cache_key_inputs(self._with_mixed_tasks(sft_key), cfg.env, policy, decoding, prompt)
            out_dir = self._sft_stage(Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), start, self.sft_cfg,
                                      make_engine, SamplingParams, label=label, policy_cfg=policy,
                                      build={"stage": f"sft{label}", "start": start, "inputs": inputs})
        else:
            grounded = self._grounded_base()
            # A warm start from a grounded base also depends on how that base was grounded.
            stage_key = self._with_mixed_tasks(sft_key) if grounded is None else {
                "sft": sft_key, "grounding": OmegaConf.to_container(cfg.grounding, resolve=True)}
            inputs = cache_key_inputs(stage_key, cfg.env, cfg.policy, decoding, prompt)
            out_dir = self._sft_stage(Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), grounded, self.sft_cfg,
                                      make_engine, SamplingParams, label=label,
                                      build={"stage": f"sft{label}", "start": grounded, "inputs": inputs})
        for i, stage in enumerate(stages[1:], start=2):
            # keyed as the job `policy.path=<previous stage> ~policy.tiny sft.<stage keys>` keys its warm start
            policy = self._chained_policy(out_dir)
            stage_key = self._with_mixed_tasks(sft_stage_config(stage))
            inputs = cache_key_inputs(stage_key, cfg.env, policy, decoding, prompt)
            label = f" stage {i}/{len(stages)} (sft.stages[{i - 2}])"
            out_dir = self._sft_stage(Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), str(out_dir),
                                      SFTConfig(**stage), make_engine, SamplingParams, label=label, policy_cfg=policy,
                                      build={"stage": f"sft{label}", "start": str(out_dir), "inputs": inputs})
        return str(out_dir)

    def _with_mixed_tasks(self, key: dict[str, Any]) -> dict[str, Any]:
        """A warm-start stage's cache key (``sft_stage_config``) plus the grounding tasks it mixes in
        (``grounding.curriculum``'s last phase) when it mixes some (``grounding_mix`` > 0) and they are not
        ``["walls"]``, the tasks of every build before this key existed (their keys stay). A stage on a grounded base
        needs none: the grounding config is in its key."""
        if int(key.get("grounding_mix") or 0) <= 0 or not hasattr(self.env_spec, "grounding_example"):
            return key
        tasks = self._mixed_grounding_tasks()
        return key if tasks == ["walls"] else {**key, "grounding_mix_tasks": tasks}

    def _mixed_grounding_tasks(self) -> list[str]:
        """The grounding tasks ``sft.grounding_mix`` draws its questions from: ``grounding.curriculum``'s last phase
        (rlkit.grounding.curriculum_phases; every task the env offers when it is empty). Raises its ValueError."""
        from rlkit.grounding import curriculum_phases

        return curriculum_phases(self.env_spec, self.cfg.grounding.get("curriculum"))[-1]

    def _chained_policy(self, path: str | Path) -> dict[str, Any]:
        """The policy config of a job that starts from the checkpoint at ``path`` (``policy.path=<path>
        ~policy.tiny``), as a warm-start stage from it is keyed and loaded. Under ``sft.start_from_env`` /
        ``sft.start_from_experiment`` it also sets ``image_max_pixels`` to this env's
        (``policy.tiny.image_max_pixels``): the checkpoint of the other job's build carries that job's image size."""
        policy = OmegaConf.to_container(self.cfg.policy, resolve=True)
        tiny = policy.pop("tiny", None) or {}
        policy["path"] = str(path)
        if self._start_from() and policy.get("image_max_pixels") is None:
            policy["image_max_pixels"] = tiny.get("image_max_pixels")
        return policy

    def _grounding_curriculum_problem(self) -> str | None:
        """What is wrong with ``grounding.curriculum`` (rlkit.grounding.curriculum_phases), checked before any build,
        where a build will read it: this job's grounding stage (on, no ``policy.path``, no ``sft.start_from_*``, which
        skips it) or a warm-start stage's grounding questions (``sft.grounding_mix`` > 0 on an env that has them;
        train_sft refuses a mix on one that has not). None when it is fine or unread."""
        cfg = self.cfg
        from rlkit.sft import sft_stage_configs

        stages = sft_stage_configs(cfg.sft) if self.sft_cfg.enabled else []
        grounds = (self.grounding_cfg.enabled and cfg.policy.get("path") is None
                   and not (self.sft_cfg.enabled and self._start_from()))
        mixes = hasattr(self.env_spec, "grounding_example") and any(int(st.get("grounding_mix") or 0) > 0
                                                                    for st in stages)
        if not (grounds or mixes):
            return None
        from rlkit.grounding import curriculum_phases

        try:
            curriculum_phases(self.env_spec, cfg.grounding.get("curriculum"))
        except ValueError as e:
            return str(e) if grounds else f"{e} (read by sft.grounding_mix: fix it, or set sft.grounding_mix=0)"
        return None

    def _start_from(self) -> str | None:
        """The override naming the job whose warm start this one starts from (``env=<name>`` for
        ``sft.start_from_env``, ``experiment=<name>`` for ``sft.start_from_experiment``), or None."""
        if self.sft_cfg.start_from_env:
            return f"env={self.sft_cfg.start_from_env}"
        if self.sft_cfg.start_from_experiment:
            return f"experiment={self.sft_cfg.start_from_experiment}"
        return None

    def _other_warm_start(self, source: str, load_policy: Any, make_engine: Any, SamplingParams: Any) -> str:
        """Path of the warm start that ``python train.py <source>`` builds; built when missing, cached as that
        job caches it. ``env=<name>`` (``sft.start_from_env``): that env's config, recipe, grounding stage and
        image size (conf/image_grid/), this job's ``policy`` otherwise. ``experiment=<name>``
        (``sft.start_from_experiment``): that job's whole config, its policy included. That job may start from
        yet another one's warm start (a chain such as 7x7 -> 9x9 -> 7x7); the chain may not come back to a job
        in it.

        A job in the chain that evaluates on the outermost job's evaluation set gets that job's ``env.holdout``
        (with ``dihedral``, no stage of the chain trains on a turned or mirrored twin of an evaluation maze).

        Raises: ConfigError when ``source`` is this job's env, that job has no warm start (sft.enabled=false),
        the chain of start_from jobs comes back to one already in it, this job's ``policy.tiny`` differs from an
        experiment's (it would change nothing), or a job in the chain refuses its config (the message names the
        chain).
        """
        from rlkit.config import stop_strings
        from rlkit.run import compose_train

        cfg = self.cfg
        chain = [*self._start_chain, source]
        if source in self._start_chain:
            raise ConfigError(f"sft.start_from_*: the warm starts chain {' -> '.join(chain)} comes back to "
                              f"{source}, whose warm start would have to start from itself; end the chain at a job "
                              "with sft.start_from_env and sft.start_from_experiment null")
        group, name = source.split("=", 1)
        other = compose_train([source])  # a name that is not a config was refused in _validate
        holdout = self._chain_holdout or (getattr(self.env_spec, "eval_set_name", None), cfg.env.get("holdout"))
        other_spec = instantiate_plugin(other.env, "env")
        if (holdout[0] is not None and getattr(other_spec, "eval_set_name", None) == holdout[0]
                and other.env.get("holdout") != holdout[1]):
            # it trains for the same evaluation set: what the outermost job keeps out of training, it keeps out too
            with open_dict(other):
                other.env.holdout = holdout[1]
            other_spec = instantiate_plugin(other.env, "env")
            self.progress.say(f"SFT warm start: {source} evaluates on {holdout[0]} too, so its stages hold out "
                              f"what this job does (env.holdout={holdout[1]})")
        if group == "env" and (OmegaConf.to_container(other.env, resolve=True)
                               == OmegaConf.to_container(cfg.env, resolve=True)):
            raise ConfigError(f"sft.start_from_env={name} is this job's env: a warm start cannot start from "
                              "itself; name another env (e.g. a smaller maze), or null")
        if not other.sft.enabled:
            raise ConfigError(f"sft.start_from_{group}={name}: the job {source} has no warm start to start from "
                              "(its sft.enabled=false); name another one, or null")
        if group == "env":  # this job's policy at that env's image size
            policy = OmegaConf.to_container(cfg.policy, resolve=True)
            if policy.get("tiny") and OmegaConf.select(other, "policy.tiny") is not None:
                for k in ("image_min_pixels", "image_max_pixels"):  # that env's image size (conf/image_grid/)
                    policy["tiny"][k] = other.policy.tiny[k]
            with open_dict(other):
                other.policy = policy
        else:  # that job's own policy: an override of this job's policy.tiny would build nothing
            self._check_same_tiny(other, source)
        with open_dict(other):
            other.paths.output_dir = str(self.out)
            other.paths.cache_dir = str(cfg.paths.cache_dir)
            other.trainer.quiet = self.trainer.quiet
        run = NativeRun(other)
        run._start_chain, run._chain_holdout = chain, holdout
        run.progress = self.progress
        run.env_spec = other_spec
        run.stop = stop_strings(run.rollout_cfg, run.env_spec)
        run.eval_seeds = run.env_spec.eval_seeds()
        self.progress.say(f"SFT warm start: first the warm start of {source} (sft.start_from_{group})")
        try:
            run._validate()
            problem = run._grounding_curriculum_problem()  # its own builds read its curriculum
            if problem:
                raise ConfigError(problem)
            # its own answers must fit its rollouts too: refused before its chain's builds, not after them
            run._check_answer_fits(run._tokenizer_before_builds())
            return run._warm_start(load_policy, make_engine, SamplingParams)
        except ConfigError as e:
            raise ConfigError(f"in the warm start this job starts from ({' -> '.join(chain)}): {e}") from e

    def _check_same_tiny(self, other: Any, source: str) -> None:
        """Refuse this job's ``policy.tiny`` when it differs from ``other``'s in more than the image size: the
        warm start is built by ``other``'s policy, and this job loads it from its checkpoint (``~policy.tiny``),
        so such an override would change nothing.

        Raises: ConfigError naming each differing ``policy.tiny`` key with both values."""
        mine, theirs = (OmegaConf.to_container(c.policy, resolve=True).get("tiny") or {} for c in (self.cfg, other))
        differ = sorted(k for k in set(mine) | set(theirs) if not k.startswith("image_")
                        and mine.get(k) != theirs.get(k))
        if mine and differ:
            raise ConfigError(f"sft.start_from_experiment: {source} builds the warm start this job starts from with its "
                              "own policy, so this job's " + ", ".join(f"policy.tiny.{k}={mine.get(k)}" for k in differ)
                              + " would change nothing (that job has " + ", ".join(f"{theirs.get(k)}" for k in differ)
                              + "); drop the override, or set it in that experiment's config")

    def _sft_stage(self, out_dir: Path, base_path: str | None, sft_cfg: SFTConfig, make_engine: Any,
                   SamplingParams: Any, label: str = "", policy_cfg: dict[str, Any] | None = None,
                   build: dict[str, Any] | None = None) -> Path:
        """Build one warm-start stage into ``out_dir`` from ``base_path`` (None: the policy config's own
        weights), or reuse it when its summary is there; under a file lock, saved atomically.
        ``policy_cfg``: the policy config to load it with (None: ``cfg.policy``); ``build``: what the
        summary records of how it was built (rlkit.sft.train_sft)."""
        from rlkit.sft import partial_dir, train_sft

        cfg = self.cfg
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(out_dir.with_suffix(".lock")):
            if (out_dir / "sft_summary.json").is_file():
                summary = json.loads((out_dir / "sft_summary.json").read_text())
                self.progress.say(f"SFT warm start{label}: reusing {out_dir} (val success {summary['val_success']:.1%})")
                shutil.rmtree(partial_dir(out_dir), ignore_errors=True)  # left by a build killed as it finished
                return out_dir
            policy = cfg.policy if policy_cfg is None else OmegaConf.create(policy_cfg)
            base = instantiate_plugin(policy, "policy", base_path=base_path, train_mode="full")
            self._check_answer_fits(base.tokenizer)  # before minutes of supervised learning towards cut answers
            self.progress.say(f"SFT warm start{label}: building {out_dir} (cached for later runs)")
            engine = make_engine(base, reuse_kv=self.rollout_cfg.reuse_kv_cache)
            greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0,
                                    max_new_tokens=self.rollout_cfg.max_new_tokens, n=1, seed=0, stop=self.stop)
            if sft_cfg.grounding_mix > 0 and hasattr(self.env_spec, "grounding_example"):
                tasks = self._mixed_grounding_tasks()
            else:  # no questions mixed in (train_sft refuses a mix on an env without them, naming the fix)
                tasks = list(getattr(self.env_spec, "grounding_tasks", ()))
            summary = train_sft(self.env_spec, base, engine, sft_cfg, greedy, out_dir,
                                progress=self.progress.sft, grounding_tasks=tasks, build=build,
                                on_resume=lambda step: self.progress.say(
                                    f"SFT warm start{label}: resuming the stopped build at step {step} "
                                    f"(its progress: {partial_dir(out_dir)})"))
            self.progress.say(f"SFT warm start{label}: {summary['steps']} steps, val success "
                              f"{summary['val_success']:.1%} on {sft_cfg.val_tasks} held-out training "
                              f"tasks (not the eval set), {summary['wall_time_s']:.0f}s")
            del base, engine
        return out_dir

    # ---------------------------------------------------------------- resume
    def _resume_path(self) -> Path | None:
        """The checkpoint this run resumes from (trainer.resume_mode), or None to start fresh.

        Raises: CheckpointError on an unusable trainer.resume_path, or on resume_mode=none over existing checkpoints.
        """
        mode = self.trainer.resume_mode
        path: Path | None = None
        if mode == "from_path":
            path = Path(self.trainer.resume_path)
            problem = ckpt.verify(path) if path.is_dir() else "it does not exist"
            if problem:
                raise ckpt.CheckpointError(f"trainer.resume_path={path} is not a usable checkpoint: {problem}")
        elif mode == "latest":
            path = ckpt.find_latest(self.ckpt_root)
            unusable = sorted(self.ckpt_root.glob(f"{ckpt.PREFIX}*")) if path is None and self.ckpt_root.is_dir() else []
            if unusable:  # an earlier run's checkpoints, none usable: starting fresh would redo (and overwrite) it
                raise ckpt.CheckpointError(
                    f"{self.ckpt_root} holds {len(unusable)} checkpoint(s) of an earlier run and none is usable "
                    f"({unusable[-1].name}: {ckpt.verify(unusable[-1])}); repair or copy one back, or start that "
                    "run over with trainer.resume_mode=none trainer.overwrite=true")
        elif mode == "none" and ckpt.complete_checkpoints(self.ckpt_root) and not self.trainer.overwrite:
            raise ckpt.CheckpointError(
                f"{self.ckpt_root} already holds checkpoints and trainer.resume_mode=none; "
                f"use trainer.resume_mode=latest to continue, or trainer.overwrite=true to start over there"
            )
        return path

    def _recorded_base(self, path: Path) -> str | None:
        """The built stage (warm start or grounded base) the checkpoint at ``path`` was trained on, as its adapter
        records it (``rlkit_adapter.json``'s base_model), when it still exists as a finished build: at the recorded
        path, or under this run's ``paths.cache_dir`` (a moved or shared cache keeps its entries' names); else None.

        A resumed run puts its adapter back on those weights rather than on what the config keys today: a key
        that now hashes more (the env's prompt, session 29) or a build rounded on another CPU would otherwise
        rebuild a warm start and stack the adapter on other weights. Says so when that warm start was built for
        another prompt or answer format than the env's today (``rlkit.sft.prompt_fingerprint``)."""
        if not self.sft_cfg.enabled and (not self.grounding_cfg.enabled or self.cfg.policy.get("path") is not None):
            return None  # the base is policy.path itself (no grounding stage runs on a checkpoint)
        base = _adapter_base_model(path)
        if not base:
            return None
        summaries = ("sft_summary.json", "grounding_summary.json")
        for folder in (Path(base), Path(self.cfg.paths.cache_dir) / Path(base).parent.name / Path(base).name):
            done = [folder / f for f in summaries if (folder / f).is_file()]
            if done:
                break
        else:
            return None
        from rlkit.sft import prompt_fingerprint

        try:
            built_for = json.loads(done[0].read_text()).get("build", {}).get("inputs", {}).get("prompt")
        except (OSError, ValueError):
            built_for = None
        if built_for is not None and built_for != prompt_fingerprint(self.env_spec):
            self.progress.say(f"warning: the warm start {folder} was built for another prompt or answer format than "
                              "the env's today; the resumed run goes on from it, as it started (start fresh to "
                              "rebuild: trainer.resume_mode=none trainer.overwrite=true)")
        return str(folder)

    def _warn_if_other_base(self, path: Path, base_path: str | None) -> None:
        """Say so when a resumed run's base is not the one its checkpoint recorded (that build is gone)."""
        base = _adapter_base_model(path)
        if base and base_path and Path(base).name != Path(base_path).name:
            self.progress.say(f"warning: the checkpoint's adapter was trained on {base}, which is gone; it resumes "
                              f"on {base_path}, built from today's config (other weights where the build differs)")

    def _resume(self, path: Path | None) -> None:
        """Load the checkpoint at ``path`` (from ``_resume_path``, checked by ``_check_same_experiment``), or start fresh.

        The run is accepted here (rlkit.run.accept_run_config): its settings checked, its builds done, and
        nothing of it written into the folder yet."""
        from rlkit.run import accept_run_config

        accept_run_config(self.out)
        if path is None:
            self.progress.say("starting fresh (no checkpoint to resume from)")
            self._clear_earlier_run()
            self.metrics_file.truncate_lines(0)  # metrics of an earlier attempt are not this run's
            return
        changes = self._check_same_experiment(path)  # the changed resumable keys (refusals were raised in setup)
        self.policy.load_adapter(path / "adapter")
        trainer_state = torch.load(path / "optimizer.pt", weights_only=True)
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        meta = json.loads((path / "trainer_state.json").read_text())
        self.sampler.load_state_dict(meta["sampler"])
        if self.task_filter is not None and "task_filter" in meta:
            self.task_filter.load_state_dict(meta["task_filter"])
        self.informative_counts = tuple(meta.get("informative_counts", (1, 1)))  # sizes the next adaptive round
        self.state = RunState(step=meta["step"], run_id=meta.get("run_id"), wall_time_s=meta.get("wall_time_s", 0.0),
                              eval_success_before=meta.get("eval_success_before"))
        random.setstate(_tuplify(meta["python_rng"]))
        np.random.set_state(_tuplify(meta["numpy_rng"]))
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        self.shuffle_gen.set_state(rng["shuffle"])
        # drop what was logged after this checkpoint (the lost part of the run), by line count
        self.metrics_file.truncate_lines(meta.get("metrics_lines", 0))
        self.progress.say(f"resuming from {path} at step {self.state.step}")
        self._apply_resume_changes(path, changes)

    def _clear_earlier_run(self) -> None:
        """Under ``trainer.overwrite=true`` (start over in this folder), remove what the earlier run there wrote
        before this one starts: its checkpoints (``step_*``, ``latest``), evaluations (``eval/step_*.json``,
        ``final.json``, ``seen_*.json``), exports (``exports/step_*``), adapter (``adapter/`` holding
        ``rlkit_adapter.json``), ``result.json`` and ``resumes.jsonl``; nothing else, so a run pointed at a
        folder that holds other work removes none of it. Kept, they would be read as this run's: checkpoint
        pruning keeps the newest step numbers (the earlier run's), and scripts/route_errors.py and report.py
        list every eval/*.json."""
        if not self.trainer.overwrite:
            return
        out, removed = self.out, []
        targets = [*self.ckpt_root.glob(f"{ckpt.PREFIX}*"), self.ckpt_root / ckpt.LATEST,
                   *self.ckpt_root.glob(".tmp-*"), *(out / "eval").glob("step_*.json"), out / "eval" / "final.json",
                   *(out / "eval").glob("seen_*.json"), *(out / "exports").glob("step_*"),
                   out / "result.json", out / "resumes.jsonl"]
        if (out / "adapter" / "rlkit_adapter.json").is_file():
            targets.append(out / "adapter")
        for t in targets:
            if t.is_symlink() or t.is_file():
                t.unlink()
            elif t.is_dir():
                shutil.rmtree(t)
            else:
                continue
            removed.append(t.relative_to(out).parts[0])
        if removed:
            self.progress.say(f"starting over in {out} (trainer.overwrite=true): removed the earlier run's "
                              f"{', '.join(dict.fromkeys(removed))}")

    def _check_same_experiment(self, path: Path) -> dict[str, tuple[Any, Any]]:
        """Compare this run's config with the checkpoint's; returns the changed RESUMABLE_KEYS leaves
        as {dotted key: (checkpoint value, new value)}.

        Raises: CheckpointError listing every changed key outside RESUMABLE_KEYS, with the fix.
        """
        changes = config_changes(OmegaConf.load(path / "config.yaml"), self.cfg, KEYS_ADDED_LATER)
        refused = sorted(k for k in changes if not _resumable(k))
        if refused:
            shown = ", ".join(f"{k} ({changes[k][0]!r} -> {changes[k][1]!r})" for k in refused[:12])
            more = f" and {len(refused) - 12} more" if len(refused) > 12 else ""
            raise ckpt.CheckpointError(
                f"cannot resume from {path}: these keys change the experiment: {shown}{more}. "
                f"On resume only these may change: {', '.join(RESUMABLE_KEYS)}. Restore the others, or start a "
                f"new run (another hydra.run.dir, or trainer.resume_mode=none trainer.overwrite=true)."
            )
        self._check_sweep_resume(path, changes)
        return changes

    def _check_sweep_resume(self, path: Path, changes: dict[str, tuple[Any, Any]]) -> None:
        """In a sweep (``-m``), refuse a resume that changes a key this sweep sweeps, even a resumable one.

        Hydra matches a sweep's jobs to folders by job number, so a sweep run again into the same
        ``hydra.sweep.dir`` with another value list (one added, another order) would hand job 0's folder,
        trained at ``lr=1e-5``, the value ``lr=1e-4``: it would resume with nothing left to train and be listed
        under the new value. The swept keys come from the sweep's ``multirun.yaml`` in a local multirun, and
        from ``$RLKIT_SWEPT_KEYS`` (rlkit.sweep.SWEPT_KEYS_ENV) in a job the Ray Jobs launchers run on a
        cluster, a single run there. Raises CheckpointError naming the key, both values and the fix."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from rlkit.sweep import SWEPT_KEYS_ENV, swept_keys

        if self.ckpt_root.resolve() not in Path(path).resolve().parents:
            return  # trainer.resume_path: a sweep may well start every job from one checkpoint elsewhere
        try:
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                swept = swept_keys(Path(hc.sweep.dir))
            else:
                swept = {k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k}
        except Exception:  # noqa: BLE001 - not a Hydra run (tests, launchers calling run() directly)
            return
        clash = sorted(k for k in changes if any(k == s or k.startswith(s + ".") for s in swept))
        if clash:
            shown = ", ".join(f"{k}={changes[k][0]!r}" for k in clash)
            now = ", ".join(f"{k}={changes[k][1]!r}" for k in clash)
            raise ckpt.CheckpointError(
                f"cannot resume {self.out} in this sweep: that folder's run has {shown} ({path}), and this sweep "
                f"gives its job {now}. Hydra matches a sweep's jobs to folders by number, so a sweep with other "
                "values (one added, another order) would relabel finished runs. Run the new values into a new "
                "hydra.sweep.dir (with launcher=ray / hyperpod also a new hydra.launcher.sweep_dir, when it is "
                "set), or repeat the earlier sweep's values to resume it."
            )

    def _apply_resume_changes(self, path: Path, changes: dict[str, tuple[Any, Any]]) -> None:
        """Make the resumed run use its new settings (RESUMABLE_KEYS) and record them in resumes.jsonl.

        ``lr``: the checkpoint's optimizer and scheduler carry the old base lr; replace it. ``steps``:
        the scheduler was built for the new total (a cosine stretches to it), but the loaded optimizer
        holds the lr the old total gave the resumed step. Either way the resumed step's lr is set to the
        new base lr x the new schedule's factor at that step. The other keys are read from cfg as the
        loop goes.
        """
        if "lr" in changes:
            lr = float(self.cfg.lr)
            self.scheduler.base_lrs = [lr for _ in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["initial_lr"] = lr
        if "lr" in changes or "steps" in changes:
            factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
                group["lr"] = base * factor
            self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        if changes:
            shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in sorted(changes.items())))
            self.progress.say(f"resuming with changed settings from step {self.state.step + 1}: {shown}")
            record = {"from_step": self.state.step + 1, "checkpoint": str(path),
                      "changes": {k: {"was": a, "now": b} for k, (a, b) in sorted(changes.items())}}
            with open(self.out / "resumes.jsonl", "a") as f:
                f.write(json.dumps(record, default=str) + "\n")

    def _save(self, step: int) -> None:
        cfg_yaml = OmegaConf.to_yaml(self.cfg, resolve=False)

        def contents(d: Path) -> None:
            self.policy.save_adapter(d / "adapter")
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                       d / "optimizer.pt")
            maybe_crash("checkpoint", step)
            torch.save({"torch": torch.get_rng_state(), "shuffle": self.shuffle_gen.get_state()}, d / "rng.pt")
            meta = {"step": step, "sampler": self.sampler.state_dict(), "run_id": self.state.run_id,
                    "wall_time_s": self.state.wall_time_s, "eval_success_before": self.state.eval_success_before,
                    "python_rng": random.getstate(), "numpy_rng": _listify(np.random.get_state()),
                    "informative_counts": list(self.informative_counts),
                    **({"task_filter": self.task_filter.state_dict()} if self.task_filter is not None else {}),
                    "metrics_lines": self.metrics_file.num_lines()}
            (d / "trainer_state.json").write_text(json.dumps(meta, default=_json_default))
            (d / "config.yaml").write_text(cfg_yaml)

        ckpt.save(self.ckpt_root, step, contents, max_to_keep=self.trainer.max_ckpts_to_keep)

    # ---------------------------------------------------------------- train
    def _eval(self, step: int, tag: str) -> dict[str, float]:
        from rlkit.report.episodes import SAMPLE_COLUMNS, sample_rows

        t0 = time.time()
        with self.progress.phase("eval", step=step, total=self.cfg.steps, detail=f"{len(self.eval_seeds)} tasks"):
            metrics, per_task, trajs = self._evaluate(step)
            if self.seen_seeds:
                seen, seen_tasks = self._evaluate_seen(step)
                seen = {f"eval_seen/{k.split('/', 1)[1]}": v for k, v in seen.items()
                        if k in ("eval/success_rate", "eval/num_tasks", "eval/distinct_outputs")}
                write_outcomes(self.out / "eval" / f"seen_{tag}.json", "trained-on", step, seen, seen_tasks)
                metrics.update(seen)
        metrics["timing/eval"] = time.time() - t0
        write_outcomes(self.out / "eval" / f"{tag}.json", self.env_spec.eval_set_name, step, metrics, per_task)
        # the first 8 tasks of the fixed set, so the same mazes can be compared across evaluations
        rows = sample_rows(self.env_spec, self.reward_fn, trajs[:8])
        self.logger.log_table("eval/samples", SAMPLE_COLUMNS, rows, step)
        return metrics

    def _evaluate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """Hook: rlkit.evaluation.evaluate's (metrics, per_task, trajectories) on the fixed set."""
        return evaluate(self.env_spec, self.policy, self.engine, self.eval_seeds, self.greedy, policy_version=step,
                        pass_k=self.eval_cfg.pass_k, pass_k_sampling=replace(self.sampling, seed=self.cfg.seed + step))

    def _evaluate_seen(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Hook: rlkit.evaluation.evaluate's (eval/* metrics, per_task), greedy, on ``self.seen_seeds`` (no pass@k)."""
        return evaluate(self.env_spec, self.policy, self.engine, self.seen_seeds, self.greedy, policy_version=step)[:2]

    def _seen_seeds(self, n: int, pool_size: int | None) -> list[int]:
        """The first ``n`` distinct seeds of this run's training stream (a fresh TaskSampler with the run's
        seed and pool draws them in the order the run does), for ``eval.seen_tasks``: tasks the run rolls
        out in its first steps, so greedy success on them is success on trained-on tasks. ``n`` is at
        most the pool's size (checked in setup)."""
        if not n:
            return []
        stream = training_sampler(self.env_spec, self.cfg.seed, pool_size=pool_size)
        seeds: dict[int, None] = {}  # insertion-ordered set: the stream's order, a repeated seed once
        while len(seeds) < n:
            seeds.update(dict.fromkeys(stream.sample(n - len(seeds))))
        return list(seeds)

    def _rollout(self, step: int, seeds: list[int], sampling: Any,
                 group_size: int | None = None) -> tuple[list[Any], dict[str, float]]:
        """Hook: ``group_size`` (default: the run's G) samples of each task in ``seeds``, groups
        contiguous (B*G trajectories), and extra step metrics ({} here).

        Step ``step`` (1-based) samples with the adapter after ``step - 1`` updates: policy_version
        ``step - 1``, as backend=native_ray's published version (rlkit.rollout.Trajectory)."""
        trajs = rollout(self.env_spec, self.policy, self.engine, seeds, group_size or self.cfg.group_size, sampling,
                        policy_version=step - 1)
        return trajs, {}

    def _update(self, step: int, trajs: list[Any], advantages: torch.Tensor,
                demonstrations: list[Any] | None = None) -> dict[str, float]:
        """Hook: the GRPO update on this step's batch (+ the demo_coef term on ``demonstrations``) and the
        LR scheduler step; policy/* metrics."""
        t0 = time.time()
        routes = self._route_questions(step)
        route_s = time.time() - t0
        update = grpo_update(self.policy, self.optimizer, trajs, advantages, self.algo,
                             temperature=self.rollout_cfg.temperature if self.rollout_cfg.temperature > 0 else 1.0,
                             generator=self.shuffle_gen, on_backward=lambda: maybe_crash("update", step),
                             demonstrations=demonstrations, route_questions=routes)
        if routes is not None:
            update["timing/route"] = route_s  # drawing and encoding them (their forward is in the update's time)
        with warnings.catch_warnings():
            # a skipped update (no group with signal) still advances the schedule, which is per GRPO step;
            # torch warns when that happens before the first optimizer step
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
            self.scheduler.step()
        return update

    def _route_questions(self, step: int) -> list[Any] | None:
        """The ``algorithm.route_coef`` term's ``route_batch`` route questions of step ``step`` (None when the
        term is off; rlkit.sft.draw_route_questions: the same questions after a resume, on every backend)."""
        if self.algo.route_coef <= 0:
            return None
        from rlkit.sft import draw_route_questions

        return draw_route_questions(self.env_spec, self.policy, int(self.cfg.seed), step, self.algo.route_batch)

    def _sample_round(self, step: int, sampling: Any, timing: dict[str, float], seeds: list[int] | None = None,
                      group_size: int | None = None) -> tuple[list[Any], list[Any], dict[str, float]]:
        """One rollout: (trajectories, reward outputs, extra) of ``group_size`` (default G) samples of each
        task in ``seeds`` (default: tasks_per_step new training tasks)."""
        cfg = self.cfg
        seeds = self._draw_tasks(cfg.tasks_per_step) if seeds is None else seeds
        t0 = time.time()
        with self.progress.phase("rollout", step, cfg.steps):
            trajs, extra = self._rollout(step, seeds, sampling, group_size)
        maybe_crash("rollout", step)
        timing["timing/rollout"] = timing.get("timing/rollout", 0.0) + time.time() - t0
        t1 = time.time()
        failures = getattr(self.reward_fn, "failures", None)  # a GuardedReward's (rlkit.reward_guard)
        failed_before = failures.count if failures is not None else 0
        rewards_out = [self.reward_fn(t.episode) for t in trajs]
        timing["timing/reward"] = timing.get("timing/reward", 0.0) + time.time() - t1
        if self.task_filter is not None:  # each group's outcome: all-success, all-fail (equal rewards) or signal
            g = group_size or cfg.group_size
            for k, seed in enumerate(seeds):
                group = range(k * g, (k + 1) * g)
                equal = len({rewards_out[i].total for i in group}) == 1
                wins = [trajs[i].episode.success for i in group]
                self.task_filter.record(seed, solved=equal and all(wins), failed=equal and not any(wins))
        if failures is not None:  # reward calls counted as 0 under reward.on_error=zero (each logged as a warning)
            timing["reward/failures"] = timing.get("reward/failures", 0.0) + failures.count - failed_before
        return trajs, rewards_out, extra

    def train_step(self, step: int) -> dict[str, float]:
        """One GRPO step: ``_sample_batch`` (rollouts, rewards, advantages, demonstrations), then the update."""
        t0 = time.time()
        batch = self._sample_batch(step)
        t2 = time.time()
        with self.progress.phase("update", step, self.cfg.steps):
            update = self._update(step, batch.trajectories, batch.advantages, batch.demonstrations)
        return {**batch.metrics, **update, "timing/train": time.time() - t2, "timing/step": time.time() - t0}

    def _sample_batch(self, step: int) -> SampledBatch:
        """The sampling half of step ``step``: rollouts (dynamic sampling or screening rounds), rewards,
        group advantages and, with ``algorithm.demo_coef``, the all-fail tasks' demonstrations.

        It reads no policy weights itself: the rollout hook samples with the version it is given
        (``_rollout``), so backend=native_ray can run this for step s + 1 while step s's update runs.
        Returns: SampledBatch with the step's reward/*, env/*, dynamic/*, timing/* (sampling) metrics.
        """
        cfg, timing = self.cfg, {}
        t0 = time.time()
        skipped_before = self.task_filter.skipped if self.task_filter is not None else 0
        # a fresh sampling seed per step: reproducible, and a resumed run samples what it would have
        sampling = replace(self.sampling, seed=cfg.seed * 1_000_003 + step)
        sampled_group = cfg.group_size  # the group size of `sampled`, what the reward/* and env/* metrics describe
        if self.algo.screening_samples > 0:
            trajs, rewards, sampled, rewards_out, rollout_extra, dynamic = self._screened_sampling(step, sampling, timing)
            sampled_group = self.algo.screening_samples
            sampled_rewards = torch.tensor([r.total for r in rewards_out], dtype=torch.float32)
        else:
            adaptive = self.algo.dynamic_sampling_adaptive_batch  # round 1 sized from the last step's share
            seeds = self._draw_tasks(self._round_size(cfg.tasks_per_step, 0)) if adaptive else None
            trajs, rewards_out, rollout_extra = self._sample_round(step, sampling, timing, seeds)
            rewards = torch.tensor([r.total for r in rewards_out], dtype=torch.float32)  # [B*G]
            sampled, sampled_rewards, dynamic = trajs, rewards, {}
            if self.algo.dynamic_sampling_max_rounds > 0:
                trajs, rewards, sampled, rewards_out, dynamic = self._dynamic_sampling(step, sampling, trajs, rewards_out, timing)
                sampled_rewards = torch.tensor([r.total for r in rewards_out], dtype=torch.float32)
        if cfg.get("control") == "shuffled_reward":  # the control: advantages that say nothing (rlkit/controls.py)
            from rlkit.controls import shuffle_rewards

            rewards = shuffle_rewards(rewards, torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        advantages = (group_advantages(rewards, cfg.group_size, self.algo.norm_adv_by_std, self.algo.adv_eps)  # [B*G]
                      if len(rewards) else torch.zeros(0))  # screening that kept no task
        if self.algo.mask_unexecuted:  # the tokens the env never acted on leave the loss (rlkit/config.py)
            timing["policy/unexecuted_tokens"] = float(mask_unexecuted(trajs)) / max(len(trajs), 1)
        demos = self._demonstrations(sampled, timing, sampled_group) if self.algo.demo_coef > 0 else None
        metrics = {
            "reward/mean": float(sampled_rewards.mean()),
            "reward/std": float(sampled_rewards.std()) if len(sampled_rewards) > 1 else 0.0,
            "reward/success_rate": sum(t.episode.success for t in sampled) / len(sampled),
            "reward/zero_variance_groups": float(zero_variance_groups(sampled_rewards, sampled_group).float().mean()),
            **_component_means(rewards_out),
            **rollout_stats(sampled),
            **timing,
            **rollout_extra,
            **dynamic,
            "timing/sampling": time.time() - t0,
        }
        if self.task_filter is not None:  # tasks drawn and skipped before rollout this step
            metrics["dynamic/skipped_tasks"] = float(self.task_filter.skipped - skipped_before)
        return SampledBatch(step, trajs, advantages, demos, metrics)

    def _demonstrations(self, sampled: list[Any], timing: dict[str, float], group_size: int) -> list[Any]:
        """The solver's demonstrations of this step's hardest tasks (rlkit.update.demonstration_tasks over
        every sampled group of ``group_size``, at most algorithm.demo_max_tasks), for the demo_coef term;
        demo/tasks and timing/demo into ``timing``. A task whose demonstration does not solve it within
        the env's budget is left out."""
        from rlkit.update import demonstration_tasks

        t0 = time.time()
        seeds = demonstration_tasks(sampled, group_size, self.algo.demo_max_successes)[: self.algo.demo_max_tasks]
        demos = self._demonstration_trajectories(seeds) if seeds else []
        timing["demo/tasks"] = float(len(demos))
        timing["timing/demo"] = time.time() - t0
        return demos

    def _demonstration_trajectories(self, seeds: list[int]) -> list[Any]:
        """Hook: rlkit.sft.demonstration_trajectory for each seed, in order, the unsolved ones left out
        (built in this process; backend=native_ray builds them on its rollout workers)."""
        from rlkit.sft import demonstration_trajectories

        return demonstration_trajectories(self.env_spec, self.policy, seeds)

    def _dynamic_sampling(self, step: int, sampling: Any, trajs: list[Any], rewards_out: list[Any],
                          timing: dict[str, float]) -> tuple[list[Any], torch.Tensor, list[Any], list[Any], dict[str, float]]:
        """DAPO dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): keep the groups whose rewards
        differ; while fewer than tasks_per_step are kept, roll out new tasks (at most
        ``dynamic_sampling_max_rounds`` more rounds, and at most (max_rounds + 1) x tasks_per_step tasks
        in all). A round draws tasks_per_step tasks, or with ``dynamic_sampling_adaptive_batch``
        ``_round_size`` of them (DAPO's generation batch larger than its training batch, sized from the
        share of informative groups the previous step found; never fewer than tasks_per_step).

        Returns: (kept trajectories: at most tasks_per_step groups in sampling order, the first
        tasks_per_step groups of round 1 when no group differs; their rewards [N']; every sampled trajectory and its reward output,
        for the reward/* and env/* metrics, which describe the policy and not the filter;
        dynamic/{rounds, informative_groups, sampled_groups} metrics)."""
        cfg, g = self.cfg, self.cfg.group_size
        adaptive = self.algo.dynamic_sampling_adaptive_batch
        budget = (self.algo.dynamic_sampling_max_rounds + 1) * cfg.tasks_per_step
        all_trajs, all_out = list(trajs), list(rewards_out)
        rounds = 1

        def informative(ts_out: list[Any]) -> list[int]:
            r = torch.tensor([o.total for o in ts_out], dtype=torch.float32)
            return [i for i, z in enumerate(zero_variance_groups(r, g).tolist()) if not z]

        while ((missing := cfg.tasks_per_step - len(informative(all_out))) > 0
               and rounds <= self.algo.dynamic_sampling_max_rounds and len(all_trajs) // g < budget):
            seeds = self._draw_tasks(self._round_size(missing, len(all_trajs) // g)) if adaptive else None
            more, more_out, _ = self._sample_round(step, replace(sampling, seed=sampling.seed + 7919 * rounds), timing,
                                                   seeds)
            offset = len(all_trajs) // g
            for t in more:
                t.group += offset
            all_trajs += more
            all_out += more_out
            rounds += 1
        found = informative(all_out)
        keep = found[: cfg.tasks_per_step]
        metrics = {"dynamic/rounds": float(rounds), "dynamic/informative_groups": float(len(found)),
                   "dynamic/sampled_groups": float(len(all_trajs) // g)}
        self.informative_counts = (len(found), len(all_trajs) // g)
        if not keep:  # nothing to learn from: the round-1 batch, all advantages 0, so the policy-gradient
            # term is 0 (the optimizer still steps on its momentum, as for any zero-signal batch)
            keep = list(range(min(len(trajs) // g, cfg.tasks_per_step)))
        kept = [all_trajs[k * g + j] for k in keep for j in range(g)]
        rewards = torch.tensor([all_out[k * g + j].total for k in keep for j in range(g)], dtype=torch.float32)
        return kept, rewards, all_trajs, all_out, metrics

    def _draw_tasks(self, n: int) -> list[int]:
        """The next ``n`` training task seeds: the sampler's, past algorithm.selective_rollout_explore's
        filter when it is on (tasks the policy keeps solving are skipped before rollout)."""
        if self.task_filter is None:
            return self.sampler.sample(n)
        return self.task_filter.draw(self.sampler, n)

    def _round_size(self, missing: int, drawn: int) -> int:
        """Tasks the next adaptive dynamic-sampling round draws: enough to find ``missing`` informative
        groups if they are as common as in the previous step (``informative_counts`` = (informative,
        sampled) groups, (1, 1) at the start; the share floored at 1 / (max_rounds + 1)), at least
        tasks_per_step (a plain round) and at most what the step's budget of (max_rounds + 1) x
        tasks_per_step tasks leaves after ``drawn``."""
        rounds, b = self.algo.dynamic_sampling_max_rounds + 1, self.cfg.tasks_per_step
        found, sampled = self.informative_counts
        # ceil(missing / share) in integers: share = found / sampled, or 1 / rounds when that is smaller
        need = -(-missing * sampled // found) if found * rounds >= sampled else missing * rounds
        return max(1, min(rounds * b - drawn, max(b, need)))

    def _screened_sampling(self, step: int, sampling: Any, timing: dict[str, float],
                           ) -> tuple[list[Any], torch.Tensor, list[Any], list[Any], dict[str, float], dict[str, float]]:
        """SPEED's two-phase sampling (Zhang et al. 2025, "SPEED-RL: Faster Training of Reasoning Models via
        Online Curriculum Learning", section 4) inside DAPO's dynamic-sampling rounds.

        Each round draws C = ceil(tasks_per_step x G / k) new tasks (k = algorithm.screening_samples; the
        sample budget of a plain round) and samples k episodes of each: the screening. Tasks whose k rewards
        differ are informative whatever the rest of their group does; the first of them, up to the number
        still missing, get G - k more samples (the continuation, a separate sampling seed), and their
        screening samples complete the group. A task whose screening rewards agree is not continued. Rounds
        repeat while fewer than tasks_per_step groups are kept, at most dynamic_sampling_max_rounds more.

        Returns: (kept trajectories: whole groups of G, screening samples first, group ids distinct;
        their rewards [N']; every screening trajectory and its reward output (groups of k: an unfiltered
        sample of the task distribution, for the reward/*, env/* and demo_coef's all-fail tasks); the
        rollout hook's extra metrics; dynamic/* and screening/* metrics). No task kept: empty lists
        (the update then runs on the demonstrations alone, or is skipped)."""
        cfg, g, k = self.cfg, self.cfg.group_size, self.algo.screening_samples
        n_screen = -(-cfg.tasks_per_step * g // k)
        screened, screened_out, kept, kept_out, extra = [], [], [], [], {}
        rounds = 0
        while len(kept) // g < cfg.tasks_per_step and rounds <= self.algo.dynamic_sampling_max_rounds:
            screen_sampling = replace(sampling, seed=sampling.seed + 7919 * rounds)
            trajs, outs, round_extra = self._sample_round(step, screen_sampling, timing, self._draw_tasks(n_screen), k)
            extra = extra or round_extra  # the first round's (backend=native_ray: its adapter load)
            offset = len(screened) // k
            for t in trajs:
                t.group += offset
            screened += trajs
            screened_out += outs
            rewards = torch.tensor([o.total for o in outs], dtype=torch.float32)
            mixed = [i for i, z in enumerate(zero_variance_groups(rewards, k).tolist()) if not z]
            mixed = mixed[: cfg.tasks_per_step - len(kept) // g]
            rounds += 1
            if not mixed:
                continue
            more, more_out, _ = self._sample_round(
                step, replace(sampling, seed=sampling.seed + 7919 * rounds + 104_729), timing,
                [trajs[i * k].episode.seed for i in mixed], g - k)
            for j, i in enumerate(mixed):
                rest = more[j * (g - k) : (j + 1) * (g - k)]
                for t in rest:
                    t.group = trajs[i * k].group
                kept += trajs[i * k : (i + 1) * k] + rest
                kept_out += outs[i * k : (i + 1) * k] + more_out[j * (g - k) : (j + 1) * (g - k)]
        n_tasks = len(screened) // k
        solved = sum(all(t.episode.success for t in screened[i * k : (i + 1) * k]) for i in range(n_tasks))
        metrics = {"dynamic/rounds": float(rounds), "dynamic/informative_groups": float(len(kept) // g),
                   "dynamic/sampled_groups": float(n_tasks), "screening/tasks": float(n_tasks),
                   "screening/solved": solved / n_tasks, "screening/continued": len(kept) // g / n_tasks}
        rewards = torch.tensor([o.total for o in kept_out], dtype=torch.float32)
        return kept, rewards, screened, screened_out, extra, metrics

    def execute(self) -> dict:
        cfg = self.cfg
        t_setup = time.time()
        self.setup()
        self._setup_s = time.time() - t_setup
        pool = "" if self.sampler.pool is None else f" (from a fixed pool of {len(self.sampler.pool)} training tasks)"
        self.progress.say(f"setup {time.time() - t_setup:.0f}s; {cfg.steps} GRPO steps of {cfg.tasks_per_step} tasks "
                          f"x {cfg.group_size} samples{pool}; eval on {len(self.eval_seeds)} tasks of "
                          f"{self.env_spec.eval_set_name}")
        status = "completed"
        try:
            if self.state.step == 0 and self.trainer.eval_before_train:
                m = self._eval(0, "step_000000")
                self.state.eval_success_before = m["eval/success_rate"]
                self._log(m, 0)
                self.progress.say(f"eval before training: {m['eval/success_rate']:.1%} of {len(self.eval_seeds)}")
            seg_start = time.time()
            base_wall = self.state.wall_time_s
            for step in range(self.state.step + 1, cfg.steps + 1):
                metrics = self.train_step(step)
                self.state.step = step
                self.state.wall_time_s = base_wall + (time.time() - seg_start)
                if self.trainer.eval_interval and step % self.trainer.eval_interval == 0 and step != cfg.steps:
                    metrics.update(self._eval(step, f"step_{step:06d}"))
                metrics["trainer/step"] = step
                metrics["trainer/wall_time_s"] = self.state.wall_time_s
                self._log(metrics, step)
                self.progress.step(step, cfg.steps, metrics)
                maybe_crash("logged", step)
                if self.trainer.ckpt_interval and step % self.trainer.ckpt_interval == 0 and step != cfg.steps:
                    self._save(step)
                if self.trainer.export_interval and step % self.trainer.export_interval == 0 and step != cfg.steps:
                    self._export(self.out / "exports" / f"step_{step:06d}", step)
            # the final checkpoint precedes the final eval, so a run killed during that eval (or rerun
            # after it) evaluates once more and logs exactly what an uninterrupted run logs
            self._save(self.state.step)
            final = self._eval(self.state.step, "final")
            self._log(final, self.state.step)
            adapter_dir = self.out / "adapter"
            self._export(adapter_dir, self.state.step)
        finally:
            self.logger.finish() if hasattr(self, "logger") else None
        result = {
            "status": status,
            "eval_set": self.env_spec.eval_set_name,
            "eval_num_tasks": len(self.eval_seeds),
            "eval_success_before": self.state.eval_success_before,
            "eval_success_after": final["eval/success_rate"],
            **({"eval_seen_success_after": final["eval_seen/success_rate"], "eval_seen_num_tasks": len(self.seen_seeds)}
               if self.seen_seeds else {}),
            "steps_completed": self.state.step,
            "wall_time_s": round(self.state.wall_time_s, 2),
            "adapter_dir": str(adapter_dir),
            "output_dir": str(self.out),
            "policy_turns": self.env_spec.max_turns,
            "action_budget": getattr(self.env_spec, "action_budget", self.env_spec.max_turns),
            "setup_time_s": round(self._setup_s, 2),
            "warm_start_dir": getattr(self, "base_path", None),
            "overrides": _run_name(),
            "wandb_run_id": self.state.run_id,
            "host": platform.node(),
        }
        (self.out / "result.json").write_text(json.dumps(result, indent=2))
        before = "-" if result["eval_success_before"] is None else f"{result['eval_success_before']:.1%}"
        self.progress.say(f"eval success on {result['eval_set']} ({result['eval_num_tasks']} tasks): "
                          f"{before} -> {result['eval_success_after']:.1%} after {result['steps_completed']} steps; "
                          + (f"on {len(self.seen_seeds)} trained-on tasks {result['eval_seen_success_after']:.1%}; "
                             if self.seen_seeds else "") +
                          f"adapter: {adapter_dir}")
        return result

    def _export(self, path: Path, step: int) -> None:
        """Write the adapter in plain PEFT format (what vLLM's --lora-modules and PeftModel load) and
        log it as an artifact (every ``trainer.export_interval`` steps, and at the end as ``adapter/``)."""
        self.policy.save_adapter(path, version=step)
        self.logger.log_artifact(path, name=f"adapter-{self.state.run_id or 'run'}", kind="lora_adapter")

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.metrics_file.write(metrics, step)
        self.logger.log(metrics, step)


def _component_means(outs: list[Any]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for o in outs:
        for k, v in o.components.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return {f"reward/{k}": v / max(len(outs), 1) for k, v in sums.items()}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _run_name() -> str:
    try:
        overrides = HydraConfig.get().overrides.task
    except ValueError:
        return "run"
    return ",".join(overrides) or "default"


def _sweep_group() -> str | None:
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    if str(hc.mode) == "RunMode.MULTIRUN":
        return "sweep-" + Path(hc.sweep.dir).name
    return None


def _listify(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, list)):
        return [_listify(v) for v in x]
    return x


def _tuplify(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    return x


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")


def _adapter_base_model(checkpoint: Path) -> str | None:
    """The base checkpoint the adapter of the GRPO checkpoint folder ``checkpoint`` was trained on
    (``adapter/rlkit_adapter.json``'s base_model, rlkit.sync), or None when it records none or cannot be read."""
    try:
        return json.loads((checkpoint / "adapter" / "rlkit_adapter.json").read_text()).get("base_model") or None
    except (OSError, ValueError):
        return None


class _file_lock:
    """Exclusive advisory lock (fcntl.flock) so concurrent jobs build a shared cache entry once."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self) -> "_file_lock":
        import fcntl

        self.fh = open(self.path, "w")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        import fcntl

        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def config_changes(old: DictConfig, new: DictConfig, added_later: dict[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """Leaves that differ between two configs (unresolved), as {dotted key: (old, new)}; a key present
    in one only compares with None, except a key of ``added_later`` missing from ``old``, which compares
    as its value there (``KEYS_ADDED_LATER``). Lists are compared as values."""

    def flat(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                flat(v, f"{prefix}.{k}" if prefix else str(k), out)
        else:
            out[prefix] = node
        return out

    a = flat(OmegaConf.to_container(old, resolve=False), "", {})
    b = flat(OmegaConf.to_container(new, resolve=False), "", {})
    for key, value in (added_later or {}).items():
        if key not in a and key in b:
            a[key] = value
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _resumable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)
