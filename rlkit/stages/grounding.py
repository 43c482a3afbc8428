"""Visual grounding pretraining: teach the base policy to read its images before the SFT warm start.

Real VLMs learn to read pictures (captioning, grounding, OCR) long before anyone fine-tunes them on
a task; a randomly initialised tiny Qwen3-VL has not, and a policy that cannot read its maze learns
only the task's prior (issue 19: 4 distinct answers for 64 mazes). This stage trains the full
weights on the env's own grounding questions (``EnvSpec.grounding_example``; for VisGym:
envs/visgym/grounding.py) on training seeds only, with the cross-entropy on the answer tokens.

Every number it reports is paired with a **blind control**: the same model, steps and questions,
but every image replaced by one fixed image, so what it learns is the questions' prior. Reading
shows as the gap between the two (``grounding_summary.json``: per-task exact-match accuracy on
held-out mazes, at every check, for both).

Accuracy is exact match of the greedy answer, computed in one teacher-forced forward: greedy
decoding reproduces the answer (and its end-of-turn token) iff every answer token is the argmax
given the correct prefix.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlkit.algorithms.nll import batch_shares_prefix
from rlkit.policy.logprobs import banned_mask, sequence_batch
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
from rlkit.tasks import TaskSampler
from rlkit.types import Episode, SupportsGroundingBitsName, SupportsGroundingQuestions

#: What a grounding build's saved progress holds (rlkit.stages.cache.load_partial refuses a save without one of them).
_GROUNDING_PARTIAL_KEYS = ("model", "optimizer", "scheduler", "torch_rng", "sampler", "rng", "step", "history",
                           "table", "wall_time_s", "resumed_at")

#: The accuracy tables' pseudo-task of the bits the questions ask (one per flagged question, one per bit token of a
#: transcription): named by the env (``SupportsGroundingQuestions.grounding_bits_name``), else this.
BITS = "bits"


def bits_name(env_spec: Any) -> str:
    """What the env calls the bits its grounding questions ask, as its accuracy tables name them (VisGym:
    "wall_bits", rlkit.types.SupportsGroundingBitsName); ``BITS`` when it does not say."""
    return str(env_spec.grounding_bits_name) if isinstance(env_spec, SupportsGroundingBitsName) else BITS


@dataclass
class GroundingItem:
    """One encoded question: the trajectory to train on, plus what the tables group it by."""

    trajectory: Trajectory
    task: str
    wall_bit: bool
    answer_len: int  # answer tokens incl. the end-of-turn token
    bit_tokens: tuple[int, ...] = ()  # indices (within the answer tokens) of the tokens holding wall-bit values


def _bit_tokens(tokenizer: Any, answer_ids: Sequence[int], answer: str, offsets: Sequence[int]) -> tuple[int, ...]:
    """Index of the answer token that holds each character offset in ``offsets``.

    Raises ValueError if the tokens do not spell ``answer`` one token at a time (then a token's
    span cannot be told) or an offset's token also holds another offset (two bits in one token
    cannot be scored apart).
    """
    pieces = [tokenizer.decode([t]) for t in answer_ids]
    spans, pos = [], 0
    for piece in pieces:
        spans.append((pos, pos + len(piece)))
        pos += len(piece)
    if "".join(pieces) != answer:
        raise ValueError(f"the answer {answer[:40]!r} does not decode token by token; per-bit scoring needs it")
    found = [next(k for k, (a, b) in enumerate(spans) if a <= off < b) for off in offsets]
    if len(set(found)) != len(found):
        raise ValueError(f"two wall bits of {answer[:40]!r} share a token with this tokenizer; "
                         "separate them in the answer format")
    return tuple(found)


def encode_example(policy: Any, example: Any, image: Any = None) -> GroundingItem:
    """Encode a grounding example (task, question, answer, image) as a one-turn trajectory.

    ``image``: use this image instead of the example's (the blind control's fixed image).
    Loss mask 1 on the answer's tokens and <|im_end|>, as the SFT warm start does for demonstrations.
    """
    chat = policy.chat
    turn = chat.user_turn(example.question, [example.image if image is None else image], system=None, first=True)
    completion = chat.completion_ids(example.answer)
    end = chat.turn_end_ids("stop")
    ids = list(turn.input_ids) + list(completion) + list(end)
    mask = [0] * len(turn.input_ids) + [1] * len(completion) + [0] * len(end)
    record = Episode(seed=example.seed, turns=[], terminated=True, truncated=False, success=True)
    traj = Trajectory(ids, mask, [0.0] * len(ids), list(turn.image_inputs), record, group=0, policy_version=-1)
    offsets = tuple(getattr(example, "bit_offsets", ()) or ())
    bits = _bit_tokens(policy.tokenizer, completion[:-1], example.answer, offsets) if offsets else ()
    return GroundingItem(traj, example.task, bool(getattr(example, "wall_bit", False)), len(completion), bits)


def exact_match(policy: Any, items: Sequence[GroundingItem], batch_size: int = 64) -> list[bool]:
    """For each item, whether greedy decoding would write exactly its answer (teacher-forced check).

    Returns one bool per item: every answer token (see ``token_hits``) is the argmax.
    """
    return [all(h) for h in token_hits(policy, items, batch_size)]


def token_hits(policy: Any, items: Sequence[GroundingItem], batch_size: int = 64) -> list[list[bool]]:
    """For each item, per answer token (incl. the end-of-turn token): is it the argmax given the correct prefix.

    Returns one list of ``answer_len`` bools per item. One forward per ``batch_size`` items
    (right-padded); the banned ids are the sampler's (Policy.banned_token_ids), so the argmax is
    over the tokens the sampler could emit. The model is put in eval mode for the check and
    restored after. A wall bit's teacher-forced accuracy is its token's entry (``bit_tokens``).
    """
    model = policy.model
    hits: list[list[bool]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for k in range(0, len(items), batch_size):
                chunk = items[k : k + batch_size]
                batch = sequence_batch(model, [it.trajectory for it in chunk], padding_side="right")
                logits = model(**batch.model_inputs(), use_cache=False).logits
                banned = banned_mask(getattr(policy, "banned_token_ids", None), logits.shape[-1], logits.device)
                pred = logits.float().masked_fill(banned, float("-inf")).argmax(-1)  # [N, T]
                for i, it in enumerate(chunk):
                    ids = torch.tensor(it.trajectory.input_ids)
                    mask = torch.tensor(it.trajectory.loss_mask, dtype=torch.bool)
                    pos = mask.nonzero().squeeze(-1)  # answer token positions
                    hits.append((pred[i, pos - 1].cpu() == ids[pos]).tolist())
    finally:
        model.train(was_training)
    return hits


def accuracy_table(items: Sequence[GroundingItem], hits: Sequence[bool],
                   per_token: Sequence[Sequence[bool]] | None = None, bits: str = BITS) -> dict[str, float]:
    """Exact-match accuracy per task and ``all``, plus ``bits`` (the env's name for them, ``bits_name``): the
    accuracy over every bit asked, a question flagged ``wall_bit`` counting one bit and a transcription counting
    each of its bits (its token in ``per_token``, teacher-forced; see ``token_hits``). ``bits`` is left out when no
    question asks a bit (it would be the mean of nothing)."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for k, (it, h) in enumerate(zip(items, hits)):
        groups[it.task].append(h)
        if it.wall_bit:
            groups[bits].append(h)
        if per_token is not None and getattr(it, "bit_tokens", ()):
            groups[bits].extend(bool(per_token[k][b]) for b in it.bit_tokens)
        groups["all"].append(h)
    return {k: float(np.mean(v)) for k, v in sorted(groups.items())}


def draw_examples(env_spec: Any, sampler: TaskSampler, tasks: Sequence[str], n: int, rng: np.random.Generator) -> list[Any]:
    """``n`` grounding questions, each on the maze of a seed ``sampler`` draws and of a task drawn
    uniformly from ``tasks`` (``env_spec.grounding_example``)."""
    seeds = sampler.sample(n)
    names = [tasks[int(i)] for i in rng.integers(0, len(tasks), size=n)]
    return [env_spec.grounding_example(s, t, rng) for s, t in zip(seeds, names)]


def grounding_tasks(env_spec: Any, tasks: Any) -> list[str]:
    """``grounding.tasks`` as the grounding stage runs it: a list of the env's grounding task names, drawn
    uniformly; an empty or None list is every task the env offers (``env_spec.grounding_tasks``).

    Raises: ValueError naming the fix when the env offers no grounding questions (no ``grounding_example``), the
    value is not a flat list of names, or a task is not one the env offers."""
    if not isinstance(env_spec, SupportsGroundingQuestions):
        raise ValueError(f"{type(env_spec).__name__} offers no grounding questions (no grounding_example); "
                         "set grounding.enabled=false")
    offered = list(env_spec.grounding_tasks)
    raw = list(tasks or [])
    if not all(isinstance(t, str) for t in raw):
        raise ValueError(f"grounding.tasks {raw}: a flat list of task names, e.g. 'grounding.tasks=[walls]' or "
                         f"'grounding.tasks=[cell,walls]' (the env offers {offered})")
    unknown = sorted(set(raw) - set(offered))
    if unknown:
        raise ValueError(f"grounding.tasks {raw}: unknown task(s) {unknown}; {type(env_spec).__name__} offers {offered}")
    return list(dict.fromkeys(raw)) or offered


def train_grounding(
    env_spec: Any,
    policy: Any,
    cfg: Any,
    out_dir: Path | None = None,
    blind: bool = False,
    progress: Callable[[int, int, float, dict | None], None] | None = None,
    on_resume: Callable[[int], None] | None = None,
    build: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the full policy weights on grounding questions; save to ``out_dir`` (atomically).

    With an ``out_dir``, a build that stops before it is done resumes where it left off, as the SFT warm start
    does (rlkit.stages.sft.train_sft): every ``PARTIAL_EVERY`` steps and at each check it saves its weights, AdamW
    and warmup state, task sampler, random generators and history to
    ``partial_dir(out_dir)``; a later call with the same ``out_dir`` (the same cache key) continues from
    there, and the finished checkpoint is the one an uninterrupted build writes (bit for bit on the same
    machine and thread count). The folder is removed once ``out_dir`` is saved; an unreadable save is
    removed with a warning and the build starts over. ``on_resume(step)`` is called when a build resumes.

    Args:
        env_spec: an EnvSpec with ``grounding_example(seed, task, rng)`` and ``grounding_tasks``.
        policy: a full-weights (not LoRA) rlkit Policy; trained in place.
        cfg: GroundingConfig (rlkit.config): max_steps, batch_size, lr, warmup_steps, eval_every,
            val_questions, target_accuracy, tasks (``grounding_tasks``), seed.
        out_dir: where to save the checkpoint (None: do not save; tests and controls).
        blind: the blind control: every image (training and held-out) is one fixed image.
        progress: called after every step as ``progress(step, max_steps, loss, last_table)``.

    Returns:
        A summary dict: steps, wall_time_s, blind, final (accuracy table on the held-out
        questions), history (one entry per check: step, loss, accuracy table); resumed_at (the steps
        it resumed from) when it did; with an ``out_dir``, build (rlkit.stages.cache.build_record(build)). Written to
        ``out_dir/grounding_summary.json`` when out_dir is given. Training stops early once the
        held-out accuracy of the bits asked (``bits_name``; ``all`` when no question asks a bit) reaches
        ``target_accuracy``.

    Raises:
        ValueError: from ``grounding_tasks``: the env offers no grounding questions, or ``cfg.tasks`` is
            malformed (not a flat list of names, a task the env lacks).
    """
    all_tasks = grounding_tasks(env_spec, cfg.tasks)
    t0 = time.time()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    sampler = TaskSampler(cfg.seed, env_spec.is_eval_seed)
    val_items, fixed = _setup_validation(env_spec, policy, cfg, sampler, all_tasks, blind)
    params, opt, sched = _setup_optimizer(policy, cfg)
    key = bits_name(env_spec) if any(it.wall_bit or it.bit_tokens for it in val_items) else "all"
    partial = partial_dir(out_dir) if out_dir is not None else None
    run = _resume(partial, policy, opt, sched, sampler, rng, on_resume)
    policy.model.train()
    share = batch_shares_prefix(policy)
    while run.step < cfg.max_steps:
        batch = [encode_example(policy, ex, fixed)
                 for ex in draw_examples(env_spec, sampler, all_tasks, cfg.batch_size, rng)]
        loss = _train_step(policy, batch, share, params, opt, sched)
        run.step += 1
        checked = run.step % cfg.eval_every == 0 or run.step == cfg.max_steps
        if checked:
            per_token = token_hits(policy, val_items)
            run.table = accuracy_table(val_items, [all(h) for h in per_token], per_token, bits_name(env_spec))
            run.history.append({"step": run.step, "loss": float(loss), "accuracy": run.table,
                                "wall_time_s": run.elapsed + time.time() - t0})
        if progress is not None:
            progress(run.step, cfg.max_steps, float(loss), run.table)
        if checked and run.table.get(key, 0.0) >= cfg.target_accuracy:
            break
        if partial is not None and run.step < cfg.max_steps and (run.step % PARTIAL_EVERY == 0 or checked):
            _save_progress(partial, policy, opt, sched, sampler, rng, run, t0)
    summary = {"steps": run.step, "wall_time_s": run.elapsed + time.time() - t0, "blind": blind, "tasks": all_tasks,
               "stop_metric": key, "final": run.table, "history": run.history}
    if run.resumed_at:
        summary["resumed_at"] = run.resumed_at
    if out_dir is not None:
        _save(policy, out_dir, partial, summary, build)
    return summary


def _save(policy: Any, out_dir: Path, partial: Path, summary: dict[str, Any], build: dict[str, Any] | None) -> None:
    """Save the checkpoint and ``summary`` (plus ``build``: rlkit.stages.cache.build_record) to ``out_dir``
    atomically, then remove the saved progress in ``partial``."""
    summary["build"] = build_record(build, policy)
    save_stage(policy, out_dir, "grounding_summary.json", summary)
    shutil.rmtree(partial, ignore_errors=True)


def _setup_validation(env_spec: Any, policy: Any, cfg: Any, sampler: TaskSampler, tasks: list[str],
                      blind: bool) -> tuple[list[GroundingItem], Any]:
    """(the ``cfg.val_questions`` held-out questions, encoded; the blind control's fixed image, else None), drawn
    with ``sampler`` and a numpy generator seeded with ``cfg.seed + 1``."""
    val_rng = np.random.default_rng(cfg.seed + 1)
    val_examples = draw_examples(env_spec, sampler, tasks, cfg.val_questions, val_rng)
    fixed = env_spec.grounding_example(sampler.sample(1)[0], tasks[0], val_rng).image if blind else None
    return [encode_example(policy, ex, fixed) for ex in val_examples], fixed


def _setup_optimizer(policy: Any, cfg: Any) -> tuple[list[torch.nn.Parameter], Any, Any]:
    """(the trained parameters, AdamW over them at ``cfg.lr`` without weight decay, its linear warmup over
    ``cfg.warmup_steps``)."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    return params, opt, sched


@dataclass
class _Run:
    """Where a build stands: its steps, check history and last accuracy table (None before the first check), the wall
    time of its earlier parts (``elapsed``, s) and the steps it resumed from."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    table: dict[str, float] | None = None
    elapsed: float = 0.0
    resumed_at: list[int] = field(default_factory=list)


def _resume(partial: Path | None, policy: Any, opt: Any, sched: Any, sampler: TaskSampler, rng: np.random.Generator,
            on_resume: Callable[[int], None] | None) -> _Run:
    """A fresh ``_Run``, or, when an earlier build of this stage stopped (its save in ``partial``), its ``_Run``
    with every live object set back to its last save; then ``on_resume(step)``."""
    st = load_partial(partial, _GROUNDING_PARTIAL_KEYS, "grounding") if partial is not None else None
    if st is None:
        return _Run()
    restore_training_state(st, policy, opt, sched, sampler)
    rng.bit_generator.state = st["rng"]
    run = _Run(st["step"], st["history"], st["table"], st["wall_time_s"], [*st["resumed_at"], st["step"]])
    if on_resume is not None:
        on_resume(run.step)
    return run


def _save_progress(partial: Path, policy: Any, opt: Any, sched: Any, sampler: TaskSampler, rng: np.random.Generator,
                   run: _Run, t0: float) -> None:
    """Save what ``_resume`` loads back to ``partial`` (rlkit.stages.cache.save_partial); ``t0``: this part's start."""
    save_partial(partial, {
        "model": policy.model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "torch_rng": torch.get_rng_state(), "sampler": sampler.state_dict(), "rng": rng.bit_generator.state,
        "step": run.step, "history": run.history, "table": run.table,
        "wall_time_s": run.elapsed + time.time() - t0, "resumed_at": run.resumed_at})


def _train_step(policy: Any, batch: list[GroundingItem], share: bool, params: list[torch.nn.Parameter], opt: Any,
                sched: Any) -> torch.Tensor:
    """One AdamW step on the mean negative logprob of ``batch``'s answer tokens (gradient norm clipped at 1); the
    loss, detached."""
    logprobs, _ = policy.logprobs([it.trajectory for it in batch], temperature=1.0, with_entropy=False,
                                  shared_prefix=share)  # the system prompt once (rlkit.algorithms.nll.batch_shares_prefix)
    mask = torch.zeros_like(logprobs)
    for i, it in enumerate(batch):
        mask[i, : len(it.trajectory.loss_mask)] = torch.tensor(it.trajectory.loss_mask, dtype=torch.float32)
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def format_table(tables: dict[str, dict[str, float]]) -> str:
    """A plain-text per-task accuracy table: one row per task, one column per run (e.g. image, blind)."""
    runs = list(tables)
    rows = sorted({k for t in tables.values() for k in t})
    width = max(len(r) for r in rows + ["task"])
    lines = ["task".ljust(width) + "".join(f"  {r:>8}" for r in runs)]
    for r in rows:
        lines.append(r.ljust(width) + "".join(
            f"  {tables[run][r]:>8.1%}" if r in tables[run] else f"  {'-':>8}" for run in runs))
    return "\n".join(lines)
