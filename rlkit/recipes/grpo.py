"""The GRPO recipe: setup -> train -> cleanup, in the shape of torchtune's recipes.

One GRPO step (docs/architecture.md) reads as the algorithm (``train_step``): sample B tasks and G rollouts of
each and score them (rlkit.sampling), compute group advantages (``_advantages``), update the policy with the
clipped policy-gradient loss plus the configured auxiliary terms (rlkit.update / rlkit.distributed.update; a
pipelined executor samples the next step meanwhile, rlkit.recipes.pipeline), publish the adapter (the executor),
evaluate every ``trainer.eval_interval`` steps, checkpoint every ``trainer.ckpt_interval`` steps, log.

Where the work runs is the executor's business (rlkit.recipes.executor): ``LocalExecutor`` in this process,
``RayExecutor`` on Ray actors; the recipe holds one and never asks which. The one-time builds (grounding stage,
SFT warm start) are rlkit.stages.warm_start's; resume is rlkit.resume's; what is refused before any work is
rlkit.recipes.validation's (one pass, ``check_run``); healing a lost worker is rlkit.recipes.heal's.
"""

from __future__ import annotations

import json
import platform
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlkit import checkpoint as ckpt
from rlkit import resume
from rlkit.algorithms.grpo import group_advantages
from rlkit.algorithms.nll import AuxTerm
from rlkit.algorithms.schedules import make_scheduler
from rlkit.config import (
    AlgorithmConfig,
    AuxLossConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
)
from rlkit.console import Progress
from rlkit.controls import FixedImageEnvSpec, fixed_image_seed, shuffle_rewards
from rlkit.evaluation import write_outcomes
from rlkit.faults import maybe_crash
from rlkit.hardware import cpu_record
from rlkit.loggers import MetricsFile
from rlkit.plugins import resolve_policy_dtype, to_dataclass
from rlkit.policy import SamplingParams
from rlkit.recipes.common import run_name, seed_everything, sweep_group
from rlkit.recipes.executor import Executor, ExecutorContext
from rlkit.recipes.heal import SentOnce, healed, start_worker_group
from rlkit.recipes.pipeline import StepPipeline
from rlkit.recipes.threads import build_threads
from rlkit.recipes.validation import check_config, check_run
from rlkit.report.episodes import SAMPLE_COLUMNS, sample_rows
from rlkit.run_folder import accept_run_config
from rlkit.sampling import StepSampler, sampling_strategy
from rlkit.stages import warm_start as ws
from rlkit.tasks import training_sampler
from rlkit.types import SupportsActionBudget


class GRPORecipe:
    """One GRPO job: ``GRPORecipe(cfg, executor).run()`` -> the result dict (also ``result.json``)."""

    RESTART_POLL_S = 10.0  # seconds between tries of a restart whose placement group timed out (heal.start_worker_group)

    def __init__(self, cfg: DictConfig, executor: Executor):
        resolve_policy_dtype(cfg)  # policy.dtype=auto -> this machine's (run() did it already; idempotent)
        self.cfg, self.executor = cfg, executor
        self.algo: AlgorithmConfig = to_dataclass(cfg.algorithm, AlgorithmConfig)
        self.optim: OptimConfig = to_dataclass(cfg.optim, OptimConfig)
        self.rollout_cfg: RolloutConfig = to_dataclass(cfg.rollout, RolloutConfig)
        self.trainer: TrainerConfig = to_dataclass(cfg.trainer, TrainerConfig)
        self.eval_cfg: EvalConfig = to_dataclass(cfg.eval, EvalConfig)
        self.aux: AuxLossConfig = to_dataclass(cfg.aux_loss, AuxLossConfig)
        self.out = Path(cfg.paths.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.metrics_file = MetricsFile(self.out / "metrics.jsonl")
        self.progress = Progress(quiet=self.trainer.quiet)
        self.state = resume.RunState()
        self.pipeline = StepPipeline(executor, cfg.steps, self.trainer.ckpt_interval, self.progress)
        self.rows = SentOnce(self.metrics_file)  # each row sent to the logger once, a healed run's replay included
        self._step = 0  # the step in progress

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Check everything in one pass (one ConfigError naming every problem: rlkit.recipes.validation.check_run),
        then build, each ``_setup_*`` step one component: the warm start, the executor, the LR schedule, the
        sampling settings, the step sampler; resume or start fresh; start the logger."""
        cfg, tr = self.cfg, self.trainer
        threads = self._setup_runtime()
        checked = check_run(cfg, self.executor.problems(cfg))
        self.env_spec, self.reward_fn, self.logger = checked.env_spec, checked.reward_fn, checked.logger
        self.eval_seeds, self.seen_seeds, self.stop = checked.eval_seeds, checked.seen_seeds, checked.stop
        resume_from = resume.resume_path(tr.resume_mode, self.ckpt_root, tr.resume_path, tr.overwrite)
        if resume_from is not None:  # refuse a changed experiment before minutes of warm start, not after
            resume.check_same_experiment(resume_from, cfg, self.out, self.ckpt_root)
        self.base_path = ws.starting_checkpoint(checked.job, resume_from, build_threads(tr.build_threads), threads,
                                                check_config, self.progress)
        self.fixed_image_seed = self._setup_control()
        self._executor_ctx = self._setup_executor(self.base_path, self.fixed_image_seed)
        self.scheduler = self._setup_lr_scheduler()
        ws.check_answer_fits(checked.job, self.executor.tokenizer)  # the policy's tokenizer, or its folder
        self.sampling, self.greedy = self._setup_sampling_params()
        self.sampler = self._setup_sampler()
        self.tasks = self.sampler.tasks  # the training task sampler (its position is part of the checkpoint)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed)  # the update's mini-batch shuffles
        self._resume(resume_from)
        self.executor.after_setup(self.state.step)
        self.state.run_id = self._setup_logger()

    def _setup_runtime(self) -> int:
        """Quiet transformers, torch's threads (``trainer.num_threads``, 1 unless told otherwise: the tiny policy's
        matmuls are small, and on a shared 2-core machine a 2-thread OpenMP pool waiting for a busy core ran up to
        10x slower, bench/bench_policy.py), determinism, every RNG seeded. Returns the thread count."""
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        threads = self.trainer.num_threads or 1
        torch.set_num_threads(threads)
        if self.trainer.deterministic:
            torch.use_deterministic_algorithms(True)
        seed_everything(self.cfg.seed)
        return threads

    def _setup_control(self) -> int | None:
        """control=fixed_image: the training task whose first picture every env shows (chosen after the warm start,
        so the control starts from the same policy); ``env_spec`` wrapped for the executor (Ray's workers wrap their
        own envs). Returns that task's seed, None for a real run."""
        if self.cfg.get("control") != "fixed_image":
            return None
        seed = fixed_image_seed(self.cfg.seed, self.env_spec)
        self.env_spec = FixedImageEnvSpec(self.env_spec, seed)
        self.progress.say(f"control=fixed_image: every image shown is task {seed}'s first observation")
        return seed

    def _setup_executor(self, base_path: str | None, fixed_image_seed: int | None = None) -> ExecutorContext:
        """Start the executor (policy with LoRA on ``base_path``, None: the policy config's own weights; engine;
        optimizer) on ``env_spec``; returns the context it started from (a healed run starts a new group on it)."""
        cfg, r = self.cfg, self.rollout_cfg
        ctx = ExecutorContext(
            policy_cfg=OmegaConf.to_container(cfg.policy, resolve=True), base_path=base_path,
            env_spec=self.env_spec, env_cfg=OmegaConf.to_container(cfg.env, resolve=True), algo=self.algo,
            optim=self.optim, lr=float(cfg.lr), temperature=r.temperature if r.temperature > 0 else 1.0,
            reuse_kv_cache=r.reuse_kv_cache, fixed_image_seed=fixed_image_seed,
            deterministic=self.trainer.deterministic, progress=self.progress, rollout_engine=r.engine)
        self.executor.start(ctx)
        return ctx

    def _setup_lr_scheduler(self) -> Any:
        """The LR schedule (rlkit.algorithms.schedules) on the executor's optimizer: one step per GRPO step."""
        return make_scheduler(self.executor.optimizer, self.optim, self.cfg.steps)

    def _setup_sampling_params(self) -> tuple[SamplingParams, SamplingParams]:
        """(training, evaluation) SamplingParams: rollout.* with the run's stop strings (``self.stop``); evaluation
        at rollout.eval_temperature, top-p and top-k off. Each training step reseeds its copy (StepSampler)."""
        r, seed = self.rollout_cfg, self.cfg.seed
        return (SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                               n=1, seed=seed, stop=self.stop),
                SamplingParams(temperature=r.eval_temperature, top_p=1.0, top_k=0, max_new_tokens=r.max_new_tokens, n=1,
                               seed=seed, stop=self.stop))

    def _setup_sampler(self) -> StepSampler:
        """The step sampler: the run's training tasks (rlkit.tasks; a fixed pool with train_tasks=N), the configured
        strategy (sampling=plain | dapo) and demonstration term (``self.aux``), the executor's rollouts."""
        cfg = self.cfg
        return StepSampler(
            rollout=self.executor.rollout, reward_fn=self.reward_fn,
            tasks=training_sampler(self.env_spec, cfg.seed, pool_size=cfg.get("train_tasks")),
            demonstrations=self.executor.demonstrations, sampling=sampling_strategy(cfg.sampling), aux=self.aux,
            group_size=cfg.group_size, tasks_per_step=cfg.tasks_per_step, seed=cfg.seed, steps=cfg.steps,
            base_sampling=self.sampling, progress=self.progress)

    def _setup_logger(self) -> str | None:
        """Start the logger (resuming its run at ``state.step``, its rows matched to metrics.jsonl); its run id."""
        run_id = self.logger.start(self.out, OmegaConf.to_container(self.cfg, resolve=True), run_name=run_name(),
                                   group=sweep_group(), resume_id=self.state.run_id, resume_step=self.state.step)
        if self.state.step > 0 and hasattr(self.logger, "resume_history"):
            # a crash loses the sink's last rows and the resumed run re-does the steps after the checkpoint:
            # let it match metrics.jsonl (already cut back to the checkpoint) first
            self.logger.resume_history(self.metrics_file.read(), self.state.step)
        return run_id

    def _resume(self, path: Path | None) -> None:
        """Load the checkpoint at ``path``, or start fresh. The run is accepted here (rlkit.run_folder.accept_run_config):
        its settings checked, its builds done, and nothing of it written into the folder yet."""
        accept_run_config(self.out)
        if path is None:
            self.progress.say("starting fresh (no checkpoint to resume from)")
            if self.trainer.overwrite:
                resume.clear_earlier_run(self.out, self.ckpt_root, self.progress.say)
            self.metrics_file.truncate_lines(0)  # metrics of an earlier attempt are not this run's
            return
        changes = resume.check_same_experiment(path, self.cfg, self.out, self.ckpt_root)
        self._load(path)
        self.rows.sent = self.rows.written
        self.progress.say(f"resuming from {path} at step {self.state.step}")
        if self.state.step >= self.cfg.steps:  # the same command run again after the run finished
            self.progress.say(f"the run already trained its {self.cfg.steps} steps: nothing left to train, only the "
                              f"final evaluation is run again (steps=N with N > {self.state.step} trains on from here; "
                              "another hydra.run.dir starts a new run)")
        resume.apply_resume_changes(changes, self.cfg.lr, self.executor.optimizer, self.scheduler, self.out, path,
                                    self.state.step, self.progress.say)

    # ------------------------------------------------------------------ train
    def train_step(self, step: int) -> dict[str, float]:
        """One GRPO step, the algorithm top to bottom: sample B tasks x G rollouts and score them (rlkit.sampling;
        a pipelined executor sampled them during the last update, rlkit.recipes.pipeline), group advantages, the
        update (policy gradient plus the auxiliary terms) and the LR schedule. Returns the step's metrics."""
        t0 = time.time()
        batch = self.pipeline.take(step) or self.sampler.sample(step)  # rollouts and their rewards [N]
        advantages = self._advantages(step, batch.rewards)  # [N]
        terms = [AuxTerm("demo", self.aux.demo_coef, batch.demonstrations or [])]
        update = self.pipeline.update(step, batch, lambda: self._start_update(step, batch.trajectories, advantages,
                                                                               terms), self.sampler.sample)
        metrics = {**batch.metrics, **update, "timing/step": time.time() - t0}
        if "timing/load" in metrics or "timing/publish" in metrics:  # the adapter's way to the engines this step
            metrics["timing/sync"] = metrics.get("timing/load", 0.0) + metrics.get("timing/publish", 0.0)
        return metrics

    def _advantages(self, step: int, rewards: torch.Tensor) -> torch.Tensor:
        """Group-relative advantages [N] of the kept groups' rewards [N] (rlkit.algorithms.grpo.group_advantages:
        each against its group's mean, and std with algorithm.norm_adv_by_std); under control=shuffled_reward,
        of the rewards permuted across the batch (rlkit.controls: advantages that say nothing)."""
        if self.cfg.get("control") == "shuffled_reward":
            rewards = shuffle_rewards(rewards, torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step))
        if not len(rewards):
            return torch.zeros(0)
        return group_advantages(rewards, self.cfg.group_size, self.algo.norm_adv_by_std, self.algo.adv_eps)

    def _start_update(self, step: int, trajectories: list[Any], advantages: torch.Tensor, terms: list[AuxTerm]) -> Any:
        """Start step ``step``'s update on the executor, then advance the LR schedule (one step per GRPO step)."""
        pending = self.executor.start_update(step, trajectories, advantages, terms, self.shuffle_gen)
        with warnings.catch_warnings():
            # a skipped update (no group with signal) still advances the schedule; torch warns when that happens
            # before the first optimizer step (and the Ray executor's shadow optimizer never steps)
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
            self.scheduler.step()
        return pending

    def _eval(self, step: int, tag: str) -> dict[str, float]:
        """Greedy success on the fixed evaluation set (and on ``eval.seen_tasks`` trained-on tasks) after ``step``
        updates; eval/*.json per task; the first 8 tasks' episodes as a table."""
        t0 = time.time()
        with self.progress.phase("eval", step=step, total=self.cfg.steps, detail=f"{len(self.eval_seeds)} tasks"):
            metrics, per_task, trajs = self.executor.evaluate(
                self.eval_seeds, self.greedy, version=step, pass_k=self.eval_cfg.pass_k,
                pass_k_sampling=replace(self.sampling, seed=self.cfg.seed + step))
            if self.seen_seeds:
                seen, seen_tasks = self.executor.evaluate(self.seen_seeds, self.greedy, version=step,
                                                          keep_trajectories=0)[:2]
                seen = {f"eval_seen/{k.split('/', 1)[1]}": v for k, v in seen.items()
                        if k in ("eval/success_rate", "eval/num_tasks", "eval/distinct_outputs")}
                write_outcomes(self.out / "eval" / f"seen_{tag}.json", "trained-on", step, seen, seen_tasks)
                metrics.update(seen)
        metrics["timing/eval"] = time.time() - t0
        write_outcomes(self.out / "eval" / f"{tag}.json", self.env_spec.eval_set_name, step, metrics, per_task)
        self.logger.log_table("eval/samples", SAMPLE_COLUMNS, sample_rows(self.env_spec, self.reward_fn, trajs[:8]), step)
        return metrics

    def _save(self, step: int) -> None:
        with self.executor.checkpoint_state():
            resume.save_checkpoint(
                self.ckpt_root, step, policy=self.executor.policy, optimizer=self.executor.optimizer,
                scheduler=self.scheduler, shuffle_gen=self.shuffle_gen, sampler=self.tasks, state=self.state,
                strategy_state=self.sampler.state_dict(), metrics_lines=self.metrics_file.num_lines(),
                config_yaml=OmegaConf.to_yaml(self.cfg, resolve=False), max_to_keep=self.trainer.max_ckpts_to_keep,
                before_rng=lambda: maybe_crash("checkpoint", step))

    def _export(self, path: Path, step: int) -> None:
        """The adapter in plain PEFT format (what vLLM's --lora-modules and PeftModel load), logged as an artifact."""
        self.executor.policy.save_adapter(path, version=step)
        self.logger.log_artifact(path, name=f"adapter-{self.state.run_id or 'run'}", kind="lora_adapter")

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """A row to metrics.jsonl and, unless a healed run is replaying rows it already sent, to the logger."""
        self.rows.log(self.logger, metrics, step)

    def train(self) -> dict[str, float]:
        """The evaluation before training, the loop from the resumed step to ``steps`` and the final evaluation,
        healed when a worker is lost in any of them or in a restart (rlkit.recipes.heal.healed): a new worker group
        goes on from the latest checkpoint (a step-0 one is saved first), at most ``trainer.max_failures`` times.
        Raises: WorkerLostError past that, or when a new group's resources do not appear within
        ``trainer.restart_wait_s``; WorkerError at once for any other error raised in a worker (never replayed)."""
        if self.executor.heals and self.trainer.max_failures and ckpt.find_latest(self.ckpt_root) is None:
            self._save(self.state.step)  # a worker lost before the first checkpoint (step-0 eval included) heals here
        return healed(self._train, self._heal, self.executor, self.ckpt_root, self.trainer.max_failures,
                      self.trainer.restart_wait_s, lambda: self._step, self.progress.say)

    def _train(self) -> dict[str, float]:
        """The evaluation before training (once, at step 0), then ``_train_loop``."""
        if self.state.step == 0 and self.trainer.eval_before_train and self.state.eval_success_before is None:
            m = self._eval(0, "step_000000")
            self.state.eval_success_before = m["eval/success_rate"]
            self._log(m, 0)
            self.progress.say(f"eval before training: {m['eval/success_rate']:.1%} of {len(self.eval_seeds)}")
        return self._train_loop()

    def _heal(self, path: Path) -> None:
        """A new worker group, loaded with the checkpoint at ``path`` exactly as a resumed run loads it."""
        self.executor.shutdown()
        self.pipeline.drop()
        start_worker_group(self.executor, self._executor_ctx, self.trainer.restart_wait_s, self.progress.say,
                           self.RESTART_POLL_S)
        self.scheduler = self._setup_lr_scheduler()
        self._load(path)  # the rows after the checkpoint are logged again, and sent to the logger once
        self.executor.after_setup(self.state.step)

    def _load(self, path: Path) -> None:
        """The checkpoint at ``path`` into the executor, the schedule, the RNGs and the samplers; metrics.jsonl cut
        back to the rows it had logged (the lost part of the run, by line count)."""
        self.state, meta = resume.load_checkpoint(path, policy=self.executor.policy, optimizer=self.executor.optimizer,
                                                  scheduler=self.scheduler, shuffle_gen=self.shuffle_gen,
                                                  sampler=self.tasks)
        self.sampler.load_state_dict(meta)
        self.rows.rewind(meta.get("metrics_lines", 0))

    def _train_loop(self) -> dict[str, float]:
        """The steps from ``state.step`` + 1 to ``steps``; the final checkpoint, evaluation and export."""
        cfg, tr = self.cfg, self.trainer
        seg_start, base_wall = time.time(), self.state.wall_time_s
        for step in range(self.state.step + 1, cfg.steps + 1):
            self._step = step
            metrics = self.train_step(step)
            self.state.step = step
            self.state.wall_time_s = base_wall + (time.time() - seg_start)
            if tr.eval_interval and step % tr.eval_interval == 0 and step != cfg.steps:
                metrics.update(self._eval(step, f"step_{step:06d}"))
            metrics["trainer/step"] = step
            metrics["trainer/wall_time_s"] = self.state.wall_time_s
            self._log(metrics, step)
            self.progress.step(step, cfg.steps, metrics)
            maybe_crash("logged", step)
            if tr.ckpt_interval and step % tr.ckpt_interval == 0 and step != cfg.steps:
                self._save(step)
            if tr.export_interval and step % tr.export_interval == 0 and step != cfg.steps:
                self._export(self.out / "exports" / f"step_{step:06d}", step)
        # the final checkpoint precedes the final eval, so a run killed during that eval (or rerun after it)
        # evaluates once more and logs exactly what an uninterrupted run logs
        self._step = self.state.step
        self._save(self.state.step)
        final = self._eval(self.state.step, "final")
        self._log(final, self.state.step)
        self._export(self.out / "adapter", self.state.step)
        return final

    # ---------------------------------------------------------------- cleanup
    def run(self) -> dict:
        """setup, train, cleanup; returns the result dict."""
        t_setup = time.time()
        try:
            self.setup()
            setup_s = time.time() - t_setup
            pool = "" if self.tasks.pool is None else f" (from a fixed pool of {len(self.tasks.pool)} training tasks)"
            self.progress.say(f"setup {setup_s:.0f}s; {self.cfg.steps} GRPO steps of {self.cfg.tasks_per_step} tasks "
                              f"x {self.cfg.group_size} samples{pool}; eval on {len(self.eval_seeds)} tasks of "
                              f"{self.env_spec.eval_set_name}")
            try:
                final = self.train()
            finally:
                self.logger.finish()
            return self.cleanup(final, setup_s)
        finally:
            self.executor.shutdown()

    def cleanup(self, final: dict[str, float], setup_s: float) -> dict:
        """result.json and the closing line."""
        seen = bool(self.seen_seeds)
        result = {
            "status": "completed", "eval_set": self.env_spec.eval_set_name, "eval_num_tasks": len(self.eval_seeds),
            "eval_success_before": self.state.eval_success_before, "eval_success_after": final["eval/success_rate"],
            **({"eval_seen_success_after": final["eval_seen/success_rate"], "eval_seen_num_tasks": len(self.seen_seeds)}
               if seen else {}),
            "steps_completed": self.state.step, "wall_time_s": round(self.state.wall_time_s, 2),
            "adapter_dir": str(self.out / "adapter"), "output_dir": str(self.out),
            "policy_turns": self.env_spec.max_turns,
            "action_budget": (self.env_spec.action_budget if isinstance(self.env_spec, SupportsActionBudget)
                              else self.env_spec.max_turns),
            "setup_time_s": round(setup_s, 2), "warm_start_dir": self.base_path, "overrides": run_name(),
            "wandb_run_id": self.state.run_id, "host": platform.node(),
            "policy_dtype": OmegaConf.select(self.cfg, "policy.dtype"), "machine": cpu_record(),
        }
        (self.out / "result.json").write_text(json.dumps(result, indent=2))
        before = "-" if result["eval_success_before"] is None else f"{result['eval_success_before']:.1%}"
        self.progress.say(f"eval success on {result['eval_set']} ({result['eval_num_tasks']} tasks): {before} -> "
                          f"{result['eval_success_after']:.1%} after {result['steps_completed']} steps; "
                          + (f"on {len(self.seen_seeds)} trained-on tasks {result['eval_seen_success_after']:.1%}; "
                             if seen else "") + f"adapter: {self.out / 'adapter'}")
        return result
