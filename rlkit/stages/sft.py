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
    need not run: ``grounding.tasks`` names the tasks).
    """
    grounding_tasks = list(grounding_tasks)
    if cfg.grounding_mix > 0 and (not isinstance(env_spec, SupportsGroundingQuestions) or not grounding_tasks):
        raise ValueError(f"sft.grounding_mix={cfg.grounding_mix} needs grounding questions: an env with "
                         f"grounding_example (this one: {type(env_spec).__name__}) and a task list "
                         "(grounding.tasks); or set sft.grounding_mix=0")
    t0 = time.time()
    gen = torch.Generator().manual_seed(cfg.seed)
    sampler = training_sampler(env_spec, cfg.seed)
    val_seeds = sampler.sample(cfg.val_tasks)
    streaming = cfg.num_demos == 0
    if cfg.recovery_share > 0 and not isinstance(env_spec, SupportsRecoveryDemonstrations):
        raise ValueError(f"sft.recovery_share={cfg.recovery_share} needs an env with recovery_demonstration(seed, rng) "
                         f"(rlkit.types.SupportsRecoveryDemonstrations; this one: {type(env_spec).__name__}); "
                         "set sft.recovery_share=0")
    r_rng = np.random.default_rng(cfg.seed + 2)  # draws which demonstrations are recovery ones, and their mistakes
    demos: list[Trajectory] = []
    num_drawn = 0

    def draw(n: int) -> list[Trajectory]:
        nonlocal num_drawn
        out: list[Trajectory] = []
        for _ in range(100):  # a few draws are skipped (shortest path longer than the budget)
            seeds = sampler.sample(n - len(out))
            num_drawn += len(seeds)
            out += demonstration_trajectories(env_spec, policy, seeds, cfg.recovery_share, r_rng)
            if len(out) >= n:
                return out
        raise RuntimeError(
            f"almost none of {num_drawn} demonstrations solves its task within the env's budget; "
            f"raise env.max_turns or check the env's demonstration()"
        )

    if not streaming:
        demos = draw(cfg.num_demos)
        log.info("sft: %d demonstrations (%d tasks drawn)", len(demos), num_drawn)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    lr_factor = warmup_schedule(cfg.lr_schedule, cfg.warmup_steps, cfg.max_steps,
                                "sft.lr_schedule")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    val_success, step, history = 0.0, 0, []
    val_demos = demonstration_trajectories(env_spec, policy, val_seeds)
    val_answers = [list(env_spec.demonstration(s)) for s in val_seeds]  # candidates of the answer prior
    order: list[int] = []
    share = batch_shares_prefix(policy)
    g_sampler = g_rng = None
    if cfg.grounding_mix > 0:
        from rlkit.stages.grounding import draw_examples, encode_example

        g_sampler, g_rng = TaskSampler(cfg.seed + 1, env_spec.is_eval_seed), np.random.default_rng(cfg.seed + 1)
    partial, elapsed, resumed_at = partial_dir(out_dir), 0.0, []
    st = load_partial(partial)
    if st is not None:  # an earlier build of this stage stopped: go on from its last save
        restore_training_state(st, policy, opt, sched, sampler)
        gen.set_state(st["generator"])
        if g_sampler is not None:
            g_sampler.load_state_dict(st["grounding_sampler"])
            g_rng.bit_generator.state = st["grounding_rng"]
        if st.get("recovery_rng") is not None:
            r_rng.bit_generator.state = st["recovery_rng"]
        step, history, order, num_drawn = st["step"], st["history"], st["order"], st["num_drawn"]
        val_success, elapsed, resumed_at = st["val_success"], st["wall_time_s"], [*st["resumed_at"], st["step"]]
        log.info("sft: resuming %s at step %d", out_dir, step)
        if on_resume is not None:
            on_resume(step)

    def save_progress() -> None:
        save_partial(partial, {
            "model": policy.model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "generator": gen.get_state(), "torch_rng": torch.get_rng_state(), "sampler": sampler.state_dict(),
            "grounding_sampler": None if g_sampler is None else g_sampler.state_dict(),
            "grounding_rng": None if g_rng is None else g_rng.bit_generator.state,
            "recovery_rng": r_rng.bit_generator.state,
            "step": step, "history": history, "order": order, "num_drawn": num_drawn, "val_success": val_success,
            "wall_time_s": elapsed + time.time() - t0, "resumed_at": resumed_at})

    while step < cfg.max_steps:
        if streaming:  # a fresh batch of tasks every step: no demonstration is seen twice
            batch = draw(cfg.batch_size)
        else:
            if len(order) < cfg.batch_size:
                order += torch.randperm(len(demos), generator=gen).tolist()
            batch, order = [demos[i] for i in order[: cfg.batch_size]], order[cfg.batch_size :]
        if cfg.grounding_mix > 0:  # the grounding questions beside the demonstrations (sft.grounding_mix)
            batch = batch + [encode_example(policy, ex).trajectory
                             for ex in draw_examples(env_spec, g_sampler, grounding_tasks, cfg.grounding_mix, g_rng)]
        loss = demonstration_nll(policy, batch, shared_prefix=share)
        loss.backward()
        loss = loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        lr = opt.param_groups[0]["lr"]  # this step's lr (sft.lr_schedule)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        done = False
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            metrics, per_task, _ = evaluate(env_spec, policy, engine, val_seeds, greedy, policy_version=-1)
            val_success = metrics["eval/success_rate"]
            fit = demonstration_metrics(policy, val_demos) if val_demos else {}
            history.append({"step": step, "loss": float(loss), "lr": lr, "val_success": val_success,
                            "val_distinct_outputs": metrics["eval/distinct_outputs"],
                            **{f"val_{k}": v for k, v in fit.items()}})
            done = val_success >= cfg.target_success
            if done and cfg.answer_prior_margin > 0:  # not a stop while one fixed answer would do as well
                prior, _ = answer_prior(env_spec, val_seeds, [r["actions"] for r in per_task] + val_answers)
                history[-1]["val_answer_prior"] = prior
                done = val_success >= prior + cfg.answer_prior_margin
            log.debug("sft step %d: %s", step, history[-1])
        if progress is not None:  # after the check, so the line shows this step's val success
            progress(step, cfg.max_steps, loss.item(), val_success if history else None)
        if done:
            break
        if step < cfg.max_steps and (step % PARTIAL_EVERY == 0 or step % cfg.eval_every == 0):
            save_progress()
    summary = {"steps": step, "val_success": val_success, "num_demos": len(demos) if not streaming else step * cfg.batch_size,
               "num_tasks_drawn": num_drawn,
               "wall_time_s": elapsed + time.time() - t0, "history": history}
    if resumed_at:
        summary["resumed_at"] = resumed_at
    summary["build"] = build_record(build, policy)
    save_stage(policy, out_dir, "sft_summary.json", summary)
    shutil.rmtree(partial, ignore_errors=True)
    return summary


