"""Reuse of the frozen vision tower's outputs: an image encoded once is not encoded again.

With LoRA on the language model (the default; ``lora.include_vision`` false) the vision tower is frozen, so an
image's features depend only on its pixels. A GRPO step encodes each of its B images in the rollout's prefill
and then again in every forward of the update (the shared-prefix forward runs each group's image once per
micro-batch). ``VisionFeatureCache`` wraps the model's ``get_image_features`` (transformers' Qwen3-VL:
``Qwen3VLModel.get_image_features``, called by its forward with the batch's ``pixel_values`` and
``image_grid_thw``) and keeps, per image, the merged features (``pooler_output``) and the deepstack features
the forward reads; an image seen before (equal grid and pixels, compared exactly) takes its kept features, the
others are encoded together in one call of the tower, as before.

Exactness: the tower encodes each image separately (per-image attention through ``cu_seqlens``; the linear
layers act row by row), so kept features are the ones a fresh call computes (bitwise here, fp32 and bf16; a
BLAS whose rounding depended on the batch's row count would differ within rounding), as long as the tower's
weights are the ones that made them. The cache is bypassed while any vision parameter requires grad (full
fine-tuning, ``lora.include_vision``: the features need their graph) or is sharded (FSDP's DTensors), and
emptied whenever a vision parameter changed (its in-place version counter or storage moved: an optimizer
step, ``load_state_dict``, a new adapter that reaches the tower). tests/policy/test_vision_cache.py checks
that logprobs and gradients with it equal those without it.

Measured (bf16, 1 thread, bench_vs_trl's issue 15 workload): the tower's patch embedding (a Conv3d, slow on
CPU in bf16) and blocks were ~10% of a GRPO step, about half of it in the update.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class VisionFeatureCache:
    """Wraps ``inner.get_image_features`` of a Qwen3-VL model (``inner``: the module owning ``visual`` and
    ``get_image_features``) with a per-image cache of at most ``max_bytes`` of kept pixels and features.

    Attributes: hits, misses (images served from the cache / encoded), enabled (False: pass-through).
    """

    def __init__(self, inner: nn.Module, max_bytes: int = 256 << 20) -> None:
        self.inner = inner
        self.visual = inner.visual
        self.max_bytes = int(max_bytes)
        self.enabled = True
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple, list] = OrderedDict()  # key -> [(pixels, features), ...]
        self._bytes = 0
        self._signature: tuple | None = None
        self._deep_per_image = False  # the wrapped method's deepstack layout (see get_image_features)
        self._orig = inner.get_image_features
        inner.get_image_features = self.get_image_features

    # -------------------------------------------------------------------------------------- bookkeeping
    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _weights_signature(self) -> tuple | None:
        """None when the tower trains (bypass); else what changes whenever a vision weight does."""
        sig = []
        for p in self.visual.parameters():
            if p.requires_grad or type(p.data) is not torch.Tensor:  # trains, or sharded (an FSDP DTensor)
                return None
            sig.append((p._version, p.data_ptr()))
        return tuple(sig)

    @staticmethod
    def _key(pixels: torch.Tensor, grid: torch.Tensor) -> tuple:
        # a cheap fingerprint to find candidates; equality is then checked on the pixels themselves
        return (tuple(grid.tolist()), tuple(pixels.shape), pixels.dtype, float(pixels.sum()),
                float(pixels[:, :: max(1, pixels.shape[1] // 7)].sum()))

    def _find(self, key: tuple, pixels: torch.Tensor):
        for kept, feats in self._entries.get(key, ()):
            if kept is pixels or torch.equal(kept, pixels):
                self._entries.move_to_end(key)
                return feats
        return None

    def _add(self, key: tuple, pixels: torch.Tensor, feats: tuple) -> None:
        with torch.inference_mode(False):  # plain tensors, usable in a later autograd forward
            kept = pixels.detach().clone()
            feats = tuple(f.detach().clone() for f in feats)
        size = sum(t.numel() * t.element_size() for t in (kept, *feats))
        if size > self.max_bytes:
            return
        self._entries.setdefault(key, []).append((kept, feats))
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= sum(t.numel() * t.element_size() for kept_, fs in old for t in (kept_, *fs))

    # ------------------------------------------------------------------------------------------ the call
    def get_image_features(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None = None, **kwargs):
        """``Qwen3VLModel.get_image_features`` with kept per-image outputs.

        pixel_values [sum P_i, D]; image_grid_thw [n, 3]. Returns what the wrapped method returns
        (``BaseModelOutputWithDeepstackFeatures``: ``pooler_output`` a tuple of per-image features
        [P_i / merge^2, H], ``deepstack_features`` one entry per deepstack layer: [sum P_i / merge^2, H] in
        transformers 5.8, a tuple of per-image [P_i / merge^2, H] in 5.19 (vLLM's .venv-vllm); the kept
        outputs follow the layout the wrapped method gave); ``last_hidden_state`` is None when any image came
        from the cache (the forward does not read it).
        """
        sig = self._weights_signature() if self.enabled else None
        if sig is None or image_grid_thw is None or kwargs.get("return_dict") is False:
            return self._orig(pixel_values, image_grid_thw, **kwargs)
        if sig != self._signature:
            self.clear()
            self._signature = sig
        grids = image_grid_thw.reshape(-1, 3)
        sizes = grids.prod(-1).tolist()
        pieces = torch.split(pixel_values, sizes, 0)
        keys = [self._key(p, g) for p, g in zip(pieces, grids)]
        found = [self._find(k, p) for k, p in zip(keys, pieces)]
        missing = [i for i, f in enumerate(found) if f is None]
        uniq: list[int] = []  # the distinct images among the missing ones (a batch may repeat an image)
        rep = {}
        for i in missing:
            rep[i] = next((u for u in uniq if keys[u] == keys[i] and
                           (pieces[u] is pieces[i] or torch.equal(pieces[u], pieces[i]))), i)
            if rep[i] == i:
                uniq.append(i)
        self.hits += len(found) - len(uniq)
        self.misses += len(uniq)
        if len(uniq) == len(found):  # nothing kept, no repeats: the plain call, then keep its images
            out = self._orig(pixel_values, image_grid_thw, **kwargs)
            self._keep(out, uniq, keys, pieces, grids)
            return out
        if uniq:
            sub_pv = torch.cat([pieces[i] for i in uniq], 0)
            out = self._orig(sub_pv, grids[uniq], **kwargs)
            fresh = dict(zip(uniq, self._keep(out, uniq, keys, pieces, grids)))
            for i in missing:
                found[i] = fresh[rep[i]]
        merged = [f[0] for f in found]  # per image [P_i / merge^2, H]
        n_deep = len(found[0]) - 1
        if self._deep_per_image:
            deep = [tuple(f[1 + d] for f in found) for d in range(n_deep)]
        else:
            deep = [torch.cat([f[1 + d] for f in found], 0) for d in range(n_deep)]
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return BaseModelOutputWithDeepstackFeatures(last_hidden_state=None, pooler_output=tuple(merged),
                                                    deepstack_features=deep)

    def _keep(self, out, idx: list[int], keys, pieces, grids) -> list[tuple]:
        """Split a fresh output over its images ``idx`` (in order), keep them, return each image's features."""
        merge = int(self.visual.spatial_merge_size) ** 2
        counts = [int(grids[i].prod()) // merge for i in idx]
        layers = list(out.deepstack_features or [])
        self._deep_per_image = any(isinstance(d, (tuple, list)) for d in layers)
        deep = [tuple(d) if isinstance(d, (tuple, list)) else torch.split(d, counts, 0) for d in layers]
        feats = [(out.pooler_output[j], *(d[j] for d in deep)) for j in range(len(idx))]
        for i, f in zip(idx, feats):
            if not any(t.requires_grad for t in f):
                self._add(keys[i], pieces[i], f)
        return feats


def install_vision_cache(model: nn.Module, max_bytes: int = 256 << 20) -> VisionFeatureCache | None:
    """Install a VisionFeatureCache on the Qwen3-VL module of ``model`` (under any PEFT wrapper) that owns
    ``visual`` and ``get_image_features``; returns it, or None when the model has none (idempotent)."""
    from rlkit.policy.lora import unwrap_model

    hf = unwrap_model(model)
    for inner in (getattr(hf, "model", None), hf):
        if inner is not None and hasattr(inner, "visual") and hasattr(inner, "get_image_features"):
            existing = getattr(inner.get_image_features, "__self__", None)
            if isinstance(existing, VisionFeatureCache):
                return existing
            return VisionFeatureCache(inner, max_bytes=max_bytes)
    return None
