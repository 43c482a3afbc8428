"""Attention for the tiny policy on CPU: small causal attention as a plain matmul-softmax-matmul.

PyTorch's CPU ``scaled_dot_product_attention`` (transformers' "sdpa" path) runs a flash-attention kernel
that is slow for the short query blocks of this project's workloads. Measured on this project's 2-core
CPU in bf16 (1 thread): a one-token decode query took 4.6 ms per layer call against 1.0 ms for the plain
product (1.4-2.3 ms in fp32), about half of a decode step; in the GRPO update (issue 15's workload, the
completions attending to their group's shared prompt) the kernel's forward and backward were a quarter of
the update's time (``bench/bench_vs_trl.py``, docs/speed.md).

So on CPU the policy registers ``rlkit_sdpa``: a causal self-attention call (the language model's; the
vision tower is not causal) whose score matrix is small (queries x keys <= ``MAX_SCORES`` per head)
runs as ``softmax(q k^T * scale + mask) v``, with autograd when training: the two products in the
inputs' dtype and the softmax in float32, as transformers' "eager" attention computes it. A long causal call
whose mask is a training batch's (causal after a shared prefix shorter than the call's own queries, right padding)
runs PyTorch's flash kernel with ``is_causal=True`` and no mask, which skips the masked score blocks the kernel
computes when given the mask. Everything else (other long sequences, where the score matrices the backward keeps
grow with the square of the length; the vision tower; dropout) calls transformers' own "sdpa" function unchanged. Masks are built as for
"sdpa"; without one, causality follows ``scaled_dot_product_attention(is_causal=True)`` (query i sees
keys 0..i).

Registered through transformers' documented extension points (``AttentionInterface.register`` and
``AttentionMaskInterface.register``, transformers "Attention Interface" docs); transformers' own "sdpa"
entry is not replaced, so other models in the process are untouched.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "rlkit_sdpa"

#: Largest queries x keys per head that take the plain path: the update's completions against their
#: shared prompt (~25 x 185), a 212-token warm-start demonstration (212 x 212) and decode steps fit; a
#: 6-turn episode's update (~1,185 x 1,185) goes to the flash kernel.
MAX_SCORES = 256 * 256

#: Score of a masked key: the float32 minimum, not -inf, so that a query with every key masked (a padding
#: position) gets finite, ignored outputs instead of NaN, which would reach other rows through 0 * NaN.
_MASKED = torch.finfo(torch.float32).min


def small_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention function (``AttentionInterface`` signature).

    Args:
        query: [B, H, Q, D]; key, value: [B, KVH, L, D] (grouped-query: H a multiple of KVH).
        attention_mask: None, bool [B, 1, Q, L] (True = attend) or additive float [B, 1, Q, L].
        scaling: softmax scale (default D ** -0.5).
        is_causal: None = the module's ``is_causal``; only used when ``attention_mask`` is None and Q > 1.

    Returns:
        (output [B, Q, H, D] in ``value``'s dtype, None), as transformers' ``sdpa_attention_forward``,
        which takes every call that is not causal, has dropout, or has Q x L > ``MAX_SCORES`` with a mask other
        than a training batch's (those run ``_causal_flash``; a padding row's output then differs, unread). A long
        call whose L - Q earlier keys outnumber its Q queries (a multi-turn rollout's new turn prefilled after the
        conversation's KV cache) takes "sdpa" with its mask too: ``_causal_flash`` computes about L x L / 2 scores
        there (it runs the prefix as zero query rows), the masked kernel Q x L.
    """
    b, h, q_len, d = query.shape
    kvh, length = key.shape[1], key.shape[2]
    causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
    if causal and not dropout and q_len * length > MAX_SCORES and length < 2 * q_len \
            and _right_padded_causal(attention_mask, q_len, length):
        return _causal_flash(query, key, value, scaling), None
    if dropout or not causal or q_len * length > MAX_SCORES:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    q = query.reshape(b, kvh, h // kvh * q_len, d)  # [B, KVH, G*Q, D]: the G query heads of a KV head
    scores = (q @ key.transpose(-1, -2)).float() * (scaling if scaling is not None else d**-0.5)
    scores = scores.view(b, kvh, h // kvh, q_len, length)  # [B, KVH, G, Q, L]
    if attention_mask is not None:
        mask = attention_mask[:, :, -q_len:, :length].unsqueeze(1)  # [B, 1, 1, Q, L]
        scores = (scores.masked_fill(~mask, _MASKED) if mask.dtype == torch.bool
                  else scores + mask.float().clamp(min=_MASKED))
    elif causal and q_len > 1:
        visible = torch.ones(q_len, length, dtype=torch.bool, device=scores.device).tril()  # as SDPA's is_causal
        scores = scores.masked_fill(~visible, _MASKED)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(b, kvh, h // kvh * q_len, length)
    out = (probs @ value).view(b, h, q_len, d)  # [B, H, Q, D]
    return out.transpose(1, 2).contiguous(), None  # [B, Q, H, D], value's dtype


def _right_padded_causal(mask: torch.Tensor | None, q_len: int, length: int) -> bool:
    """Whether ``mask`` (bool [B, 1, Q, L], True = attend) is exactly causal attention aligned to the last key
    (query i sees keys 0..L-Q+i: a prefix of L-Q keys run earlier, then the queries' own tokens) with each row's
    real keys a prefix of the L positions (right padding): what rlkit's training batches build. Costs one
    comparison over the mask (~1% of the attention it saves)."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or \
            mask.shape[2] != q_len or mask.shape[3] != length or length < q_len:
        return False
    keys = mask[:, 0, -1, :]  # [B, L]: the last query sees every real key
    n = keys.sum(-1)  # [B] real keys a row
    if not torch.equal(keys, torch.arange(length, device=mask.device)[None, :] < n[:, None]):
        return False  # not right padding
    causal = torch.ones(q_len, length, dtype=torch.bool, device=mask.device).tril(length - q_len)  # [Q, L]
    return torch.equal(mask[:, 0], causal[None] & keys[:, None, :])


def _causal_flash(query, key, value, scaling):
    """Causal attention through PyTorch's flash kernel with ``is_causal=True``, which skips the masked half of the
    score blocks (with an explicit mask it computes all of them): exact, for a ``_right_padded_causal`` mask, on
    every query row whose key is real (a padding row's output differs; nothing real reads it: later positions of
    its row are padding too, and the loss masks it). The L-Q prefix keys get L-Q zero query rows in front, so the
    kernel's top-left causal alignment sees what the mask does. query [B, H, Q, D], key/value [B, KVH, L, D];
    returns [B, Q, H, D] in value's dtype."""
    q_len, length = query.shape[2], key.shape[2]
    rep = query.shape[1] // key.shape[1]
    if rep > 1:  # grouped-query: each KV head serves `rep` consecutive query heads (transformers' repeat_kv)
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    if length > q_len:
        query = torch.cat([query.new_zeros(*query.shape[:2], length - q_len, query.shape[3]), query], dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out[:, :, length - q_len:].transpose(1, 2).contiguous()


def register() -> str:
    """Register ``rlkit_sdpa`` with transformers (idempotent); returns its name for ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, small_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
