"""Shared-prefix logprobs: the G samples of a group run their common prompt once (``compute_logprobs_shared_prefix``;
same logprobs, entropies and gradients as rlkit.policy.logprobs.compute_logprobs within float32 rounding).

``shared_prefix_clusters`` finds the rows that share a prefix (same group, same tokens, same images); the
forward then runs a root prefix common to all clusters (a system prompt) once, each cluster's prefix once, and
every row's suffix on the prefix's KV cache, and reads the logprobs of the full sequences off the three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlkit.policy.batching import (
    SequenceBatch,
    SequenceLike,
    _common_prefix_len,
    _ids_list,
    _image_list,
    _pad_id,
    _vision_token_ids,
    model_config,
    sequence_batch,
)
from rlkit.policy.logprobs import _token_logprobs, banned_mask, compute_logprobs, tempered_log_probs
from rlkit.policy.lora import unwrap_model


@dataclass
class PrefixCluster:
    """Rows of a batch that share a prefix: ``rows`` (indices into the batch, >= 2 of them) share
    their first ``prefix_len`` tokens and the first ``num_prefix_images`` images (equal pixels and
    grids); every row has at least one token after the prefix."""

    rows: list[int]
    prefix_len: int
    num_prefix_images: int


def _image_runs(ids: list[int], image_token_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of <|image_pad|> tokens in ``ids`` (one run per image)."""
    runs, start = [], None
    for j, tok in enumerate(ids):
        if tok == image_token_id and start is None:
            start = j
        elif tok != image_token_id and start is not None:
            runs.append((start, j))
            start = None
    if start is not None:
        runs.append((start, len(ids)))
    return runs


def shared_prefix_clusters(
    sequences: Sequence[SequenceLike],
    image_token_id: int,
    group_keys: Sequence[object] | None = None,
    min_rows: int = 2,
) -> list[PrefixCluster]:
    """Find the rows whose forward can share a prefix.

    Rows with equal group keys (default: each sequence's ``group`` attribute, e.g.
    rlkit.rollout.Trajectory.group, the task index of the G samples; sequences without one all get
    the same key) are candidates; their shared prefix is their longest common token prefix, cut

    - to leave every row at least one token of its own (a row's first suffix token still needs
      its own logprob from the prefix's last logit, so the suffix forward is never empty),
    - before an image whose <|image_pad|> run the cut would split (an image is encoded whole),
    - before the first image that differs between the rows (pixels or grid), so equal token ids
      with different pictures are never shared.

    ``min_rows`` = 1 makes a cluster of a row alone too (its prefix: all of it but the last token,
    cut before an image as above), so that every row runs the prefix + suffix forwards: the same two
    model calls whatever the batch holds, which FSDP ranks need (rlkit.distributed.update).

    Returns: one PrefixCluster per candidate set with >= min_rows rows and a non-empty prefix, in order
    of first row; rows in no cluster run the plain full-sequence forward.
    """
    ids = [_ids_list(s.input_ids) for s in sequences]
    if group_keys is None:
        group_keys = [getattr(s, "group", None) for s in sequences]
    if len(group_keys) != len(ids):
        raise ValueError(f"group_keys has {len(group_keys)} entries for {len(ids)} sequences")
    by_key: dict[object, list[int]] = {}
    for i, key in enumerate(group_keys):
        by_key.setdefault(key, []).append(i)
    clusters = []
    for rows in by_key.values():
        if len(rows) < min_rows:
            continue
        rep = ids[rows[0]]
        p = min(len(ids[r]) for r in rows) - 1
        for r in rows[1:]:
            p = min(p, _common_prefix_len(rep, ids[r]))
        runs = _image_runs(rep, image_token_id)
        n_img = 0
        for start, end in runs:
            if end > p:  # the cut splits this image (start < p) or the image lies after it
                p = min(p, start)
                break
            n_img += 1
        if n_img:
            images = [_image_list(sequences[r]) for r in rows]
            for j in range(n_img):
                pv0, g0 = images[0][j]
                if not all(torch.equal(g0, im[j][1]) and (pv0 is im[j][0] or torch.equal(pv0, im[j][0]))
                           for im in images[1:]):
                    p, n_img = runs[j][0], j
                    break
        if p >= 1:
            clusters.append(PrefixCluster(rows=list(rows), prefix_len=p, num_prefix_images=n_img))
    return clusters


def forward_images(sequences: Sequence[SequenceLike], image_token_id: int) -> tuple[bool, bool]:
    """Whether the two forwards of compute_logprobs_shared_prefix(uniform_forwards=True) on
    ``sequences`` carry images: (prefix forward, suffix forward). The vision tower runs in a forward
    only when it does, so FSDP ranks must agree on both before they share prefixes."""
    clusters = shared_prefix_clusters(sequences, image_token_id, min_rows=1)
    prefix = any(c.num_prefix_images > 0 for c in clusters)
    suffix = any(len(_image_list(sequences[r])) > c.num_prefix_images for c in clusters for r in c.rows)
    return prefix, suffix


def _cat_images(images: list[tuple[torch.Tensor, torch.Tensor]], device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not images:
        return None, None
    return (torch.cat([pv for pv, _ in images], 0).to(device=device, dtype=torch.float32),
            torch.cat([g for _, g in images], 0).long().to(device))


#: A root prefix shorter than this (tokens) is not worth its own forward.
MIN_ROOT_PREFIX = 16


def _root_prefix_len(batch: SequenceBatch, clusters: list["PrefixCluster"], vision_ids: set[int]) -> int:
    """R, the token prefix every cluster's prefix shares, cut before its first image or video placeholder
    and leaving every cluster at least one prefix token of its own; 0 for fewer than 2 clusters or
    R < MIN_ROOT_PREFIX. Text only, so its mrope positions are 0..R-1 in every row, and one forward of
    it can feed every cluster's prefix forward (the system prompt of a batch of VisGym tasks: 90 of
    their 159 prompt tokens)."""
    if len(clusters) < 2:
        return 0
    reps = [c.rows[0] for c in clusters]
    cut = min(c.prefix_len for c in clusters) - 1
    if cut < MIN_ROOT_PREFIX:
        return 0
    ids = batch.input_ids[reps, :cut]  # [C, cut]
    same = (ids == ids[:1]).all(dim=0)  # [cut]
    vision = torch.zeros_like(same)
    for v in vision_ids:
        vision |= ids[0] == v
    stop = ~same | vision
    r = int(stop.nonzero()[0]) if bool(stop.any()) else cut
    return r if r >= MIN_ROOT_PREFIX else 0


def shared_prefix_unsupported(model: nn.Module) -> str | None:
    """Why the shared-prefix forward cannot run on ``model`` (None if it can).

    Gradient checkpointing in training mode drops the KV cache the suffix forward needs
    (transformers' GradientCheckpointingLayer sets ``past_key_values=None``).
    """
    hf = unwrap_model(model)
    if getattr(hf, "is_gradient_checkpointing", False) and hf.training:
        return "gradient checkpointing drops the KV cache in training mode"
    return None


def compute_logprobs_shared_prefix(
    model: nn.Module,
    sequences: Sequence[SequenceLike],
    temperature: float = 1.0,
    banned_token_ids: Sequence[int] | torch.Tensor | None = None,
    with_entropy: bool = True,
    group_keys: Sequence[object] | None = None,
    uniform_forwards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """compute_logprobs, with each group's shared prefix computed once (same outputs, fewer FLOPs).

    The PrefixClusters (shared_prefix_clusters: the G samples of a task and their longest common
    token prefix with the same images; at least the first turn's prompt) run in two forwards:

    1. prefix forward: each cluster's prefix (and its images) once, [C, P_max] right-padded, with
       the mrope positions of the full sequence sliced to the prefix, ``use_cache=True``, with
       gradients;
    2. the KV cache is repeated to each cluster's rows (``Tensor.expand`` for one cluster, expand and
       reshape for several of one size, ``index_select`` otherwise: autograd sums the rows' gradients
       back into the one prefix computation, so gradients are exact);
    3. suffix forward: all clustered rows' suffixes [n, S_max] right-padded with that cache, an
       attention mask [n, P_max + S_max] of the row's own prefix (the prefix padding masked) and its
       suffix, the full sequences' mrope positions sliced to the suffix (Qwen3-VL's positions after
       an image are not the token index, so they cannot be recomputed from the suffix alone), and
       the suffixes' own images (later turns of a multi-turn episode);
    4. logprobs: prefix positions once per cluster (targets inside the prefix are the same for every
       row), each row's first suffix token from the prefix's last logit, the rest from the suffix logits.

    Rows in no cluster run compute_logprobs' plain forward together; with ``uniform_forwards`` every
    row is in a cluster (a row alone too: shared_prefix_clusters' ``min_rows=1``), so the model runs
    exactly the prefix and the suffix forward, as every FSDP rank must. Positions and the attention
    mask follow transformers' Qwen3-VL (``Qwen3VLTextModel.forward``: 3-axis position_ids are used
    as given; ``create_causal_mask`` offsets the causal mask by the cache length).

    Args / Returns: as compute_logprobs, with ``sequences`` a list (not a SequenceBatch: the images
    are needed per sequence) and ``group_keys`` as in shared_prefix_clusters. logprobs [N, T] and
    entropy [N, T] float32 equal compute_logprobs' within float32 rounding
    (tests/policy/test_shared_prefix.py).

    Raises: ValueError as sequence_batch; RuntimeError from shared_prefix_unsupported's cases.
    """
    if isinstance(sequences, SequenceBatch):
        raise TypeError("compute_logprobs_shared_prefix needs the sequences (with their images), not a SequenceBatch")
    why = shared_prefix_unsupported(model)
    if why is not None:
        raise RuntimeError(f"shared-prefix forward unavailable: {why}; use compute_logprobs (algorithm.shared_prefix=false)")
    cfg = model_config(model)
    batch = sequence_batch(model, sequences, padding_side="right", with_pixels=False)  # validates; mrope positions of the full rows
    n, t = batch.input_ids.shape
    device = batch.input_ids.device
    clusters = shared_prefix_clusters(sequences, int(cfg.image_token_id), group_keys,
                                      min_rows=1 if uniform_forwards else 2)
    in_cluster = {r for c in clusters for r in c.rows}
    lp_rows: list[torch.Tensor | None] = [None] * n
    ent_rows: list[torch.Tensor | None] = [None] * n

    plain = [i for i in range(n) if i not in in_cluster]
    if plain:
        lp, ent = compute_logprobs(model, [sequences[i] for i in plain], temperature, banned_token_ids, with_entropy)
        for j, i in enumerate(plain):
            lp_rows[i] = F.pad(lp[j], (0, t - lp.shape[1]))
            if with_entropy:
                ent_rows[i] = F.pad(ent[j], (0, t - ent.shape[1]))

    if clusters:
        # 0. the clusters' common text prefix (a system prompt), once, when there is one: [1, R]
        r_len = 0 if uniform_forwards else _root_prefix_len(batch, clusters, _vision_token_ids(cfg))
        root_logits, root_cache = _root_forward(model, batch, clusters, r_len) if r_len else (None, None)
        pre = _prefix_forward(model, batch, sequences, clusters, r_len, root_cache)  # 1. logits [C, P_max - R, V]
        banned = banned_mask(banned_token_ids, pre.logits.shape[-1], device)
        rows = [r for c in clusters for r in c.rows]  # the suffix batch's rows, cluster by cluster
        owner = [ci for ci, c in enumerate(clusters) for _ in c.rows]
        cache = _repeat_cache(model, pre.past_key_values, clusters, owner, device)  # 2.
        suf_logits = _suffix_forward(model, batch, sequences, clusters, rows, owner, cache)  # 3. [n, S_max, V]
        _cluster_logprobs(batch, clusters, root_logits, r_len, pre.logits, suf_logits, banned, temperature,
                          with_entropy, lp_rows, ent_rows)  # 4.
    logprobs = torch.stack(lp_rows)  # [N, T]
    entropy = torch.stack(ent_rows) if with_entropy else None  # [N, T]
    return logprobs, entropy


def _root_forward(model: nn.Module, batch: SequenceBatch, clusters: list[PrefixCluster],
                  r_len: int) -> tuple[torch.Tensor, object]:
    """Step 0 of compute_logprobs_shared_prefix: the root prefix (``r_len`` = R > 0 tokens every cluster's prefix
    shares, _root_prefix_len) in one forward. Returns its logits [R, V] and its KV cache (a DynamicCache) expanded to
    the C clusters, [C, H_kv, R, D] per layer (a view: autograd sums the clusters' gradients back into it)."""
    from transformers import DynamicCache

    c_n, device = len(clusters), batch.input_ids.device
    rep0 = clusters[0].rows[0]  # the root's tokens are every cluster's; read them from this row
    root = model(input_ids=batch.input_ids[rep0 : rep0 + 1, :r_len],
                 attention_mask=torch.ones((1, r_len), dtype=torch.long, device=device),
                 position_ids=batch.position_ids[:, rep0 : rep0 + 1, :r_len], use_cache=True)
    root_logits = root.logits[0]  # [R, V]
    root_cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(c_n, -1, -1, -1), layer.values.expand(c_n, -1, -1, -1))
                                              for layer in root.past_key_values.layers],  # [C, H_kv, R, D]
                              config=unwrap_model(model).config)
    return root_logits, root_cache


def _prefix_forward(model: nn.Module, batch: SequenceBatch, sequences: Sequence[SequenceLike],
                    clusters: list[PrefixCluster], r_len: int, root_cache: object | None):
    """Step 1 of compute_logprobs_shared_prefix: one prefix forward for all C clusters, [C, P_max - R] after the
    root's cache (R = ``r_len``, 0 without a root), right-padded (padding masked out), with the full sequences' mrope
    positions sliced to the prefix and the prefixes' images. Returns the model output: logits [C, P_max - R, V] and
    past_key_values [C, H_kv, P_max, D] per layer."""
    device = batch.input_ids.device
    c_n, p_max = len(clusters), max(c.prefix_len for c in clusters)
    pre_ids = torch.full((c_n, p_max - r_len), _pad_id(model_config(model)), dtype=torch.long,
                         device=device)  # [C, P_max - R]
    pre_mask = torch.zeros((c_n, p_max), dtype=torch.long, device=device)  # [C, P_max]: root + own tokens
    pre_pos = torch.zeros((3, c_n, p_max - r_len), dtype=torch.long, device=device)  # [3, C, P_max - R]
    pre_images = []
    for ci, c in enumerate(clusters):
        rep, p = c.rows[0], c.prefix_len
        pre_ids[ci, : p - r_len] = batch.input_ids[rep, r_len:p]
        pre_mask[ci, :p] = 1
        pre_pos[:, ci, : p - r_len] = batch.position_ids[:, rep, r_len:p]  # the full sequence's positions, sliced
        pre_images += _image_list(sequences[rep])[: c.num_prefix_images]
    pv, thw = _cat_images(pre_images, device)
    return model(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos, pixel_values=pv,
                 image_grid_thw=thw, past_key_values=root_cache, use_cache=True)  # cache: [C, H_kv, P_max, D]


def _repeat_cache(model: nn.Module, prefix_cache, clusters: list[PrefixCluster], owner: list[int], device) -> object:
    """Step 2 of compute_logprobs_shared_prefix: the prefix forward's KV cache repeated to each cluster's rows
    (``owner``: the cluster of each suffix row), as a DynamicCache of [n, H_kv, P_max, D] per layer; a view when
    there is one cluster. Autograd sums the rows' gradients back into the one prefix computation."""
    from transformers import DynamicCache

    c_n = len(clusters)
    sizes = {len(c.rows) for c in clusters}
    if c_n == 1:
        kv = [(layer.keys.expand(len(owner), -1, -1, -1), layer.values.expand(len(owner), -1, -1, -1))
              for layer in prefix_cache.layers]  # [n, H_kv, P, D]
    elif len(sizes) == 1:  # clusters of one size m: [C, 1, ...] -> [C, m, ...] -> [C*m, ...]; the backward
        # is a sum over the m copies, where index_select's scatters rows into a zeroed buffer (its scatter_add
        # alone was 31 ms of a 0.77 s fp32 update in bench_vs_trl's workload)
        m = sizes.pop()

        def repeat(x: torch.Tensor) -> torch.Tensor:
            return x[:, None].expand(-1, m, -1, -1, -1).reshape(c_n * m, *x.shape[1:])

        kv = [(repeat(layer.keys), repeat(layer.values)) for layer in prefix_cache.layers]  # [n, H_kv, P_max, D]
    else:
        own = torch.tensor(owner, device=device)
        kv = [(layer.keys.index_select(0, own), layer.values.index_select(0, own))
              for layer in prefix_cache.layers]  # [n, H_kv, P_max, D]
    return DynamicCache(ddp_cache_data=kv, config=unwrap_model(model).config)


def _suffix_forward(model: nn.Module, batch: SequenceBatch, sequences: Sequence[SequenceLike],
                    clusters: list[PrefixCluster], rows: list[int], owner: list[int], cache: object) -> torch.Tensor:
    """Step 3 of compute_logprobs_shared_prefix: one suffix forward of the clustered ``rows`` (``owner``: each
    one's cluster), [n, S_max] right-padded after ``cache`` (_repeat_cache), with an attention mask
    [n, P_max + S_max] of the row's own prefix and its suffix, the full sequences' mrope positions sliced to the
    suffix, and the suffixes' own images. Returns the logits [n, S_max, V]."""
    device = batch.input_ids.device
    pad, p_max = _pad_id(model_config(model)), max(c.prefix_len for c in clusters)
    s_max = max(batch.lengths[r] - clusters[ci].prefix_len for r, ci in zip(rows, owner))
    suf_ids = torch.full((len(rows), s_max), pad, dtype=torch.long, device=device)  # [n, S_max]
    suf_mask = torch.zeros((len(rows), p_max + s_max), dtype=torch.long, device=device)  # [n, P_max + S_max]
    suf_pos = torch.zeros((3, len(rows), s_max), dtype=torch.long, device=device)  # [3, n, S_max]
    suf_images = []
    for j, (r, ci) in enumerate(zip(rows, owner)):
        p = clusters[ci].prefix_len
        s_r = batch.lengths[r] - p
        suf_ids[j, :s_r] = batch.input_ids[r, p : p + s_r]
        suf_mask[j, :p] = 1
        suf_mask[j, p_max : p_max + s_r] = 1
        suf_pos[:, j, :s_r] = batch.position_ids[:, r, p : p + s_r]
        suf_images += _image_list(sequences[r])[clusters[ci].num_prefix_images :]
    pv, thw = _cat_images(suf_images, device)
    suf = model(input_ids=suf_ids, attention_mask=suf_mask, position_ids=suf_pos, past_key_values=cache,
                pixel_values=pv, image_grid_thw=thw, use_cache=True)
    return suf.logits  # [n, S_max, V]


def _cluster_logprobs(batch: SequenceBatch, clusters: list[PrefixCluster], root_logits: torch.Tensor | None,
                      r_len: int, pre_logits: torch.Tensor, suf_logits: torch.Tensor, banned: torch.Tensor,
                      temperature: float, with_entropy: bool, lp_rows: list, ent_rows: list) -> None:
    """Step 4 of compute_logprobs_shared_prefix: each clustered row's logprobs (and entropies) [T] into
    ``lp_rows`` / ``ent_rows``, from the root's logits [R, V] (``r_len`` = R; None and 0 without a root), the
    prefix forward's [C, P_max - R, V] and the suffix forward's [n, S_max, V] (rows cluster by cluster). Prefix
    positions 0..P-2 predict the shared tokens 1..P-1 (once per cluster; the root's 0..R-2 once for all); position
    P-1 predicts each row's first suffix token; suffix positions the rest."""
    t, device = batch.input_ids.shape[1], batch.input_ids.device
    # rows by unbind, not by indexing: see compute_logprobs (one gradient buffer, not one per row)
    pre_rows, suf_rows = pre_logits.unbind(0), suf_logits.unbind(0)
    if r_len:
        rep0 = clusters[0].rows[0]  # the root's tokens, as _root_forward read them
        lp_root, ent_root = _token_logprobs(root_logits[: r_len - 1], batch.input_ids[rep0, 1:r_len], banned,
                                            temperature, with_entropy)
    j = 0
    for ci, c in enumerate(clusters):
        rep, p = c.rows[0], c.prefix_len
        # the cluster's prefix logits at positions R-1..P-1: the root's last, then its own forward's
        own = pre_rows[ci][: p - r_len]
        own = own if not r_len else torch.cat([root_logits[r_len - 1 :], own])
        logp_last = tempered_log_probs(own[-1], banned, temperature)  # [V]
        lp_pre, ent_pre = _token_logprobs(own[:-1], batch.input_ids[rep, max(r_len, 1) : p], banned, temperature,
                                          with_entropy)  # [P-1-max(R-1, 0)]
        if r_len:
            lp_pre = torch.cat([lp_root, lp_pre])  # [P-1]
            ent_pre = torch.cat([ent_root, ent_pre]) if with_entropy else None
        if with_entropy:
            ent_last = -(logp_last.exp() * logp_last.masked_fill(banned, 0.0)).sum(-1, keepdim=True)  # [1]
        for r in c.rows:
            length = batch.lengths[r]
            first_t = batch.input_ids[r, p : p + 1]  # [1]
            lp_first = torch.where(banned[first_t], torch.zeros(1, device=device), logp_last[first_t])  # [1]
            lp_suf, ent_suf = _token_logprobs(suf_rows[j][: length - p - 1], batch.input_ids[r, p + 1 : length],
                                              banned, temperature, with_entropy)  # [L - P - 1]
            lp_rows[r] = F.pad(torch.cat([lp_pre, lp_first, lp_suf]), (1, t - length))
            if with_entropy:
                ent_rows[r] = F.pad(torch.cat([ent_pre, ent_last, ent_suf]), (1, t - length))
            j += 1
