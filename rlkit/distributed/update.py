"""The GRPO update split across data-parallel trainer ranks, equal to the single-rank update.

Single rank (rlkit.update.grpo_update): keep the sequences with policy tokens (and, with
``filter_zero_variance_groups``, a non-zero advantage; with ``overlong_filtering``, no length-cut turn:
``rlkit.update.kept_sequences``); per epoch shuffle them with the run's
generator, cut mini-batches of ``mini_batch_size`` (one optimizer step each), accumulate each
mini-batch's gradient over micro-batches of ``micro_batch_size`` with weights that make the sum the
gradient of the mini-batch loss: token_mean weighs a micro-batch by its share of the mini-batch's
policy tokens, the sequence reductions by its share of sequences.

Here (same result, up to float summation order):

1. ``plan_update`` (the driver) filters and shuffles exactly like grpo_update, drawing from the same
   generator in the same way (rlkit.update.minibatches: one ``torch.randperm`` per epoch, none when nothing is kept), so the
   checkpointed shuffle state evolves as in a single-process run. Each mini-batch is split into
   ``world_size`` contiguous shares whose sizes differ by at most one (N / world_size sequences per
   rank), and carries the mini-batch's global token and sequence counts.
2. ``sharded_grpo_update`` (every rank) runs its share in micro-batches, weighting each by the
   *global* counts, so the per-rank gradients add up to the single-rank gradient; FSDP's
   reduce-scatter sums them (rlkit.distributed.fsdp sets SUM). FSDP2's collectives need every rank
   to run the same number of forwards: a rank with fewer micro-batches runs filler micro-batches
   (a real sequence of the mini-batch, weight 0), and the shared-prefix forward
   (``algorithm.shared_prefix``; the driver orders each mini-batch group by group, so a rank's share
   holds whole groups) runs with ``uniform_forwards``: one prefix and one suffix forward per
   micro-batch on every rank, a sequence without a group partner in its micro-batch as a cluster of
   one. The ranks agree first that those forwards carry images alike (``_same_forwards``), else
   that micro-batch runs the full-sequence forward everywhere; ``policy/shared_prefix_fraction`` is
   the share of micro-batches that shared. Gradients are synchronised only after the last
   micro-batch (``set_requires_gradient_sync``). The gradient norm is clipped over the sharded
   (DTensor) gradients; the optimizer step updates the shards. (A single rank without mixed precision
   runs unsharded: plain tensors, ``root`` a SingleRankRoot whose gradient sync is a no-op.)
   Under ``backend.strategy=ddp`` every rank holds the whole policy (``root`` a fsdp.ReplicatedRoot):
   no forward is collective, so each rank runs only its own micro-batches (a filler only when its
   share is empty), with the plain shared-prefix forward (root prefix included), and the gradients
   are summed in one all-reduce before the norm is clipped (``ReplicatedRoot.reduce_gradients``).
3. Diagnostics: each rank sums ``value * weight`` per key; an all_reduce (SUM; MAX for ``*_max``)
   gives the single-rank diagnostic of the mini-batch.
4. The auxiliary terms (rlkit.algorithms.nll.AuxTerm, e.g. ReLIFT's demonstrations): each term's sequences
   are split across the ranks like a mini-batch (a rank without one runs a filler sequence with weight 0)
   and added to the first optimizer step after its GRPO micro-batches, term after term. Each rank weighs
   its share's mean NLL per token by its share of the term's tokens, so the sum over the ranks is
   ``coef`` x the mean NLL per token of all of them; the gradient sync moves to the last term's backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from rlkit.algorithms.grpo import TOKEN_DIAGNOSTICS
from rlkit.algorithms.nll import AuxTerm, active_terms, demonstration_nll
from rlkit.config import AlgorithmConfig
from rlkit.rollout import Trajectory
from rlkit.update import collapse_batch, kept_sequences, micro_batch_loss, minibatches, order_by_group


@dataclass
class RankStep:
    """One optimizer step (mini-batch) as one rank runs it.

    indices: this rank's sequences (global trajectory indices, may be empty).
    filler: a sequence of the mini-batch run with weight 0 when this rank has fewer micro-batches.
    total_tokens: policy tokens of the whole mini-batch (all ranks). total_seqs: its sequences.
    num_micro: micro-batches every rank runs for this mini-batch.
    counts: how many identical samples each of ``indices`` stands for (rlkit.update.identical_samples);
    empty = 1 each.
    """

    indices: list[int]
    filler: int
    total_tokens: int
    total_seqs: int
    num_micro: int
    counts: list[int] = field(default_factory=list)


@dataclass
class RankPayload:
    """Everything one rank needs for one GRPO step's update.

    steps: the optimizer steps in order. trajectories / advantages: the sequences this rank runs
    (its shares and fillers), by global index; advantages are floats (one per sequence).
    """

    rank: int
    steps: list[RankStep] = field(default_factory=list)
    trajectories: dict[int, Trajectory] = field(default_factory=dict)
    advantages: dict[int, float] = field(default_factory=dict)
    #: this rank's share of each auxiliary term (module doc, step 4), in the order the terms were given: a
    #: term with an empty share holds one filler sequence of weight 0
    aux_shares: list[RankAuxShare] = field(default_factory=list)


@dataclass
class RankAuxShare:
    """One rank's share of an auxiliary term: ``sequences``, and ``weight`` = their tokens over all ranks'
    (0 for a filler); the rank's backward is ``coef x weight x`` their mean NLL per token."""

    name: str
    coef: float
    sequences: list[Trajectory]
    weight: float


def split_even(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into ``parts`` contiguous lists whose lengths differ by at most one (earlier ones longer)."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        n = q + (1 if k < r else 0)
        out.append(items[start : start + n])
        start += n
    return out


def plan_update(
    trajectories: list[Trajectory],
    advantages: torch.Tensor,
    cfg: AlgorithmConfig,
    world_size: int,
    generator: torch.Generator,
    aux_terms: list[AuxTerm] | None = None,
) -> list[RankPayload] | None:
    """Split one step's update across ``world_size`` ranks (module doc, steps 1 and 4).

    Args: trajectories: N. advantages: [N] float. cfg: the algorithm config. generator: the run's
    shuffle generator (consumed exactly as rlkit.update.grpo_update consumes it). aux_terms: the auxiliary
    supervised terms (rlkit.algorithms.nll.AuxTerm; those without a positive coef or a sequence are left out),
    each split across the ranks (module doc, step 4).

    Returns: one RankPayload per rank, or None when no sequence is kept and no term is active (the update
    is skipped, as grpo_update's ``policy/skipped``; the generator is not drawn from). With terms and no
    kept sequence: one optimizer step on them alone.
    """
    keep = kept_sequences(trajectories, advantages, cfg)
    terms = active_terms(aux_terms)
    if not keep and not terms:
        return None
    payloads = [RankPayload(rank=r) for r in range(world_size)]
    for term in terms:
        total = sum(q.num_policy_tokens for q in term.sequences)
        for p, share in zip(payloads, split_even(term.sequences, world_size)):
            p.aux_shares.append(RankAuxShare(term.name, term.coef, share or [term.sequences[0]],
                                             sum(q.num_policy_tokens for q in share) / max(total, 1)))
    if not keep:
        for p in payloads:
            p.steps.append(RankStep([], -1, 0, 0, 0))
        return payloads
    mini = cfg.mini_batch_size or len(keep)
    micro = max(cfg.micro_batch_size, 1)
    for _ in range(cfg.update_epochs):
        for batch in minibatches(trajectories, keep, mini, generator):
            if cfg.shared_prefix:  # as grpo_update: whole groups per micro-batch (and per rank's share)
                batch = order_by_group(trajectories, batch)
            units = collapse_batch(trajectories, batch, advantages, cfg)  # identical samples run once
            shares = split_even(units, world_size)
            total_tokens = sum(trajectories[i].num_policy_tokens for i in batch)
            num_micro = max(math.ceil(len(s) / micro) for s in shares)
            for r, units_r in enumerate(shares):
                share = [i for i, _ in units_r]
                filler = share[0] if share else batch[0]
                payloads[r].steps.append(RankStep(share, filler, total_tokens, len(batch), num_micro,
                                                  [c for _, c in units_r]))
                for i in [*share, filler]:
                    payloads[r].trajectories[i] = trajectories[i]
                    payloads[r].advantages[i] = float(advantages[i])
    return payloads


def sharded_grpo_update(
    policy: Any,
    root: Any,
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    payload: RankPayload,
    cfg: AlgorithmConfig,
    temperature: float,
) -> dict[str, float]:
    """Run this rank's part of the GRPO update (module doc, steps 2-3); collective, all ranks call.

    Args:
        policy: the rank's Policy (``logprobs``, ``reference``), its model sharded by
            rlkit.distributed.fsdp.shard_policy; ``root`` is that FSDP root module (or a
            fsdp.SingleRankRoot for one unsharded rank).
        optimizer / params: the optimizer over the sharded trainable parameters (in order).
        payload: this rank's plan (plan_update). cfg: algorithm config. temperature: the sampling
            temperature (logprobs of logits / T).

    Returns: the same policy/* metrics as grpo_update (means over optimizer steps), identical on
    every rank.

    Raises:
        FloatingPointError: non-finite gradient norm (raised on every rank; gradients cleared).
        RuntimeError: some ranks' micro-batch has images and others' does not (the vision blocks'
            collectives would not match).
    """
    from rlkit.update import use_shared_prefix

    collective = _collective_forwards(root)
    shared = use_shared_prefix(policy, cfg)
    totals: dict[str, float] = {}
    n_opt = 0
    term_nll: dict[str, float] = {}
    n_micro = n_shared = 0
    for step in payload.steps:
        aux = payload.aux_shares if n_opt == 0 else []  # the terms join the first optimizer step
        sums, maxes, ran, ran_shared = _step_micro_batches(policy, root, payload, step, cfg, temperature, collective,
                                                           shared, sync_last=not aux)
        n_micro += ran
        n_shared += ran_shared
        for k, share in enumerate(aux):  # the gradient sync on the last backward of the step
            term_nll[f"{share.name}/nll"] = _nll_backward(policy, root, share.sequences, share.coef * share.weight,
                                                          share.weight, collective, sync=k == len(aux) - 1)
        grad_norm = _optimizer_step(root, optimizer, params, cfg)
        if step.total_seqs:  # (the same on every rank) not for a step on demonstrations alone, as grpo_update
            sums["distinct_fraction"] = len(step.indices) / step.total_seqs  # summed over the ranks
        stats = _all_reduce_stats(sums, maxes)
        stats["grad_norm"] = grad_norm
        for k, v in stats.items():
            key = "policy/clip_ratio" if k == "clip_fraction" else f"policy/{k}"
            totals[key] = totals.get(key, 0.0) + v
        n_opt += 1
    out = {k: v / n_opt for k, v in totals.items()}
    out["policy/optimizer_steps"] = float(n_opt)
    if n_micro:
        out["policy/shared_prefix_fraction"] = n_shared / n_micro
    out.update(term_nll)
    out["policy/lr"] = optimizer.param_groups[0]["lr"]
    return out


def _step_micro_batches(policy: Any, root: Any, payload: RankPayload, step: RankStep, cfg: AlgorithmConfig,
                        temperature: float, collective: bool, shared: bool,
                        sync_last: bool) -> tuple[dict[str, float], dict[str, float], int, int]:
    """This rank's micro-batches of one optimizer step (module doc, step 2): each one's loss, backward with its
    weight by the mini-batch's *global* counts (0 for a filler), and diagnostics. ``collective``: FSDP ranks, which
    run ``step.num_micro`` micro-batches each; ``shared``: the shared-prefix forward may run; ``sync_last``: the
    gradient sync on the last micro-batch's backward (False when auxiliary terms follow in this step).

    Returns: the diagnostics summed (``value * weight``; token averages by the token share) and their maxima
    (``*_max`` keys), the micro-batches run, and how many of them ran the shared-prefix forward.
    """
    token_level = cfg.loss_reduction == "token_mean"
    micro = max(cfg.micro_batch_size, 1)
    sums: dict[str, float] = {}
    maxes: dict[str, float] = {}
    n_shared = 0
    step_counts = step.counts or [1] * len(step.indices)
    chunks = [step.indices[s : s + micro] for s in range(0, len(step.indices), micro)]
    count_chunks = [step_counts[s : s + micro] for s in range(0, len(step.indices), micro)]
    # FSDP ranks run num_micro each; replicated ranks (strategy=ddp) only their own micro-batches, or
    # one filler when their share is empty (so every rank reduces the same diagnostics)
    num_micro = step.num_micro if collective else (len(chunks) or min(step.num_micro, 1))
    for m in range(num_micro):
        is_filler = m >= len(chunks)
        idx = [step.filler] if is_filler else chunks[m]
        counts = torch.tensor([1] if is_filler else count_chunks[m], dtype=torch.float32)  # [n]
        seqs = [payload.trajectories[i] for i in idx]
        if collective:
            _check_same_modality(any(len(t.image_inputs) > 0 for t in seqs))
        root.set_requires_gradient_sync(m == num_micro - 1 and sync_last)
        adv = torch.tensor([payload.advantages[i] for i in idx], dtype=torch.float32)  # [n]
        share = shared and (not collective or _same_forwards(policy, seqs))
        total, mask, diag = micro_batch_loss(policy, seqs, adv, cfg, temperature, shared_prefix=share,
                                             uniform_forwards=collective, counts=counts)
        n_shared += int(share)
        token_share = 0.0 if is_filler else float(mask.sum()) / max(step.total_tokens, 1)
        if is_filler:
            weight = 0.0
        elif token_level:
            weight = token_share
        else:
            weight = float(counts.sum()) / step.total_seqs
        (total * weight).backward()
        for k, v in diag.items():
            if k.endswith("_max"):
                maxes[k] = max(maxes.get(k, float("-inf")), float("-inf") if is_filler else float(v))
            else:  # token averages by the token share, reductions by the loss's weight
                sums[k] = sums.get(k, 0.0) + float(v) * (token_share if k in TOKEN_DIAGNOSTICS else weight)
    return sums, maxes, num_micro, n_shared


def _optimizer_step(root: Any, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                    cfg: AlgorithmConfig) -> float:
    """Reduce the ranks' gradients where the root has not (strategy=ddp), clip them to ``cfg.max_grad_norm``
    (0 = off), step the optimizer and clear the gradients. Returns the gradient norm before clipping.

    Raises: FloatingPointError on a non-finite norm (on every rank; gradients cleared, no step)."""
    from rlkit.distributed.fsdp import clip_grad_norm
    from rlkit.update import clip_and_step

    reduce = getattr(root, "reduce_gradients", None)  # strategy=ddp: sum the ranks' gradients now
    if reduce is not None:  # (an FSDP root reduced them in the last backward)
        reduce(params)
    return clip_and_step(optimizer, params, cfg.max_grad_norm, clip=clip_grad_norm)


def _nll_backward(policy: Any, root: Any, seqs: list[Trajectory], coef: float, weight: float, collective: bool,
                  sync: bool) -> float:
    """Backward of ``coef`` x this rank's mean NLL per token of ``seqs`` (its share of an auxiliary term:
    module doc, step 4), with the gradient sync ``sync``; returns the mean NLL per token of all ranks'
    sequences (``weight``: this share's tokens over all)."""
    if collective:
        _check_same_modality(any(len(t.image_inputs) > 0 for t in seqs))
    root.set_requires_gradient_sync(sync)
    # full-sequence forward on FSDP ranks: every rank must run the same forwards (as for the micro-batches)
    nll = demonstration_nll(policy, seqs, shared_prefix=False if collective else None)
    (coef * nll).backward()
    return _all_reduce_stats({"nll": float(nll.detach()) * weight}, {})["nll"]


def _same_forwards(policy: Any, seqs: list[Trajectory]) -> bool:
    """Whether every rank can run this micro-batch's shared-prefix forward (collective, all ranks call).

    Over > 1 rank the forward runs with ``uniform_forwards`` (a prefix and a suffix forward on every
    rank, whatever groups its micro-batch holds), and the ranks must also agree on which of the two
    carry images (the vision blocks run only then). When they do not (a multi-turn micro-batch whose
    suffixes have later-turn images on some ranks only), all ranks run the full-sequence forward.
    """
    if _world() == 1:
        return True
    from rlkit.policy.batching import model_config
    from rlkit.policy.shared_prefix import forward_images

    prefix, suffix = forward_images(seqs, int(model_config(policy.model).image_token_id))
    flags = [float(prefix), float(suffix)]
    t = torch.tensor(flags + [-f for f in flags], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # [any prefix, any suffix, -all prefix, -all suffix]
    return bool(float(t[0]) == -float(t[2]) and float(t[1]) == -float(t[3]))


def _collective_forwards(root: Any) -> bool:
    """Whether the ranks must run the same forwards: FSDP2 over > 1 rank gathers parameters inside them.
    A single unsharded rank and replicated ranks (fsdp.SingleRankRoot, fsdp.ReplicatedRoot) say False."""
    return bool(getattr(root, "collective_forwards", _world() > 1))


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _comm_device() -> torch.device:
    """Where small collective tensors live: the GPU for NCCL, the CPU for gloo."""
    return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")


def _check_same_modality(has_images: bool) -> None:
    """Raise on every rank when some ranks' micro-batch has images and others' has none."""
    if _world() == 1:
        return
    flag = torch.tensor([1.0 if has_images else 0.0, -1.0 if has_images else 0.0], dtype=torch.float64,
                        device=_comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # [any has images, -(all have images)]
    if float(flag[0]) != -float(flag[1]):
        raise RuntimeError(
            "FSDP ranks disagree on whether this micro-batch has images (the vision blocks' collectives "
            "would not match); an env whose episodes mix text-only and image observations needs "
            "backend.num_workers=1"
        )


def _all_reduce_stats(sums: dict[str, float], maxes: dict[str, float]) -> dict[str, float]:
    """SUM-reduce ``sums`` and MAX-reduce ``maxes`` over the ranks (keys are the same on every rank)."""
    out = dict(sums)
    out.update(maxes)
    if _world() == 1:
        return out
    skeys, mkeys = sorted(sums), sorted(maxes)
    if skeys:
        t = torch.tensor([sums[k] for k in skeys], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        out.update({k: float(v) for k, v in zip(skeys, t.tolist())})
    if mkeys:
        t = torch.tensor([maxes[k] for k in mkeys], dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.update({k: float(v) for k, v in zip(mkeys, t.tolist())})
    return out
