"""Attention for CPU decoding: one-token queries without gradients take a plain matmul-softmax-matmul.

PyTorch's CPU ``scaled_dot_product_attention`` (transformers' "sdpa" path) runs a flash-attention kernel
that is slow for a single query row: measured on this project's 2-core CPU, 4.6 ms per layer call in bf16
against 1.0 ms for the plain product (1.4-2.3 ms in fp32), about half of a bf16 decode step
(``scripts/bench_vs_trl.py``, README Speed). Decode steps are exactly that case, so on CPU the policy
registers ``rlkit_sdpa``: decode queries (query length 1, no autograd) take the plain path, computed in
float32 (so bf16 inputs lose nothing to it); everything else (prefill, the update's forwards, the vision
tower) calls transformers' own "sdpa" function unchanged. Masks are built as for "sdpa".

Registered through transformers' documented extension points (``AttentionInterface.register`` and
``AttentionMaskInterface.register``, transformers "Attention Interface" docs); nothing of transformers'
own "sdpa" entry is replaced, so other models in the process are untouched.
"""

from __future__ import annotations

import torch

NAME = "rlkit_sdpa"


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention function (``AttentionInterface`` signature).

    Args:
        query: [B, H, Q, D]; key, value: [B, KVH, L, D] (grouped-query: H a multiple of KVH).
        attention_mask: None, bool [B, 1, Q, L] (True = attend) or additive float [B, 1, Q, L].
        scaling: softmax scale (default D ** -0.5).

    Returns:
        (output [B, Q, H, D] in ``value``'s dtype, None), as transformers' sdpa_attention_forward.
        Queries longer than one token, or any call with autograd on, or dropout, are passed to
        transformers' "sdpa" function with the same arguments.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or torch.is_grad_enabled() or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, h, _, d = query.shape
    kvh, length = key.shape[1], key.shape[2]
    q = query.reshape(b, kvh, h // kvh, d).float()  # [B, KVH, G, D]: the G query heads sharing one KV head
    scores = (q @ key.float().transpose(-1, -2)) * (scaling if scaling is not None else d**-0.5)  # [B, KVH, G, L]
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :length]  # [B, 1, 1, L]
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask.float())
    out = torch.softmax(scores, dim=-1) @ value.float()  # [B, KVH, G, D]
    return out.to(value.dtype).reshape(b, h, 1, d).transpose(1, 2).contiguous(), None  # [B, 1, H, D]


def register() -> str:
    """Register ``rlkit_sdpa`` with transformers (idempotent); returns its name for ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, decode_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
