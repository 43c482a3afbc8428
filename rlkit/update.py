"""The GRPO policy update over one step's trajectories (mini-batches, micro-batches, accumulation).

For each of ``update_epochs`` passes, the N sequences are shuffled and split into mini-batches of
``mini_batch_size`` sequences (whole groups where the sizes allow: ``minibatches``); each
mini-batch is one optimizer step, its gradient accumulated over
micro-batches of ``micro_batch_size`` sequences. Micro-batch losses are weighted so the accumulated
gradient equals the gradient of the mini-batch loss under the configured reduction (token_mean:
by the micro-batch's share of policy tokens; sequence reductions: by its share of sequences).

"Old" logprobs are the sampling logprobs recorded by the rollout engine: on-policy, they equal the
training logprobs of the pre-update weights (checked by tests/policy), so no extra forward pass is
spent on them. With LoRA the reference policy is the same model with the adapter disabled, computed
only when ``kl_coef > 0``.

Shared-prefix forward (``algorithm.shared_prefix``, default on): the G samples of a task share
their prompt (image + text), so within a micro-batch each group's longest common token prefix
runs once with gradients and its KV cache feeds the G suffixes
(rlkit.policy.shared_prefix.compute_logprobs_shared_prefix; the reference forward of the KL term does the
same with the adapter off). Logprobs, loss and gradients equal the full-sequence forward within
float32 rounding. Each mini-batch (drawn by the same shuffle as without it) is reordered group by
group before it is cut into micro-batches: the micro-batch weights make the accumulated gradient
independent of that order, and a micro-batch then holds whole groups as far as
``micro_batch_size`` allows; a group cut by a micro-batch boundary recomputes its prefix in each
part. Where it does not apply, the update uses the full-sequence forward: sequences without a
common prefix (a group of one, or a first image that differs) inside the shared-prefix call, and the
whole call under gradient checkpointing (which drops the KV cache in training) and FSDP over more
than one rank (rlkit.distributed.update: ranks must run the same number of forwards). Within the
shared-prefix forward the text every group of a micro-batch opens with (the system prompt, before the
first image) runs once more coarsely still: rlkit.policy.shared_prefix's root prefix.

Identical samples (``algorithm.dedup_identical_samples``, default on): samples of a group with the same
tokens, sampling logprobs, advantage and images (``identical_samples``) run once, each weighted by how
many it stands for in every reduction (rlkit.algorithms.grpo ``seq_weights``), so the loss, gradient and
diagnostics are those of the whole batch within float rounding. Micro-batches are cut over the distinct
samples; ``policy/distinct_fraction`` logs their share.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from rlkit.algorithms import grpo
from rlkit.algorithms.nll import AuxTerm, active_terms, demonstration_nll
from rlkit.config import AlgorithmConfig
from rlkit.rollout import Trajectory, to_tensor


def grad_clip_limit(max_grad_norm: float) -> float:
    """The ``max_norm`` for ``clip_grad_norm_``: ``algorithm.max_grad_norm``, or inf for 0 (no clipping;
    the norm is still measured and logged as policy/grad_norm)."""
    return max_grad_norm if max_grad_norm > 0 else math.inf


def clip_and_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_grad_norm: float,
                  clip: Callable[[list[torch.nn.Parameter], float], Any] = torch.nn.utils.clip_grad_norm_) -> float:
    """One optimizer step of the GRPO update: clip the gradients of ``params`` to ``max_grad_norm`` (0 = off,
    grad_clip_limit), step, clear the gradients. ``clip(params, max_norm)`` returns the norm before clipping
    (a tensor or float): torch's ``clip_grad_norm_``, or rlkit.distributed.fsdp.clip_grad_norm over sharded
    gradients. Returns that norm as a float.

    Raises: FloatingPointError on a non-finite norm (gradients cleared, no step taken)."""
    grad_norm = float(clip(params, grad_clip_limit(max_grad_norm)))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"non-finite gradient norm ({grad_norm}) in the GRPO update; lower lr or check the rewards"
        )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def grpo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: list[Trajectory],
    advantages: torch.Tensor,
    cfg: AlgorithmConfig,
    temperature: float,
    generator: torch.Generator,
    on_backward: Callable[[], None] | None = None,
    aux_terms: list[AuxTerm] | None = None,
) -> dict[str, float]:
    """Run the GRPO update on one step's batch; return policy/* metrics (means over optimizer steps).

    Args:
        policy: the Policy (``model``, ``logprobs(seqs, temperature) -> (logprobs [n, T], entropy [n, T])``,
            ``reference()`` context manager disabling the adapter).
        trajectories: N trajectories. advantages: [N] float32 (one per sequence).
        cfg: algorithm config. temperature: the sampling temperature (logprobs are of logits / T).
        generator: seeds the mini-batch shuffle.
        on_backward: called after each micro-batch's backward (fault injection in tests).
        aux_terms: supervised terms (rlkit.algorithms.nll.AuxTerm, e.g. the ``demo`` term of the solver's
            demonstrations, ReLIFT, Ma et al. 2025): each adds ``coef x`` its sequences' mean NLL per token
            to the loss of the first optimizer step, in order, and logs ``<name>/nll`` (before the step).
            With no kept sequence, that step runs on the terms alone.
    """
    keep = kept_sequences(trajectories, advantages, cfg)
    terms = active_terms(aux_terms)
    if not keep and not terms:
        return {"policy/skipped": 1.0}
    mini = cfg.mini_batch_size or len(keep)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    n_opt = 0
    term_nll: dict[str, float] = {}
    for _ in range(cfg.update_epochs if keep else 1):
        for batch in minibatches(trajectories, keep, mini, generator) if keep else [[]]:
            stats = _minibatch_step(policy, trajectories, advantages, batch, cfg, temperature, on_backward) if batch else {}
            if not n_opt:  # the auxiliary terms join the first optimizer step
                for term in terms:
                    nll = demonstration_nll(policy, term.sequences)
                    (term.coef * nll).backward()
                    term_nll[f"{term.name}/nll"] = float(nll.detach())
            stats["policy/grad_norm"] = clip_and_step(optimizer, params, cfg.max_grad_norm)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            n_opt += 1
    out = {k: v / n_opt for k, v in sums.items()}
    out["policy/optimizer_steps"] = float(n_opt)
    out.update(term_nll)
    out["policy/lr"] = optimizer.param_groups[0]["lr"]
    return out


def kept_sequences(trajectories: list[Trajectory], advantages: torch.Tensor, cfg: AlgorithmConfig) -> list[int]:
    """Indices of the trajectories the update trains on: those with policy tokens, minus zero-advantage
    ones under ``filter_zero_variance_groups`` and length-cut ones (``num_truncated_turns > 0``) under
    ``overlong_filtering`` (DAPO section 3.4: a truncated sample's reward says nothing about its
    tokens, and rewarding one teaches the policy to stop ending its turn)."""
    keep = [i for i in range(len(trajectories)) if trajectories[i].num_policy_tokens > 0]
    if cfg.filter_zero_variance_groups:
        keep = [i for i in keep if float(advantages[i]) != 0.0]
    if cfg.overlong_filtering:
        keep = [i for i in keep if getattr(trajectories[i], "num_truncated_turns", 0) == 0]
    return keep


def minibatches(trajs: list[Trajectory], keep: list[int], mini: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch's mini-batches (lists of trajectory indices) of the kept sequences ``keep``.

    One mini-batch (``mini >= len(keep)``): the kept sequences in a shuffled order (one
    ``torch.randperm`` of ``generator``). Several: the groups (``Trajectory.group``; a sequence without
    one is its own group) in a shuffled order (one randperm over groups), their members concatenated
    and cut every ``mini`` sequences, so a mini-batch holds whole groups where the sizes allow
    (mini_batch_size 16 or 32 with groups of 8). Whole groups keep the shared-prefix forward's saving:
    cut by sequence, mini_batch_size=16 on 8 groups of 8 ran each group's prompt ~4 times a step
    (update 0.8 -> 1.6 s). Used by the single-process update and by rlkit.distributed.update alike.
    """
    if mini >= len(keep):
        return [[keep[j] for j in torch.randperm(len(keep), generator=generator).tolist()]]
    groups: dict[object, list[int]] = {}
    for i in keep:
        g = getattr(trajs[i], "group", None)
        groups.setdefault(("seq", i) if g is None else g, []).append(i)
    members = list(groups.values())
    order = [i for g in torch.randperm(len(members), generator=generator).tolist() for i in members[g]]
    return [order[start : start + mini] for start in range(0, len(order), mini)]


def use_shared_prefix(policy: Any, cfg: AlgorithmConfig) -> bool:
    """Whether the update runs the shared-prefix forward: ``cfg.shared_prefix`` and the model
    supports it (rlkit.policy.shared_prefix.shared_prefix_unsupported: not under gradient checkpointing)."""
    if not cfg.shared_prefix:
        return False
    from rlkit.policy.shared_prefix import shared_prefix_unsupported

    return shared_prefix_unsupported(policy.model) is None


def order_by_group(trajs: list[Trajectory], batch: list[int]) -> list[int]:
    """``batch`` (trajectory indices) reordered so the members of each group (``Trajectory.group``)
    are contiguous: groups in order of first appearance, members in their order in ``batch``."""
    first: dict[object, int] = {}
    for pos, i in enumerate(batch):
        first.setdefault(getattr(trajs[i], "group", None), pos)
    return sorted(batch, key=lambda i: first[getattr(trajs[i], "group", None)])


def identical_samples(trajs: list[Trajectory], batch: list[int],
                      advantages: torch.Tensor | None = None) -> list[tuple[int, int]]:
    """``batch`` (trajectory indices) with identical samples collapsed: (first index, count) per distinct
    sample, in order of first appearance (so groups contiguous in ``batch`` stay contiguous).

    Two samples are identical when they belong to the same group and have the same tokens, loss mask,
    sampling logprobs (bitwise), truncation count, advantage (``advantages`` [N], when given) and images
    (pixel values and grids): their logprobs, ratios and loss terms are then the same function of the
    weights, so one forward weighted by the count gives the loss and gradient of all of them
    (``micro_batch_loss``'s ``counts``). A nearly deterministic policy samples the same plan several
    times a group: on the CPU default the 64 kept samples of a step were 20-28 distinct ones early in
    training (docs/speed.md).
    """
    firsts: dict[tuple, list[int]] = {}
    counts: dict[int, int] = {}
    for i in batch:
        t = trajs[i]
        key = (getattr(t, "group", None), tuple(t.input_ids), tuple(t.loss_mask), tuple(t.sampling_logprobs),
               getattr(t, "num_truncated_turns", 0), None if advantages is None else float(advantages[i]))
        reps = firsts.setdefault(key, [])
        rep = next((r for r in reps if _same_images(trajs[r], t)), None)
        if rep is None:
            reps.append(i)
            counts[i] = 1
        else:
            counts[rep] += 1
    return list(counts.items())


def _same_images(a: Trajectory, b: Trajectory) -> bool:
    """Whether two trajectories carry the same processed images (pixel values and grids, in order)."""
    if len(a.image_inputs) != len(b.image_inputs):
        return False
    for x, y in zip(a.image_inputs, b.image_inputs):
        if x is y:
            continue
        for name in ("pixel_values", "image_grid_thw"):
            u, v = _field(x, name), _field(y, name)
            if (u is None) != (v is None):
                return False
            if u is not None:
                u, v = torch.as_tensor(u), torch.as_tensor(v)
                if u.shape != v.shape or not torch.equal(u, v):
                    return False
    return True


def _field(image: Any, name: str) -> Any:
    return image.get(name) if isinstance(image, dict) else getattr(image, name, None)


def collapse_batch(trajs: list[Trajectory], batch: list[int], advantages: torch.Tensor,
                   cfg: AlgorithmConfig) -> list[tuple[int, int]]:
    """The (index, count) pairs the update runs for ``batch``: ``identical_samples`` under
    ``cfg.dedup_identical_samples``, else every index with count 1."""
    if cfg.dedup_identical_samples:
        return identical_samples(trajs, batch, advantages)
    return [(i, 1) for i in batch]


def micro_batch_loss(policy: Any, seqs: list[Trajectory], advantages: torch.Tensor, cfg: AlgorithmConfig,
                     temperature: float, shared_prefix: bool | None = None, uniform_forwards: bool = False,
                     counts: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The unweighted GRPO loss of one micro-batch: clipped policy loss (+ KL to the reference when
    ``kl_coef > 0``, - entropy bonus when ``entropy_coef > 0``) under ``cfg.loss_reduction``.

    Args: seqs (n trajectories), advantages [n] (one per sequence), temperature of the logprobs,
    shared_prefix: run each group's common prefix once (module doc); None = use_shared_prefix.
    uniform_forwards: with shared_prefix, every row runs the prefix + suffix forwards, a row alone
    too (rlkit.policy.shared_prefix.compute_logprobs_shared_prefix; what FSDP ranks need).
    counts: [n] how many identical samples each row stands for (``identical_samples``); the loss and
    diagnostics are those of the micro-batch with row i repeated counts[i] times. None = 1 each.
    Returns: (loss scalar with grad, loss mask [n, T] float32 on the logprobs' device, multiplied by
    counts when given (its sum is the policy tokens the rows stand for), detached diagnostics:
    clip_fraction, approx_kl, ratio_*, entropy, pg_loss, loss[, kl]).
    """
    if shared_prefix is None:
        shared_prefix = use_shared_prefix(policy, cfg)
    extra: dict[str, bool] = {"shared_prefix": True} if shared_prefix else {}
    if shared_prefix and uniform_forwards:
        extra["uniform_forwards"] = True
    logprobs, entropy = policy.logprobs(seqs, temperature=temperature, **extra)  # [n, T], [n, T]
    device = logprobs.device
    mask = to_tensor([t.loss_mask for t in seqs], torch.float32).to(device)  # [n, T]
    old = to_tensor([t.sampling_logprobs for t in seqs], torch.float32).to(device)  # [n, T]
    adv = advantages.to(device=device, dtype=torch.float32)  # [n]
    w = None if counts is None else counts.to(device=device, dtype=torch.float32)  # [n]
    loss, diag = grpo.policy_loss(
        logprobs, old, adv, mask,
        eps_clip_low=cfg.eps_clip_low, eps_clip_high=cfg.eps_clip_high,
        clip_ratio_c=cfg.clip_ratio_c, reduction=cfg.loss_reduction, seq_weights=w,
    )
    ent = grpo.aggregate_loss(entropy, mask, cfg.loss_reduction, w)
    total = loss - cfg.entropy_coef * ent if cfg.entropy_coef else loss
    if cfg.kl_coef > 0:
        with torch.no_grad(), policy.reference():
            ref_logprobs, _ = policy.logprobs(seqs, temperature=temperature, with_entropy=False, **extra)
        kl = grpo.aggregate_loss(grpo.kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator), mask, cfg.loss_reduction, w)
        total = total + cfg.kl_coef * kl
        diag["kl"] = kl.detach()
    diag["loss"] = total.detach()
    diag["pg_loss"] = loss.detach()
    diag["entropy"] = ent.detach()
    return total, (mask if w is None else mask * w.unsqueeze(-1)), diag


def _minibatch_step(policy: Any, trajs: list[Trajectory], advantages: torch.Tensor, batch: list[int],
                    cfg: AlgorithmConfig, temperature: float,
                    on_backward: Callable[[], None] | None = None) -> dict[str, float]:
    """Accumulate gradients of one mini-batch over micro-batches; return its diagnostics."""
    token_level = cfg.loss_reduction == "token_mean"
    total_tokens = sum(trajs[i].num_policy_tokens for i in batch)
    total_seqs = len(batch)
    diag_sums: dict[str, float] = {}
    micro = max(cfg.micro_batch_size, 1)
    shared = use_shared_prefix(policy, cfg)
    if shared:
        batch = order_by_group(trajs, batch)  # whole groups per micro-batch; the gradient is order-free
    units = collapse_batch(trajs, batch, advantages, cfg)  # (index, count): identical samples run once
    for start in range(0, len(units), micro):
        idx = [i for i, _ in units[start : start + micro]]
        counts = torch.tensor([c for _, c in units[start : start + micro]], dtype=torch.float32)  # [n]
        seqs = [trajs[i] for i in idx]
        total, mask, diag = micro_batch_loss(policy, seqs, advantages[idx], cfg, temperature, shared_prefix=shared,
                                             counts=counts)
        token_share = float(mask.sum()) / max(total_tokens, 1)
        weight = token_share if token_level else (float(counts.sum()) / total_seqs)
        (total * weight).backward()
        if on_backward is not None:
            on_backward()
        for k, v in diag.items():
            if k.endswith("_max"):
                diag_sums[k] = max(diag_sums.get(k, float("-inf")), float(v))
            else:  # token averages by the token share, reductions by the loss's weight
                diag_sums[k] = diag_sums.get(k, 0.0) + float(v) * (token_share if k in grpo.TOKEN_DIAGNOSTICS else weight)
    diag_sums["distinct_fraction"] = len(units) / max(total_seqs, 1)
    return {
        ("policy/clip_ratio" if k == "clip_fraction" else f"policy/{k}"): v for k, v in diag_sums.items()
    }
