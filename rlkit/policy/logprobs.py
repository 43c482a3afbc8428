"""Training-side log-probabilities of token sequences, matching the sampler exactly.

Quantity (the same one rlkit.policy.engine samples with and reports):

    logprob[n, t] = log_softmax((logits[n, t-1] + ban) / tau)[input_ids[n, t]]

with ``ban`` = -inf on the banned token ids (vision placeholders, <|im_start|>, pad, ids beyond the
tokenizer) and 0 elsewhere, and tau the sampling temperature (tau = 1 for greedy, temperature 0).
This is log pi(token | prefix) of the distribution the engine draws from *before* top-p / top-k
truncation (vLLM's and verl's convention for the sampling logprobs of tempered sampling).
Entropy is that distribution's entropy (nats). Qwen-VL multimodal rotary positions (mrope) are
computed by the model's own ``get_rope_index`` with the padding mask, so padded batches give the
same positions as unpadded sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlkit.policy.chat import concat_images
from rlkit.policy.lora import unwrap_model


class SequenceLike(Protocol):
    """Anything with input_ids (list[int] or [T] tensor) and its images in placeholder order, as
    either pixel_values [P, D] | None + image_grid_thw [n, 3] | None (rlkit.policy.engine.PromptInput)
    or image_inputs: a list of rlkit.policy.chat.ImageInput (rlkit.rollout.Trajectory)."""

    input_ids: Sequence[int]


def _images_of(seq) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(pixel_values [P, D] | None, image_grid_thw [n, 3] | None) of a SequenceLike."""
    if hasattr(seq, "pixel_values") or hasattr(seq, "image_grid_thw"):
        return getattr(seq, "pixel_values", None), getattr(seq, "image_grid_thw", None)
    if hasattr(seq, "image_inputs"):
        batch = concat_images(seq.image_inputs)
        return batch.pixel_values, batch.image_grid_thw
    return None, None


@dataclass
class SequenceBatch:
    """A padded batch of sequences ready for the model.

    input_ids [N, T] long, attention_mask [N, T] long (1 = real token), mm_token_type_ids [N, T]
    int (1 on <|image_pad|>), position_ids [3, N, T] long (mrope t/h/w; 0 on padding),
    pixel_values [sum P, D] float | None, image_grid_thw [n_images, 3] long | None,
    lengths: real length of each row, padding_side "right" or "left".
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mm_token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    lengths: list[int]
    padding_side: str = "right"

    def model_inputs(self) -> dict:
        """Keyword arguments of the model forward (positions explicit, so no rope state is used)."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "pixel_values": self.pixel_values,
            "image_grid_thw": self.image_grid_thw,
        }


def rope_model(model: nn.Module) -> nn.Module:
    """The inner multimodal model owning ``get_rope_index`` (Qwen3VLModel) under any wrapper.

    Raises: TypeError if the model has none (not a Qwen-VL model).
    """
    hf = unwrap_model(model)
    for cand in (getattr(hf, "model", None), hf):
        if cand is not None and hasattr(cand, "get_rope_index"):
            return cand
    for mod in hf.modules():
        if hasattr(mod, "get_rope_index"):
            return mod
    raise TypeError(f"{type(hf).__name__} has no get_rope_index: rlkit.policy supports Qwen-VL models only")


def model_config(model: nn.Module):
    """The top-level config (image_token_id, text_config.vocab_size, ...) of a possibly wrapped model."""
    return unwrap_model(model).config


def mrope_position_ids(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary position ids of a padded batch, by the model's own ``get_rope_index``.

    Args:
        input_ids [N, T] long; attention_mask [N, T] (1 = real token, left or right padding);
        image_grid_thw [n_images, 3] long for all images of the batch in order, or None.

    Returns:
        position_ids [3, N, T] long (t, h, w; padding positions 0) and next_position [N] long:
        the position of a text token appended after each row's last real token (max + 1).
    """
    cfg = model_config(model)
    mm = (input_ids == cfg.image_token_id).to(torch.int32)
    mm = mm.masked_fill(input_ids == cfg.video_token_id, 2)
    pos, _ = rope_model(model).get_rope_index(
        input_ids,
        mm_token_type_ids=mm,
        image_grid_thw=image_grid_thw,
        video_grid_thw=None,
        attention_mask=attention_mask,
    )
    masked = pos.masked_fill(attention_mask[None] == 0, -1)
    next_position = masked.amax(dim=(0, 2)) + 1
    return pos, next_position


def _pad_id(cfg) -> int:
    """The config's pad token id (text config first), else 0; padded positions are always masked out."""
    return int(getattr(cfg.text_config, "pad_token_id", None) or getattr(cfg, "pad_token_id", None) or 0)


def _ids_list(x) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def sequence_batch(
    model: nn.Module,
    sequences: Sequence[SequenceLike],
    pad_token_id: int | None = None,
    padding_side: str = "right",
    device: torch.device | str | None = None,
    with_pixels: bool = True,
) -> SequenceBatch:
    """Collate sequences into a padded SequenceBatch with mrope positions.

    Args:
        model: the policy model (for the config's token ids and ``get_rope_index``).
        sequences: N items with input_ids [T_i] and their images in placeholder order (see
            SequenceLike: PromptInput, Trajectory, ...).
        pad_token_id: id for padding (None: the config's pad id, else 0); padding is masked out.
        padding_side: "right" (training) or "left" (generation prefill).
        device: where tensors go (None: the model's device).
        with_pixels: False leaves ``pixel_values`` None (positions and checks need only the grids; for
            callers that feed the images themselves, e.g. compute_logprobs_shared_prefix).

    Returns: SequenceBatch, T = max T_i.

    Raises:
        ValueError: empty sequence, or a sequence whose <|image_pad|> count differs from its
            images' t*h*w / merge**2 (the model forward would fail later with a less clear error).
    """
    cfg = model_config(model)
    if device is None:
        device = next(unwrap_model(model).parameters()).device
    if pad_token_id is None:
        pad_token_id = _pad_id(cfg)
    merge = int(cfg.vision_config.spatial_merge_size)
    rows = [_ids_list(s.input_ids) for s in sequences]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("sequence_batch needs at least one non-empty sequence")
    t_max = max(len(r) for r in rows)
    n = len(rows)
    ids = torch.full((n, t_max), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((n, t_max), dtype=torch.long)
    pvs, thws = [], []
    for i, (row, seq) in enumerate(zip(rows, sequences)):
        sl = slice(0, len(row)) if padding_side == "right" else slice(t_max - len(row), t_max)
        ids[i, sl] = torch.tensor(row, dtype=torch.long)
        mask[i, sl] = 1
        n_pad = sum(1 for x in row if x == cfg.image_token_id)
        if with_pixels:
            pv, thw = _images_of(seq)
        else:
            images = _image_list(seq)
            pv, thw = None, (torch.cat([g for _, g in images], 0) if images else None)
        n_feat = 0 if thw is None else int((thw.reshape(-1, 3).prod(-1) // (merge * merge)).sum())
        if n_pad != n_feat:
            raise ValueError(
                f"sequence {i}: {n_pad} <|image_pad|> tokens but its images give {n_feat} features "
                "(a vision placeholder was sampled or images are missing/misordered)"
            )
        if thw is not None and (pv is not None or not with_pixels):
            if pv is not None:
                pvs.append(pv)
            thws.append(thw.reshape(-1, 3))
    pixel_values = torch.cat(pvs, 0).to(device=device, dtype=torch.float32) if pvs else None
    image_grid_thw = torch.cat(thws, 0).long().to(device) if thws else None
    ids, mask = ids.to(device), mask.to(device)
    pos, _ = mrope_position_ids(model, ids, mask, image_grid_thw)
    mm = (ids == cfg.image_token_id).to(torch.int32)
    return SequenceBatch(
        input_ids=ids,
        attention_mask=mask,
        mm_token_type_ids=mm,
        position_ids=pos,
        pixel_values=pixel_values,
        image_grid_thw=image_grid_thw,
        lengths=[len(r) for r in rows],
        padding_side=padding_side,
    )


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


# ---------------------------------------------------------------------------------------------
# Shared-prefix forward: the G samples of a group run their common prompt once.
# ---------------------------------------------------------------------------------------------


@dataclass
class PrefixCluster:
    """Rows of a batch that share a prefix: ``rows`` (indices into the batch, >= 2 of them) share
    their first ``prefix_len`` tokens and the first ``num_prefix_images`` images (equal pixels and
    grids); every row has at least one token after the prefix."""

    rows: list[int]
    prefix_len: int
    num_prefix_images: int


def _image_list(seq) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The images of a SequenceLike, one (pixel_values [P_i, D], image_grid_thw [1, 3]) per image, in order.

    For a sequence holding ``image_inputs`` (rlkit.rollout.Trajectory) the pixel tensors are its
    ImageInputs' own (no concatenation), so the G trajectories of a group, which share their first
    turn's ImageInputs, return the same tensor objects (shared_prefix_clusters compares them by identity
    before comparing pixels)."""
    if not (hasattr(seq, "pixel_values") or hasattr(seq, "image_grid_thw")) and hasattr(seq, "image_inputs"):
        out: list[tuple[torch.Tensor, torch.Tensor]] = []

        def _add(item) -> None:
            if hasattr(item, "image_inputs"):  # a TurnTokens: its images in order
                for sub in item.image_inputs:
                    _add(sub)
            elif item.pixel_values is not None:
                thw = item.image_grid_thw.reshape(-1, 3).long()
                if thw.shape[0] == 1:
                    out.append((item.pixel_values, thw))
                else:
                    sizes = thw.prod(-1).tolist()
                    out.extend((p, g.reshape(1, 3)) for p, g in zip(torch.split(item.pixel_values, sizes, 0), thw))

        for item in seq.image_inputs:
            _add(item)
        return out
    pv, thw = _images_of(seq)
    if pv is None or thw is None:
        return []
    thw = thw.reshape(-1, 3).long()
    sizes = thw.prod(-1).tolist()
    return [(p, g.reshape(1, 3)) for p, g in zip(torch.split(pv, sizes, 0), thw)]


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


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = (torch.tensor(a[:m]) != torch.tensor(b[:m])).nonzero()
    return int(diff[0, 0]) if len(diff) else m


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


def _vision_token_ids(cfg) -> set[int]:
    """The image and video placeholder token ids of a model config (the image id twice when there is no video id)."""
    return {int(cfg.image_token_id), int(getattr(cfg, "video_token_id", None) or cfg.image_token_id)}


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
    from transformers import DynamicCache

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

    if not clusters:
        return torch.stack(lp_rows), (torch.stack(ent_rows) if with_entropy else None)

    # 0. the clusters' common text prefix (a system prompt), once, when there is one: [1, R]
    pad = _pad_id(cfg)
    c_n, p_max = len(clusters), max(c.prefix_len for c in clusters)
    r_len = 0 if uniform_forwards else _root_prefix_len(batch, clusters, _vision_token_ids(cfg))
    root_cache, root_logits = None, None
    rep0 = clusters[0].rows[0]  # the root's tokens are every cluster's; read them from this row
    if r_len:
        root = model(input_ids=batch.input_ids[rep0 : rep0 + 1, :r_len],
                     attention_mask=torch.ones((1, r_len), dtype=torch.long, device=device),
                     position_ids=batch.position_ids[:, rep0 : rep0 + 1, :r_len], use_cache=True)
        root_logits = root.logits[0]  # [R, V]
        root_cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(c_n, -1, -1, -1), layer.values.expand(c_n, -1, -1, -1))
                                                  for layer in root.past_key_values.layers],  # [C, H_kv, R, D]
                                  config=unwrap_model(model).config)

    # 1. one prefix forward for all clusters: [C, P_max - R] after the root's cache, right-padded (padding masked out)
    pre_ids = torch.full((c_n, p_max - r_len), pad, dtype=torch.long, device=device)  # [C, P_max - R]
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
    pre = model(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos, pixel_values=pv,
                image_grid_thw=thw, past_key_values=root_cache, use_cache=True)  # cache: [C, H_kv, P_max, D]
    pre_logits = pre.logits  # [C, P_max - R, V]
    banned = banned_mask(banned_token_ids, pre_logits.shape[-1], device)

    # 2. the KV cache repeated to each cluster's rows (a view when there is one cluster)
    rows = [r for c in clusters for r in c.rows]  # the suffix batch's rows, cluster by cluster
    owner = [ci for ci, c in enumerate(clusters) for _ in c.rows]
    sizes = {len(c.rows) for c in clusters}
    if c_n == 1:
        kv = [(layer.keys.expand(len(rows), -1, -1, -1), layer.values.expand(len(rows), -1, -1, -1))
              for layer in pre.past_key_values.layers]  # [n, H_kv, P, D]
    elif len(sizes) == 1:  # clusters of one size m: [C, 1, ...] -> [C, m, ...] -> [C*m, ...]; the backward
        # is a sum over the m copies, where index_select's scatters rows into a zeroed buffer (its scatter_add
        # alone was 31 ms of a 0.77 s fp32 update in bench_vs_trl's workload)
        m = sizes.pop()

        def repeat(x: torch.Tensor) -> torch.Tensor:
            return x[:, None].expand(-1, m, -1, -1, -1).reshape(c_n * m, *x.shape[1:])

        kv = [(repeat(layer.keys), repeat(layer.values)) for layer in pre.past_key_values.layers]  # [n, H_kv, P_max, D]
    else:
        own = torch.tensor(owner, device=device)
        kv = [(layer.keys.index_select(0, own), layer.values.index_select(0, own))
              for layer in pre.past_key_values.layers]  # [n, H_kv, P_max, D]
    cache = DynamicCache(ddp_cache_data=kv, config=unwrap_model(model).config)

    # 3. one suffix forward: [n, S_max] after the cache; attention mask [n, P_max + S_max]
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
    suf_logits = suf.logits  # [n, S_max, V]
    # rows by unbind, not by indexing: see compute_logprobs (one gradient buffer, not one per row)
    pre_rows, suf_rows = pre_logits.unbind(0), suf_logits.unbind(0)

    # 4. logprobs: prefix positions 0..P-2 predict the shared tokens 1..P-1 (once per cluster; the root's
    # 0..R-2 once for all); position P-1 predicts each row's first suffix token; suffix positions the rest
    if r_len:
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
    logprobs = torch.stack(lp_rows)  # [N, T]
    entropy = torch.stack(ent_rows) if with_entropy else None  # [N, T]
    return logprobs, entropy
