"""Training-side log-probabilities of token sequences, matching the sampler exactly.

Quantity (the same one rlkit.policy.engine samples with and reports):

    logprob[n, t] = log_softmax((logits[n, t-1] + ban) / tau)[input_ids[n, t]]

with ``ban`` = -inf on the banned token ids (vision placeholders, <|im_start|>, pad, ids beyond the
tokenizer) and 0 elsewhere, and tau the sampling temperature (tau = 1 for greedy, temperature 0).
This is log pi(token | prefix) of the distribution the engine draws from *before* top-p / top-k
truncation (vLLM's and verl's convention for the sampling logprobs of tempered sampling).
Entropy is that distribution's entropy (nats). The sequences are collated by rlkit.policy.batching
(``sequence_batch``, ``SequenceBatch``: importable from here too), whose Qwen-VL multimodal rotary positions
(mrope) give padded batches the positions of unpadded sequences. The same quantity with each group's shared
prefix computed once: rlkit.policy.shared_prefix.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlkit.policy.batching import SequenceBatch, SequenceLike, sequence_batch


def banned_mask(banned_token_ids: Sequence[int] | torch.Tensor | None, vocab_size: int, device) -> torch.Tensor:
    """Bool [V] mask, True on banned ids."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    if banned_token_ids is not None and len(banned_token_ids) > 0:
        idx = torch.as_tensor(list(banned_token_ids) if not isinstance(banned_token_ids, torch.Tensor) else banned_token_ids)
        mask[idx.to(device=device, dtype=torch.long)] = True
    return mask


def tempered_log_probs(logits: torch.Tensor, banned: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax((logits masked to -inf on ``banned``) / tau) in float32; tau = 1 when temperature <= 0.

    logits [..., V] (any float dtype); banned [V] bool. Returns [..., V] float32. Used by both the
    sampler and compute_logprobs, so the two compute the same function of the logits.
    """
    tau = float(temperature) if temperature and temperature > 0 else 1.0
    x = logits.float().masked_fill(banned, float("-inf"))
    if tau != 1.0:
        x = x / tau
    return torch.log_softmax(x, dim=-1)


def compute_logprobs(
    model: nn.Module,
    batch: SequenceBatch | Sequence[SequenceLike],
    temperature: float = 1.0,
    banned_token_ids: Sequence[int] | torch.Tensor | None = None,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities and entropies of whole sequences under ``model`` (one forward).

    Args:
        model: the policy model (plain, PEFT-wrapped or FSDP-sharded; called through its forward,
            so wrappers' hooks run). Put it in eval mode (or use dropout 0) for an exact match
            with the sampler.
        batch: a right-padded SequenceBatch or a list of sequences (collated with sequence_batch);
            sequences may hold several turns and several images.
        temperature: the sampling temperature; 0 (greedy) is treated as 1.
        banned_token_ids: the ids the sampler masked (``Policy.banned_token_ids``); must be the
            sampler's set, since masking changes the normalisation.
        with_entropy: also return the entropy.

    Returns:
        logprobs [N, T] float32: at t >= 1, log p(input_ids[t] | input_ids[:t]) of the tempered,
        banned-masked distribution; 0 at t = 0, on padding, and where the token itself is banned
        (image placeholders and other prompt-only tokens, which the loss mask excludes anyway).
        entropy [N, T] float32 (nats) of the same distribution at the same positions (0 at t = 0
        and on padding; at a banned target it is still the distribution's entropy), or None.
        Gradients flow when autograd is enabled.

    Follows: the sampling-logprob convention of rlkit.policy.engine (see module doc); the
    engine-vs-training agreement (<= 1e-4, fp32) is tested in tests/policy/test_logprobs.py.
    """
    if not isinstance(batch, SequenceBatch):
        batch = sequence_batch(model, batch, padding_side="right")
    out = model(**batch.model_inputs(), use_cache=False)
    logits = out.logits  # [N, T, V]
    v = logits.shape[-1]
    banned = banned_mask(banned_token_ids, v, logits.device)
    targets = batch.input_ids[:, 1:]  # [N, T-1]
    valid = batch.attention_mask[:, 1:].bool() & batch.attention_mask[:, :-1].bool()
    lp_rows, ent_rows = [], []
    # row by row: bounds the float32 [T, V] temporaries to one sequence. unbind, not logits[i]: indexing's
    # backward zero-fills a whole [N, T, V] buffer per row (N^2 work; 20% of a float32 warm-start step at N=32),
    # unbind's stacks the rows' gradients once. The gradients are the same numbers.
    for i, row in enumerate(logits[:, :-1].unbind(0)):
        lp, ent = _token_logprobs(row, targets[i], banned, temperature, with_entropy)  # [T-1]
        lp_rows.append(F.pad(torch.where(valid[i], lp, torch.zeros_like(lp)), (1, 0)))
        if with_entropy:
            ent_rows.append(F.pad(torch.where(valid[i], ent, torch.zeros_like(ent)), (1, 0)))
    logprobs = torch.stack(lp_rows)
    entropy = torch.stack(ent_rows) if with_entropy else None
    return logprobs, entropy


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor, banned: torch.Tensor, temperature: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprob of ``targets`` under the tempered, banned-masked distribution of ``logits``.

    logits [L, V] (position j predicts targets[j]); targets [L] long. Returns lp [L] float32 (0 where
    the target is banned) and entropy [L] float32 (nats) or None. Shared by compute_logprobs and
    compute_logprobs_shared_prefix so the two compute the same function of the logits.
    """
    logp = tempered_log_probs(logits, banned, temperature)  # [L, V]
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [L]
    lp = torch.where(~banned[targets], lp, torch.zeros_like(lp))
    if not with_entropy:
        return lp, None
    ent = -(logp.exp() * logp.masked_fill(banned, 0.0)).sum(-1)  # [L]
    return lp, ent
