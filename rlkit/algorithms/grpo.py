"""GRPO math: group-relative advantages, the clipped policy-gradient loss, KL estimators, entropy.

Which variant this is
---------------------
* Advantages (DeepSeekMath, Shao et al. 2024, "outcome supervision"): each task is sampled G times
  (a group); the advantage of sample i is (r_i - mean(r_group)) / (std(r_group) + eps). With
  ``norm_by_std=False`` it is r_i - mean(r_group), as Dr. GRPO (Liu et al. 2025, "Understanding
  R1-Zero-Like Training") recommends to remove the difficulty bias of the std division.
  The std is the unbiased sample std (torch.std default), as in DeepSeekMath's reference code and
  verl's GRPO estimator. A group of identical rewards gets advantage 0; a group of size 1 too.
* Policy loss: PPO's clipped surrogate (Schulman et al. 2017) per token, with separate lower and
  upper clip ratios (DAPO's "clip-higher", Yu et al. 2025): ratio is clipped to
  [1 - eps_clip_low, 1 + eps_clip_high]. Optional dual clip (Ye et al. 2020, "Mastering Complex
  Control in MOBA Games"): for negative advantages the loss is additionally bounded by
  -A * clip_ratio_c, so a huge ratio on a bad token cannot dominate.
* Loss reduction: ``token_mean`` (every policy token of the batch weighs the same: DAPO / Dr. GRPO),
  ``seq_mean_token_mean`` (mean over tokens of each sequence, then over sequences: the original
  GRPO objective), ``seq_mean_token_sum`` (sum over tokens, mean over sequences).
* KL to the reference policy as a loss term (DeepSeekMath uses the k3 estimator of Schulman,
  "Approximating KL Divergence", 2020): k1 = log p - log p_ref, k3 = exp(log p_ref - log p)
  - (log p_ref - log p) - 1 (unbiased, always >= 0), k2 = 0.5 * (log p - log p_ref)^2.
* Entropy bonus: ``- entropy_coef * entropy`` added to the loss.
* Zero-variance groups (DAPO, section 3.2): ``zero_variance_groups`` finds them; the update can drop
  them (``filter_zero_variance_groups``) and the native loop can replace them by sampling more tasks
  (conf/sampling/dapo.yaml, rlkit.sampling.dynamic).

Shapes: N = number of sequences (B tasks x G samples), T = padded sequence length. All per-token
tensors are [N, T] float32, masks [N, T] (bool or 0/1), rewards and advantages [N].
"""

from __future__ import annotations

from typing import Literal

import torch

LossReduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
KLEstimator = Literal["k1", "k2", "k3"]


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages, one per sequence.

    Args:
        rewards: [N] float, N = num_groups * group_size, the G samples of a group contiguous.
        group_size: G >= 1.
        norm_by_std: divide by the group's std (GRPO) or not (Dr. GRPO).
        eps: added to the std.

    Returns:
        advantages [N] float32. Zero for every member of a group whose rewards are all equal,
        and for G == 1.

    Raises:
        ValueError: if N is not a multiple of group_size or group_size < 1.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.ndim != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be a 1-D tensor whose length is a multiple of group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    r = rewards.float().view(-1, group_size)  # [num_groups, G]
    centred = r - r.mean(dim=1, keepdim=True)  # [num_groups, G]
    if group_size == 1:
        return torch.zeros_like(rewards, dtype=torch.float32)
    if norm_by_std:
        std = r.std(dim=1, keepdim=True)  # [num_groups, 1], unbiased
        # all-equal groups have centred == 0; keep them exactly 0 even when eps == 0
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred.reshape(-1)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups have all-equal rewards (they carry no GRPO signal; DAPO filters them).

    Args: rewards [N]; group_size G. Returns: bool [N // G].
    """
    r = rewards.float().view(-1, group_size)
    return (r.max(dim=1).values - r.min(dim=1).values) == 0


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set; 0 where the mask is empty (no NaN)."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim=dim)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return total / count.clamp(min=1.0)


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, reduction: LossReduction,
                   seq_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce a per-token loss [N, T] over the policy tokens ``mask`` [N, T] to a scalar.

    token_mean: sum over all masked tokens / number of masked tokens.
    seq_mean_token_mean: per sequence mean over its masked tokens, then mean over sequences that
        have at least one masked token.
    seq_mean_token_sum: per sequence sum over its masked tokens, then mean over those sequences.

    seq_weights: [N] how many sequences each row stands for (rlkit.update.identical_samples: k identical
    samples run once); every reduction then equals its value over the batch with row i repeated
    seq_weights[i] times. None = 1 each.

    Raises: ValueError on an unknown reduction.
    """
    m = mask.to(per_token.dtype)
    w = None if seq_weights is None else seq_weights.to(device=per_token.device, dtype=per_token.dtype)
    if reduction == "token_mean":
        return masked_mean(per_token, m if w is None else m * w.unsqueeze(-1))
    has_tokens = m.sum(dim=1) > 0  # [N]
    if reduction == "seq_mean_token_mean":
        per_seq = (per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # [N]
    elif reduction == "seq_mean_token_sum":
        per_seq = (per_token * m).sum(dim=1)  # [N]
    else:
        raise ValueError(
            f"unknown loss reduction {reduction!r}; use token_mean, seq_mean_token_mean or seq_mean_token_sum"
        )
    if not bool(has_tokens.any()):
        return per_token.sum() * 0.0
    if w is None:
        return per_seq[has_tokens].mean()
    return (per_seq * w)[has_tokens].sum() / w[has_tokens].sum()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi, [N, T] -> [N, T].

    k1: log p - log p_ref (unbiased, can be negative); k2: 0.5 (log p - log p_ref)^2;
    k3: exp(log p_ref - log p) - (log p_ref - log p) - 1 (unbiased, >= 0). Source: J. Schulman,
    "Approximating KL Divergence" (2020); k3 is what DeepSeekMath's GRPO uses.
    The log-ratio is clamped to [-20, 20] before exp for numerical safety.
    """
    log_ratio = logprobs.float() - ref_logprobs.float()  # log p - log p_ref, [N, T]
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-20.0, 20.0)  # log p_ref - log p
        return neg.exp() - neg - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1, k2 or k3")


#: policy_loss's diagnostics that are averages over policy tokens (the others are maxima or reductions):
#: an update sums them over micro-batches weighted by each one's share of the tokens, whatever the loss
#: reduction, so they do not depend on how a batch is cut.
TOKEN_DIAGNOSTICS = frozenset({"clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean"})


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float | None = None,
    reduction: LossReduction = "token_mean",
    seq_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient (PPO surrogate) loss over policy tokens.

    Args:
        logprobs: [N, T] current policy log-probabilities of the taken tokens (requires grad).
        old_logprobs: [N, T] log-probabilities under the policy that sampled them (no grad).
        advantages: [N] per-sequence (broadcast to every token) or [N, T] per-token.
        mask: [N, T] 1 on policy tokens, 0 on prompt / env / padding tokens.
        eps_clip_low, eps_clip_high: ratio clipped to [1 - low, 1 + high] (DAPO clip-higher).
        clip_ratio_c: dual-clip constant (> 1) or None; bounds the loss of negative advantages.
        reduction: see ``aggregate_loss``.
        seq_weights: [N] sequences each row stands for (see ``aggregate_loss``); the loss and the
            diagnostics equal those of the batch with row i repeated seq_weights[i] times. None = 1 each.

    Returns:
        (loss scalar, diagnostics) where diagnostics holds detached scalars:
        clip_fraction (share of policy tokens where the clipped branch was taken),
        approx_kl (mean of the k3 estimate of KL(old || new) over policy tokens, CleanRL's
        ``approx_kl``), ratio_mean, ratio_max, dual_clip_fraction.

    Raises: ValueError if clip_ratio_c is set and <= 1.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages  # [N, 1] or [N, T]
    adv = adv.to(logprobs.dtype)
    # the policy tokens, row i counted seq_weights[i] times: what the token-average diagnostics average over
    w_mask = mask.to(logprobs.dtype)
    if seq_weights is not None:
        w_mask = w_mask * seq_weights.to(device=w_mask.device, dtype=w_mask.dtype).unsqueeze(-1)  # [N, T]
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # [N, T]
    ratio = log_ratio.exp()  # [N, T]
    unclipped = -adv * ratio  # [N, T]
    clipped = -adv * ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high)  # [N, T]
    per_token = torch.maximum(unclipped, clipped)  # [N, T]
    clip_taken = (clipped > unclipped).float()  # [N, T]
    dual_taken = torch.zeros_like(per_token)
    if clip_ratio_c is not None:
        bound = -adv * clip_ratio_c  # [N, T] (positive where adv < 0)
        dual = torch.minimum(per_token, bound)
        neg = (adv < 0).expand_as(per_token)
        dual_taken = (neg & (bound < per_token)).float()
        per_token = torch.where(neg, dual, per_token)
    loss = aggregate_loss(per_token, mask, reduction, seq_weights)
    m = w_mask.to(per_token.dtype)
    with torch.no_grad():
        approx_kl = masked_mean(ratio - 1.0 - log_ratio, m)  # k3 of KL(old || new)
        diagnostics = {
            "clip_fraction": masked_mean(clip_taken, m),
            "dual_clip_fraction": masked_mean(dual_taken, m),
            "approx_kl": approx_kl,
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": ratio[m > 0].max() if bool(m.any()) else ratio.new_tensor(1.0),
        }
    return loss, {k: v.detach() for k, v in diagnostics.items()}
