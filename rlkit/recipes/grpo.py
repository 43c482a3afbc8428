"""The GRPO recipe: setup -> train -> cleanup, in the shape of torchtune's recipes.

One GRPO step (docs/architecture.md) reads as the algorithm: sample B tasks and G rollouts of each, score
them, compute group advantages (rlkit.sampling), update the policy with the clipped policy-gradient loss plus
the configured auxiliary terms (rlkit.update / rlkit.distributed.update), publish the adapter (the executor),
evaluate every ``trainer.eval_interval`` steps, checkpoint every ``trainer.ckpt_interval`` steps, log.

Where the work runs is the executor's business (rlkit.recipes.executor): ``LocalExecutor`` in this process,
``RayExecutor`` on Ray actors; the recipe holds one and never asks which. The one-time builds (grounding stage,
SFT warm start) are rlkit.stages.warm_start's; resume is rlkit.resume's; what is refused before any work is
rlkit.recipes.validation's.
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
from rlkit.algorithms.nll import AuxTerm
from rlkit.algorithms.schedules import make_scheduler
from rlkit.config import (
    AlgorithmConfig,
    AuxLossConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    TrainerConfig,
    stop_strings,
)
from rlkit.console import Progress
from rlkit.controls import FixedImageEnvSpec, fixed_image_seed
from rlkit.errors import ConfigError
from rlkit.evaluation import task_sets, write_outcomes
from rlkit.faults import maybe_crash
from rlkit.hardware import cpu_record
from rlkit.loggers import MetricsFile
from rlkit.metrics_export import with_cluster_metrics
from rlkit.plugins import instantiate_plugin, instantiate_reward, resolve_policy_dtype, to_dataclass
from rlkit.policy import SamplingParams
from rlkit.recipes.common import run_name, seed_everything, sweep_group
from rlkit.recipes.executor import Executor, ExecutorContext
from rlkit.recipes.heal import WorkerLostError, lost_worker_or_raise, start_worker_group
from rlkit.recipes.threads import build_threads
from rlkit.recipes.validation import capability_problems, check_config, check_env
from rlkit.report.episodes import SAMPLE_COLUMNS, sample_rows
from rlkit.run_folder import accept_run_config
from rlkit.sampling import SampledBatch, StepSampler, sampling_strategy
from rlkit.stages import warm_start as ws
from rlkit.tasks import training_sampler


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
        self.out = Path(cfg.paths.output_dir)
        self.ckpt_root = self.out / "checkpoints"
        self.metrics_file = MetricsFile(self.out / "metrics.jsonl")
        self.progress = Progress(quiet=self.trainer.quiet)
        self.state = resume.RunState()
        self._prefetched: SampledBatch | None = None  # a pipelined executor's next batch
        self._rows = self._rows_sent = 0  # metrics rows written / sent to the logger (a healed run sends each once)
        self._step = 0  # the step in progress

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Check everything, build the warm start, start the executor, resume or start fresh, start the logger."""
        cfg = self.cfg
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        check_config(cfg)
        problems = self.executor.problems(cfg)
        if problems:
            raise ConfigError("; ".join(problems))
        # 1 thread unless told otherwise: the tiny policy's matmuls are small, and on a shared 2-core machine a
        # 2-thread OpenMP pool waiting for a busy core ran up to 10x slower (scripts/bench_policy.py)
        threads = self.trainer.num_threads or 1
        torch.set_num_threads(threads)
        if self.trainer.deterministic:
            torch.use_deterministic_algorithms(True)
        seed_everything(cfg.seed)
        self.env_spec = check_env(instantiate_plugin(cfg.env, "env"), cfg.env.get("name"))  # before any build
        self.reward_fn = instantiate_reward(cfg.reward)  # GuardedReward: time limit and on_error
        self.logger = with_cluster_metrics(instantiate_plugin(cfg.logger, "logger"))  # its keys checked before builds
        self.eval_seeds, self.seen_seeds = task_sets(self.env_spec, self.eval_cfg, cfg.seed, cfg.get("train_tasks"))
        problems = capability_problems(cfg, self.env_spec)
        job = ws.make_job(cfg, self.env_spec)
        problem = ws.grounding_problem(job)
        if problems or problem:
            raise ConfigError("; ".join(problems + ([problem] if problem else [])))
        self.stop = stop_strings(self.rollout_cfg, self.env_spec)
        r = self.rollout_cfg
        try:  # sampling settings are checked before the warm start
            SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                           stop=self.stop).validate()
        except ValueError as e:
            raise ConfigError(f"rollout.{e}") from None
        resume_from = resume.resume_path(self.trainer.resume_mode, self.ckpt_root, self.trainer.resume_path,
                                         self.trainer.overwrite)
        if resume_from is not None:  # refuse a changed experiment before minutes of warm start, not after
            resume.check_same_experiment(resume_from, cfg, self.out, self.ckpt_root)
        self.base_path = ws.starting_checkpoint(job, resume_from, build_threads(self.trainer.build_threads), threads,
                                                check_config, self.progress)
        # control=fixed_image: a training task whose first picture every env shows (after the warm start, so the
        # control starts from the same policy); the executor gets the wrapped spec, Ray's workers wrap their own envs
        self.fixed_image_seed = None
        if cfg.get("control") == "fixed_image":
            self.fixed_image_seed = fixed_image_seed(cfg.seed, self.env_spec)
            self.env_spec = FixedImageEnvSpec(self.env_spec, self.fixed_image_seed)
            self.progress.say(f"control=fixed_image: every image shown is task {self.fixed_image_seed}'s first observation")
        self._executor_ctx = ExecutorContext(
            policy_cfg=OmegaConf.to_container(cfg.policy, resolve=True), base_path=self.base_path,
            env_spec=self.env_spec, env_cfg=OmegaConf.to_container(cfg.env, resolve=True), algo=self.algo,
            optim=self.optim, lr=float(cfg.lr), temperature=r.temperature if r.temperature > 0 else 1.0,
            reuse_kv_cache=r.reuse_kv_cache, fixed_image_seed=self.fixed_image_seed,
            deterministic=self.trainer.deterministic, progress=self.progress, rollout_engine=r.engine)
        self.executor.start(self._executor_ctx)
        self.scheduler = make_scheduler(self.executor.optimizer, self.optim, cfg.steps)
        ws.check_answer_fits(job, self.executor.tokenizer)  # the policy's tokenizer, or its folder
        self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                       max_new_tokens=r.max_new_tokens, n=1, seed=cfg.seed, stop=self.stop)
        self.greedy = SamplingParams(temperature=r.eval_temperature, top_p=1.0, top_k=0, max_new_tokens=r.max_new_tokens,
                                     n=1, seed=cfg.seed, stop=self.stop)
        self.tasks = training_sampler(self.env_spec, cfg.seed, pool_size=cfg.get("train_tasks"))
        self.aux: AuxLossConfig = to_dataclass(cfg.aux_loss, AuxLossConfig)
        self.sampler = StepSampler(
            rollout=self.executor.rollout, reward_fn=self.reward_fn, tasks=self.tasks,
            demonstrations=self.executor.demonstrations, sampling=sampling_strategy(cfg.sampling),
            aux=self.aux, algo=self.algo, group_size=cfg.group_size, tasks_per_step=cfg.tasks_per_step, seed=cfg.seed,
            steps=cfg.steps, base_sampling=self.sampling, control=cfg.get("control"), progress=self.progress)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed)
        self._resume(resume_from)
        self.executor.after_setup(self.state.step)
        self.state.run_id = self.logger.start(
            self.out, OmegaConf.to_container(cfg, resolve=True), run_name=run_name(), group=sweep_group(),
            resume_id=self.state.run_id, resume_step=self.state.step)
        if self.state.step > 0 and hasattr(self.logger, "resume_history"):
            # a crash loses the sink's last rows and the resumed run re-does the steps after the checkpoint:
            # let it match metrics.jsonl (already cut back to the checkpoint) first
            self.logger.resume_history(self.metrics_file.read(), self.state.step)

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
        self._rows_sent = self._rows
        self.progress.say(f"resuming from {path} at step {self.state.step}")
        resume.apply_resume_changes(changes, self.cfg.lr, self.executor.optimizer, self.scheduler, self.out, path,
                                    self.state.step, self.progress.say)

    # ------------------------------------------------------------------ train
    def train_step(self, step: int) -> dict[str, float]:
        """One GRPO step: the batch (sampled now, or ahead during the last update), the update, the schedule."""
        t0 = time.time()
        batch, self._prefetched = self._prefetched, None
        if batch is None or batch.step != step:
            batch = self.sampler.sample(step)
        terms = [AuxTerm("demo", self.aux.demo_coef, batch.demonstrations or [])]
        if self.executor.pipelined:  # sample the next step while this update runs
            pending = self._start_update(step, batch, terms)
            prefetch_s = self._sample_ahead(step, pending)
            t2 = time.time()
            with self.progress.phase("update", step, self.cfg.steps):
                update = self.executor.finish_update(step, pending)
            # how many updates behind the sampling weights were (1 for a batch sampled ahead)
            extra = {"sync/staleness": float(step - 1 - batch.metrics.get("sync/version", step - 1)),
                     "timing/prefetch": prefetch_s}
        else:
            t2 = time.time()
            with self.progress.phase("update", step, self.cfg.steps):
                update = self.executor.finish_update(step, self._start_update(step, batch, terms))
            extra = {}
        metrics = {**batch.metrics, **update, **extra, "timing/train": time.time() - t2, "timing/step": time.time() - t0}
        if "timing/load" in metrics or "timing/publish" in metrics:  # the adapter's way to the engines this step
            metrics["timing/sync"] = metrics.get("timing/load", 0.0) + metrics.get("timing/publish", 0.0)
        return metrics

    def _start_update(self, step: int, batch: SampledBatch, terms: list[AuxTerm]) -> Any:
        """Start step ``step``'s update on the executor, then advance the LR schedule (one step per GRPO step)."""
        pending = self.executor.start_update(step, batch.trajectories, batch.advantages, terms, self.shuffle_gen)
        with warnings.catch_warnings():
            # a skipped update (no group with signal) still advances the schedule; torch warns when that happens
            # before the first optimizer step (and the Ray executor's shadow optimizer never steps)
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
            self.scheduler.step()
        return pending

    def _sample_ahead(self, step: int, pending: Any) -> float:
        """A pipelined executor: sample step ``step`` + 1 with adapter ``step`` - 1 while the update runs (not after
        the last step, nor after one that ends at a checkpoint, which then holds no half-made batch). Seconds."""
        interval = self.trainer.ckpt_interval
        if step >= self.cfg.steps or (interval and step % interval == 0):
            return 0.0
        t1 = time.time()
        try:
            with self.executor.sample_with(step - 1):
                self._prefetched = self.sampler.sample(step + 1)
        except BaseException:
            self.executor.settle(pending)  # the update in flight: its own error is logged, not lost
            raise
        return time.time() - t1

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
        self.metrics_file.write(metrics, step)
        self._rows += 1
        if self._rows > self._rows_sent:
            self.logger.log(metrics, step)
            self._rows_sent = self._rows

    def train(self) -> dict[str, float]:
        """The evaluation before training, the loop from the resumed step to ``steps`` and the final evaluation,
        healed when a worker is lost in any of them or in a restart (rlkit.recipes.heal): a new worker group goes
        on from the latest checkpoint (a step-0 one is saved first), at most ``trainer.max_failures`` times.
        Raises: WorkerLostError past that, or when a new group's resources do not appear within
        ``trainer.restart_wait_s``; WorkerError at once for any other error raised in a worker (never replayed)."""
        tr, failures, heal_from = self.trainer, 0, None
        if self.executor.heals and tr.max_failures and ckpt.find_latest(self.ckpt_root) is None:
            self._save(self.state.step)  # a worker lost before the first checkpoint (step-0 eval included) heals here
        while True:
            try:
                if heal_from is not None:
                    self._heal(heal_from)
                    heal_from = None
                if self.state.step == 0 and tr.eval_before_train and self.state.eval_success_before is None:
                    m = self._eval(0, "step_000000")
                    self.state.eval_success_before = m["eval/success_rate"]
                    self._log(m, 0)
                    self.progress.say(f"eval before training: {m['eval/success_rate']:.1%} of {len(self.eval_seeds)}")
                return self._train_loop()
            except Exception as e:
                what = lost_worker_or_raise(e, self.executor)
                failures += 1
                path = ckpt.find_latest(self.ckpt_root)
                at = resume.checkpoint_step(path) if path is not None else 0
                if failures > tr.max_failures or path is None:
                    raise WorkerLostError(f"{what} at step {self._step}; trainer.max_failures={tr.max_failures} spent. "
                                          f"Rerun the same command to resume from step {at} ({path})") from e
                self.progress.say(f"{what} at step {self._step}: restarting the workers and going on from step {at} "
                                  f"({path}; failure {failures} of trainer.max_failures={tr.max_failures}; the new "
                                  f"group waits up to trainer.restart_wait_s={tr.restart_wait_s:g}s for its resources)")
                heal_from = path

    def _heal(self, path: Path) -> None:
        """A new worker group, loaded with the checkpoint at ``path`` exactly as a resumed run loads it."""
        self.executor.shutdown()
        self._prefetched = None
        start_worker_group(self.executor, self._executor_ctx, self.trainer.restart_wait_s, self.progress.say,
                           self.RESTART_POLL_S)
        self.scheduler = make_scheduler(self.executor.optimizer, self.optim, self.cfg.steps)
        self._load(path)  # the rows after the checkpoint are logged again, and sent to the logger once
        self.executor.after_setup(self.state.step)

    def _load(self, path: Path) -> None:
        """The checkpoint at ``path`` into the executor, the schedule, the RNGs and the samplers; metrics.jsonl cut
        back to the rows it had logged (the lost part of the run, by line count)."""
        self.state, meta = resume.load_checkpoint(path, policy=self.executor.policy, optimizer=self.executor.optimizer,
                                                  scheduler=self.scheduler, shuffle_gen=self.shuffle_gen,
                                                  sampler=self.tasks)
        self.sampler.load_state_dict(meta)
        self._rows = meta.get("metrics_lines", 0)
        self.metrics_file.truncate_lines(self._rows)

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
            "action_budget": getattr(self.env_spec, "action_budget", self.env_spec.max_turns),
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
