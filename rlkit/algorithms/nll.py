"""Supervised terms: the teacher-forced negative log-likelihood of demonstrated tokens, and the auxiliary
terms an update adds to its GRPO loss.

An auxiliary term (``AuxTerm``) is a named list of sequences with a coefficient: the update adds
``coef x`` their mean NLL per demonstrated token to its first optimizer step and logs it as
``<name>/nll``. The demonstration loss of ReLIFT (Ma et al. 2025, "Learning What Reinforcement Learning
Can't": the solver's demonstrations of the tasks whose whole group failed) is one; a new term is one more
entry in the list the recipe passes, and neither update (rlkit.update, rlkit.distributed.update) changes.

Shapes: logprobs [n, T] float32; masks [n, T] 0/1 float32 (1 on the demonstrated tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AuxTerm:
    """One auxiliary supervised term of a GRPO update.

    name: the metric namespace (``<name>/nll`` is logged, nats per token, measured before the step).
    coef: its weight in the loss (> 0). sequences: the trajectories whose loss-mask-1 tokens it teaches
    (e.g. rlkit.demonstrations.demonstration_trajectory's).
    """

    name: str
    coef: float
    sequences: list[Any] = field(default_factory=list)


def active_terms(terms: list[AuxTerm] | None) -> list[AuxTerm]:
    """The terms that add something: a positive coefficient and at least one sequence."""
    return [t for t in (terms or []) if t.coef > 0 and t.sequences]


def batch_shares_prefix(policy: Any) -> bool:
    """Whether a supervised batch runs the shared-prefix forward (rlkit.policy.shared_prefix): every
    demonstration is encoded with ``group=0``, so the batch's common prefix (the system prompt, ~90
    of ~210 tokens for the VisGym maze) is computed once. Exact within float32 rounding; off where the
    model does not support it (gradient checkpointing)."""
    from rlkit.policy.shared_prefix import shared_prefix_unsupported  # local: rlkit.policy imports transformers

    return shared_prefix_unsupported(policy.model) is None


def demonstration_nll(policy: Any, demonstrations: list[Any], shared_prefix: bool | None = None) -> torch.Tensor:
    """Teacher-forced negative log-likelihood of demonstrations under the policy, with gradient.

    Args: demonstrations (n trajectories; loss mask 1 on the demonstrated tokens), shared_prefix: run the
        batch's common prefix once (``batch_shares_prefix``; None = when the model supports it). Logprobs of
        the untempered policy (temperature 1).
    Returns: scalar, the mean over every demonstrated token of the batch (nats per token).
    Raises: ValueError for an empty list.
    """
    if not demonstrations:
        raise ValueError("demonstration_nll needs at least one demonstration")
    if shared_prefix is None:
        shared_prefix = batch_shares_prefix(policy)
    logprobs, _ = policy.logprobs(demonstrations, temperature=1.0, with_entropy=False,
                                  shared_prefix=shared_prefix)  # [n, T]
    mask = torch.zeros_like(logprobs)  # [n, T]
    for i, t in enumerate(demonstrations):
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
