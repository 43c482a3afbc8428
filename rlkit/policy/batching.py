"""Sequences to a padded batch for the model: token ids, attention mask, Qwen-VL multimodal rotary positions
(mrope) and the images in placeholder order (``sequence_batch``, ``SequenceBatch``).

The mrope positions are computed by the model's own ``get_rope_index`` with the padding mask, so padded batches
give the same positions as unpadded sequences. Used by the training-side logprobs (rlkit.policy.logprobs,
rlkit.policy.shared_prefix) and the sampler's prefill (rlkit.policy.engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
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


def _vision_token_ids(cfg) -> set[int]:
    """The image and video placeholder token ids of a model config (the image id twice when there is no video id)."""
    return {int(cfg.image_token_id), int(getattr(cfg, "video_token_id", None) or cfg.image_token_id)}


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


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = (torch.tensor(a[:m]) != torch.tensor(b[:m])).nonzero()
    return int(diff[0, 0]) if len(diff) else m


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
