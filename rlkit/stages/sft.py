"""Supervised warm start: the analogue of the VisGym SFT checkpoint GRPO starts from.

Solver demonstrations come from the env (``demonstration(seed)``, rlkit.types.SupportsDemonstrations: the
assistant texts of a solved episode, in the env's own output format) on training seeds only; evaluation seeds are
never used. Each demonstration is replayed through the env to get the observations, and encoded
with the policy's chat format exactly as a rollout would be; the loss is the cross-entropy on the
assistant tokens only (loss mask 1), i.e. the mean negative logprob of the demonstrated tokens.

Training stops when the greedy success on ``val_tasks`` held-out training seeds reaches
``target_success`` (checked every ``eval_every`` steps), and beats the val tasks' answer prior (the best
success one fixed answer reaches on them, rlkit.evaluation.answer_prior) by ``answer_prior_margin``, or after
``max_steps``. Each check also
records, in ``sft_summary.json``'s history, the teacher-forced fit to those seeds' demonstrations
(``demonstration_metrics``: loss, token accuracy, first-decision accuracy) and the share of
distinct greedy answers, which tell a policy that reads its observation from one that learned an
answer prior. The model is then
saved as a full HF checkpoint (save_pretrained) under a folder named by a hash of everything that
determines it, so a second run (or the second job of a sweep) reuses it.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from omegaconf import OmegaConf

from rlkit.algorithms.nll import batch_shares_prefix, demonstration_nll
from rlkit.algorithms.schedules import warmup_schedule
from rlkit.config import SFTConfig
from rlkit.demonstrations import demonstration_trajectories
from rlkit.evaluation import answer_prior, evaluate
from rlkit.rollout import Trajectory
from rlkit.stages.cache import (
    PARTIAL_EVERY,
    build_record,
    load_partial,
    partial_dir,
    restore_training_state,
    save_partial,
    save_stage,
)
from rlkit.tasks import TaskSampler, training_sampler
from rlkit.types import EnvSpec, SupportsDemonstrations, SupportsGroundingQuestions, SupportsRecoveryDemonstrations

log = logging.getLogger(__name__)


def sft_stage_config(sft_cfg: Any) -> dict[str, Any]:
    """The ``sft`` config as the cache key hashes it: a plain dict, without ``grounding_mix`` or ``recovery_share``
    when 0 and without ``lr_schedule`` when it is ``constant`` (those build exactly what the stage built before
    the keys existed, so those caches stay valid), and without ``stages`` (``sft_stage_configs``) or
    ``start_from_env`` / ``start_from_experiment`` (the stage is keyed by the warm start it starts from, through
    the policy config)."""
    plain = OmegaConf.to_container(sft_cfg, resolve=True) if OmegaConf.is_config(sft_cfg) else dict(sft_cfg)
    if not plain.get("grounding_mix"):
        plain.pop("grounding_mix", None)
    if not plain.get("recovery_share"):
        plain.pop("recovery_share", None)
    if plain.get("lr_schedule", "constant") == "constant":
        plain.pop("lr_schedule", None)
    plain.pop("stages", None)  # each later stage is keyed on its own, by its predecessor's checkpoint
    # with start_from_* the first stage is keyed by the other job's warm start, as policy.path keys it
    plain.pop("start_from_env", None)
    plain.pop("start_from_experiment", None)
    return plain


def sft_stage_configs(sft_cfg: Any) -> list[dict[str, Any]]:
    """The warm start's stages in order, each as the plain ``sft`` config it trains with (without
    ``stages``): the config itself, then ``sft.stages[i]`` set over it (not over the stage before) for each later
    stage, typed by the ``SFTConfig`` schema as a command-line override would be ("2" -> 2, 1 -> 1.0), so a
    stage keys its cache as the equivalent chained job does. Stage i > 0 starts from stage i - 1's checkpoint
    with a fresh optimizer, as a job with ``policy.path`` pointing at that checkpoint and these sft keys would
    (rlkit.backends.native keys its cache the same way, so the chained jobs' caches and the one job's are the
    same entries). Keys and values are checked by rlkit.config.check_sft_stage before any work.

    Raises: omegaconf.errors.ValidationError on a value of the wrong type (check_sft_stage reports it first).
    """
    base = OmegaConf.to_container(sft_cfg, resolve=True) if OmegaConf.is_config(sft_cfg) else dict(sft_cfg)
    stages = [OmegaConf.to_container(s, resolve=True) if OmegaConf.is_config(s) else dict(s)
              for s in base.pop("stages", None) or []]
    typed = OmegaConf.merge(OmegaConf.structured(SFTConfig), base)
    out = [base]
    for stage in stages:
        merged = OmegaConf.to_container(OmegaConf.merge(typed, stage), resolve=True)
        merged.pop("stages", None)
        out.append(merged)
    return out


def longest_demonstration(env_spec: EnvSpec, tokenizer: Any, seeds: Iterable[int],
                          stop: Iterable[str] = ()) -> tuple[int, int | None]:
    """The most tokens a policy must generate in one turn to write the env's solver demonstration of
    any of ``seeds``: ``(tokens, seed)``; ``(0, None)`` if the env has no ``demonstration``.

    A turn's text counts as ``tokenizer`` (the policy's, a transformers tokenizer) encodes it, plus one
    end-of-turn token unless the text ends with one of the ``stop`` strings (generation ends there
    without it). Compared with ``rollout.max_new_tokens``, it says whether a right answer fits in a turn.
    """
    stop = tuple(stop)
    worst: tuple[int, int | None] = (0, None)
    if not isinstance(env_spec, SupportsDemonstrations):
        return 0, None
    for seed in seeds:
        for text in env_spec.demonstration(seed):
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + (0 if stop and text.endswith(stop) else 1)
            worst = max(worst, (n, seed), key=lambda w: w[0])
    return worst


_LOG_HALF = math.log(0.5)  # a token with logprob above this is the greedy (argmax) choice


def demonstration_metrics(policy: Any, trajectories: list[Trajectory], batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced fit of the policy to held-out demonstrations.

    Args:
        policy: the Policy. trajectories: demonstrations (``demonstration_trajectory``), loss mask 1
            on the demonstrated tokens. batch_size: sequences per forward.

    Returns:
        {"loss": mean negative logprob per demonstrated token (nats),
         "token_accuracy": share of demonstrated tokens with probability > 1/2 (so the greedy choice),
         "first_token_accuracy": the same for the first token where the demonstrations of
         different tasks disagree (for plan-mode mazes: the first move), NaN when they never do}.
        A policy that ignores its observation shows a first_token_accuracy near the frequency of
        the most common first answer, however low its loss.

    Raises: ValueError for an empty list.
    """
    if not trajectories:
        raise ValueError("demonstration_metrics needs at least one demonstration")
    targets = [[t.input_ids[j] for j, m in enumerate(t.loss_mask) if m] for t in trajectories]
    # first position (in demonstrated tokens) where the demonstrations disagree
    first_diff = next((k for k in range(min(map(len, targets)))
                       if len({tg[k] for tg in targets}) > 1), None)
    nll, hits, n_tok, first_hits = 0.0, 0, 0, 0
    with torch.no_grad():
        for i in range(0, len(trajectories), batch_size):
            chunk = trajectories[i : i + batch_size]
            logprobs, _ = policy.logprobs(chunk, temperature=1.0, with_entropy=False)  # [n, T]
            for row, t in zip(logprobs, chunk):
                idx = torch.tensor([j for j, m in enumerate(t.loss_mask) if m], dtype=torch.long)
                lp = row[idx].float()
                nll -= float(lp.sum())
                hits += int((lp > _LOG_HALF).sum())
                n_tok += len(idx)
                if first_diff is not None:
                    first_hits += int(lp[first_diff] > _LOG_HALF)
    return {"loss": nll / max(n_tok, 1), "token_accuracy": hits / max(n_tok, 1),
            "first_token_accuracy": first_hits / len(trajectories) if first_diff is not None else float("nan")}


def train_sft(
    env_spec: EnvSpec,
    policy: Any,
    engine: Any,
    cfg: SFTConfig,
    greedy: Any,
    out_dir: Path,
    progress: Any = None,
    grounding_tasks: Iterable[str] = (),
    on_resume: Callable[[int], None] | None = None,
    build: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the full policy weights on demonstrations; save to ``out_dir`` atomically.

    With ``cfg.grounding_mix`` = N > 0, N grounding questions (``env_spec.grounding_example`` on tasks
    drawn from ``grounding_tasks``, training mazes only) join every batch (rlkit.stages.grounding.encode_example).

    A build that stops before it is done (killed, a crash, a lost machine) resumes where it left off: every
    ``PARTIAL_EVERY`` steps and at each validation check it saves its weights, AdamW and lr-schedule state,
    task samplers, random generators and history to ``partial_dir(out_dir)``, and a later call with the same
    ``out_dir`` (the same cache key: the same config and base) loads them and continues, so the finished
    checkpoint is the one an uninterrupted build writes (bit for bit on the same machine and thread count).
    The folder is removed once ``out_dir`` is saved; a save that cannot be read (cut short, another version's
    fields) is removed with a warning, and the build starts over. ``on_resume(step)`` is called when a build
    resumes.

    Returns: a summary dict (steps, val_success, wall_time_s, num_demos; resumed_at: the steps it resumed
    from, when it did; build: ``build_record(build)``), also written to ``out_dir/sft_summary.json``.
    Raises: RuntimeError if the demonstrations do not solve their tasks; ValueError if grounding_mix > 0
    and the env has no grounding questions or ``grounding_tasks`` is empty (the grounding stage itself
    need not run: ``grounding.tasks`` names the tasks), or if recovery_share > 0 and the env has no recovery
    demonstrations.
    """
    grounding_tasks = list(grounding_tasks)
    _check_env(env_spec, cfg, grounding_tasks)
    t0 = time.time()
    sampler = training_sampler(env_spec, cfg.seed)
    val_seeds = sampler.sample(cfg.val_tasks)
    demos = _Demonstrations(env_spec, policy, cfg, sampler)
    val = _setup_validation(env_spec, policy, val_seeds)
    params, opt, sched = _setup_optimizer(policy, cfg)
    share = batch_shares_prefix(policy)
    mix = _GroundingMix(env_spec, cfg, grounding_tasks) if cfg.grounding_mix > 0 else None
    partial = partial_dir(out_dir)
    run = _resume(partial, out_dir, policy, opt, sched, demos, mix, on_resume)
    while run.step < cfg.max_steps:
        batch = demos.next_batch()
        if mix is not None:  # the grounding questions beside the demonstrations (sft.grounding_mix)
            batch = batch + mix.trajectories(policy)
        loss, lr = _train_step(policy, batch, share, params, opt, sched)
        run.step += 1
        done = False
        if run.step % cfg.eval_every == 0 or run.step == cfg.max_steps:
            done = _validate(env_spec, policy, engine, greedy, cfg, val, run, loss, lr)
        if progress is not None:  # after the check, so the line shows this step's val success
            progress(run.step, cfg.max_steps, loss.item(), run.val_success if run.history else None)
        if done:
            break
        if run.step < cfg.max_steps and (run.step % PARTIAL_EVERY == 0 or run.step % cfg.eval_every == 0):
            _save_progress(partial, policy, opt, sched, demos, mix, run, t0)
    return _finish(policy, out_dir, partial, demos, run, t0, build)


def _check_env(env_spec: EnvSpec, cfg: SFTConfig, grounding_tasks: list[str]) -> None:
    """Raise ValueError, naming the fix, when the env lacks what ``cfg`` mixes into the batches: grounding questions
    (and a task list) for ``grounding_mix`` > 0, recovery demonstrations for ``recovery_share`` > 0."""
    if cfg.grounding_mix > 0 and (not isinstance(env_spec, SupportsGroundingQuestions) or not grounding_tasks):
        raise ValueError(f"sft.grounding_mix={cfg.grounding_mix} needs grounding questions: an env with "
                         f"grounding_example (this one: {type(env_spec).__name__}) and a task list "
                         "(grounding.tasks); or set sft.grounding_mix=0")
    if cfg.recovery_share > 0 and not isinstance(env_spec, SupportsRecoveryDemonstrations):
        raise ValueError(f"sft.recovery_share={cfg.recovery_share} needs an env with recovery_demonstration(seed, rng) "
                         f"(rlkit.types.SupportsRecoveryDemonstrations; this one: {type(env_spec).__name__}); "
                         "set sft.recovery_share=0")


class _Demonstrations:
    """The demonstrations a build trains on, one batch per step: with ``cfg.num_demos`` > 0 a fixed set drawn once and
    gone through in shuffled passes (``torch.Generator`` seeded with ``cfg.seed``), with 0 a fresh batch of tasks
    every step (no demonstration is seen twice). Tasks come from ``sampler``; which demonstrations are recovery
    ones, and their mistakes, from a numpy generator seeded with ``cfg.seed + 2``.

    Raises (from the constructor and ``next_batch``): RuntimeError when almost none of 100 draws' demonstrations
    solves its task within the env's budget."""

    def __init__(self, env_spec: EnvSpec, policy: Any, cfg: SFTConfig, sampler: TaskSampler) -> None:
        self.env_spec, self.policy, self.cfg, self.sampler = env_spec, policy, cfg, sampler
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.recovery_rng = np.random.default_rng(cfg.seed + 2)
        self.streaming = cfg.num_demos == 0
        self.num_drawn = 0  # tasks drawn so far (skipped ones included)
        self.order: list[int] = []  # the current pass's indices into ``fixed`` not yet trained on
        self.fixed: list[Trajectory] = []
        if not self.streaming:
            self.fixed = self.draw(cfg.num_demos)
            log.info("sft: %d demonstrations (%d tasks drawn)", len(self.fixed), self.num_drawn)

    def draw(self, n: int) -> list[Trajectory]:
        """``n`` demonstrations of freshly drawn tasks (a task whose shortest solution exceeds the budget is
        skipped, and another drawn)."""
        out: list[Trajectory] = []
        for _ in range(100):  # a few draws are skipped (shortest path longer than the budget)
            seeds = self.sampler.sample(n - len(out))
            self.num_drawn += len(seeds)
            out += demonstration_trajectories(self.env_spec, self.policy, seeds, self.cfg.recovery_share,
                                              self.recovery_rng)
            if len(out) >= n:
                return out
        raise RuntimeError(
            f"almost none of {self.num_drawn} demonstrations solves its task within the env's budget; "
            f"raise env.max_turns or check the env's demonstration()"
        )

    def next_batch(self) -> list[Trajectory]:
        """The next step's ``cfg.batch_size`` demonstrations."""
        size = self.cfg.batch_size
        if self.streaming:  # a fresh batch of tasks every step: no demonstration is seen twice
            return self.draw(size)
        if len(self.order) < size:
            self.order += torch.randperm(len(self.fixed), generator=self.gen).tolist()
        batch, self.order = [self.fixed[i] for i in self.order[:size]], self.order[size:]
        return batch

    def num_demos(self, steps: int) -> int:
        """The demonstrations the build trained on in ``steps`` steps (each at least once)."""
        return len(self.fixed) if not self.streaming else steps * self.cfg.batch_size


class _GroundingMix:
    """The ``cfg.grounding_mix`` grounding questions that join each batch: tasks drawn from ``tasks`` on training seeds,
    with a task sampler and a numpy generator both seeded with ``cfg.seed + 1``."""

    def __init__(self, env_spec: EnvSpec, cfg: SFTConfig, tasks: list[str]) -> None:
        self.env_spec, self.n, self.tasks = env_spec, cfg.grounding_mix, tasks
        self.sampler = TaskSampler(cfg.seed + 1, env_spec.is_eval_seed)
        self.rng = np.random.default_rng(cfg.seed + 1)

    def trajectories(self, policy: Any) -> list[Trajectory]:
        """The next batch's questions, encoded for ``policy`` (rlkit.stages.grounding.encode_example)."""
        from rlkit.stages.grounding import draw_examples, encode_example

        return [encode_example(policy, ex).trajectory
                for ex in draw_examples(self.env_spec, self.sampler, self.tasks, self.n, self.rng)]


@dataclass
class _Validation:
    """The held-out training seeds a build checks itself on, with their demonstrations (``demonstration_metrics``)
    and their demonstrated answers (candidates of the answer prior)."""

    seeds: list[int]
    demos: list[Trajectory]
    answers: list[list[str]]


def _setup_validation(env_spec: EnvSpec, policy: Any, seeds: list[int]) -> _Validation:
    """The ``_Validation`` of ``seeds``."""
    demos = demonstration_trajectories(env_spec, policy, seeds)
    return _Validation(seeds, demos, [list(env_spec.demonstration(s)) for s in seeds])


def _setup_optimizer(policy: Any, cfg: SFTConfig) -> tuple[list[torch.nn.Parameter], Any, Any]:
    """(the trained parameters, AdamW over them at ``cfg.lr`` without weight decay, its ``sft.lr_schedule``)."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    lr_factor = warmup_schedule(cfg.lr_schedule, cfg.warmup_steps, cfg.max_steps, "sft.lr_schedule")
    return params, opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)


@dataclass
class _Run:
    """Where a build stands: its steps, check history and last val success, the wall time of its earlier parts
    (``elapsed``, s) and the steps it resumed from."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    val_success: float = 0.0
    elapsed: float = 0.0
    resumed_at: list[int] = field(default_factory=list)


def _resume(partial: Path, out_dir: Path, policy: Any, opt: Any, sched: Any, demos: _Demonstrations,
            mix: _GroundingMix | None, on_resume: Callable[[int], None] | None) -> _Run:
    """A fresh ``_Run``, or, when an earlier build of this stage stopped (its save in ``partial``), its ``_Run``
    with every live object set back to its last save; then ``on_resume(step)``."""
    st = load_partial(partial)
    if st is None:
        return _Run()
    restore_training_state(st, policy, opt, sched, demos.sampler)
    demos.gen.set_state(st["generator"])
    if mix is not None:
        mix.sampler.load_state_dict(st["grounding_sampler"])
        mix.rng.bit_generator.state = st["grounding_rng"]
    if st.get("recovery_rng") is not None:
        demos.recovery_rng.bit_generator.state = st["recovery_rng"]
    demos.order, demos.num_drawn = st["order"], st["num_drawn"]
    run = _Run(st["step"], st["history"], st["val_success"], st["wall_time_s"], [*st["resumed_at"], st["step"]])
    log.info("sft: resuming %s at step %d", out_dir, run.step)
    if on_resume is not None:
        on_resume(run.step)
    return run


def _save_progress(partial: Path, policy: Any, opt: Any, sched: Any, demos: _Demonstrations,
                   mix: _GroundingMix | None, run: _Run, t0: float) -> None:
    """Save what ``_resume`` loads back to ``partial`` (rlkit.stages.cache.save_partial); ``t0``: this part's start."""
    save_partial(partial, {
        "model": policy.model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "generator": demos.gen.get_state(), "torch_rng": torch.get_rng_state(), "sampler": demos.sampler.state_dict(),
        "grounding_sampler": None if mix is None else mix.sampler.state_dict(),
        "grounding_rng": None if mix is None else mix.rng.bit_generator.state,
        "recovery_rng": demos.recovery_rng.bit_generator.state,
        "step": run.step, "history": run.history, "order": demos.order, "num_drawn": demos.num_drawn,
        "val_success": run.val_success, "wall_time_s": run.elapsed + time.time() - t0, "resumed_at": run.resumed_at})


def _train_step(policy: Any, batch: list[Trajectory], share: bool, params: list[torch.nn.Parameter], opt: Any,
                sched: Any) -> tuple[torch.Tensor, float]:
    """One AdamW step on ``batch``'s demonstration NLL (gradient norm clipped at 1): (the loss, detached; the lr it
    stepped with)."""
    loss = demonstration_nll(policy, batch, shared_prefix=share)
    loss.backward()
    loss = loss.detach()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    lr = opt.param_groups[0]["lr"]  # this step's lr (sft.lr_schedule)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss, lr


def _validate(env_spec: EnvSpec, policy: Any, engine: Any, greedy: Any, cfg: SFTConfig, val: _Validation, run: _Run,
           loss: torch.Tensor, lr: float) -> bool:
    """A validation check: the greedy success on ``val``'s seeds and the fit to their demonstrations, appended to
    ``run.history``. Returns whether the build is done: the success reaches ``cfg.target_success`` and, with an
    ``answer_prior_margin``, beats the val tasks' answer prior by it."""
    metrics, per_task, _ = evaluate(env_spec, policy, engine, val.seeds, greedy, policy_version=-1)
    run.val_success = metrics["eval/success_rate"]
    fit = demonstration_metrics(policy, val.demos) if val.demos else {}
    entry = {"step": run.step, "loss": float(loss), "lr": lr, "val_success": run.val_success,
             "val_distinct_outputs": metrics["eval/distinct_outputs"], **{f"val_{k}": v for k, v in fit.items()}}
    run.history.append(entry)
    done = run.val_success >= cfg.target_success
    if done and cfg.answer_prior_margin > 0:  # not a stop while one fixed answer would do as well
        prior, _ = answer_prior(env_spec, val.seeds, [r["actions"] for r in per_task] + val.answers)
        entry["val_answer_prior"] = prior
        done = run.val_success >= prior + cfg.answer_prior_margin
    log.debug("sft step %d: %s", run.step, entry)
    return done


def _finish(policy: Any, out_dir: Path, partial: Path, demos: _Demonstrations, run: _Run, t0: float,
            build: dict[str, Any] | None) -> dict[str, Any]:
    """Save the checkpoint and its summary to ``out_dir`` (atomically), remove the saved progress; the summary."""
    summary = {"steps": run.step, "val_success": run.val_success, "num_demos": demos.num_demos(run.step),
               "num_tasks_drawn": demos.num_drawn, "wall_time_s": run.elapsed + time.time() - t0,
               "history": run.history}
    if run.resumed_at:
        summary["resumed_at"] = run.resumed_at
    summary["build"] = build_record(build, policy)
    save_stage(policy, out_dir, "sft_summary.json", summary)
    shutil.rmtree(partial, ignore_errors=True)
    return summary
