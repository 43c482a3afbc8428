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


def _ids_list(x) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def sequence_batch(
    model: nn.Module,
    sequences: Sequence[SequenceLike],
    pad_token_id: int | None = None,
    padding_side: str = "right",
    device: torch.device | str | None = None,
) -> SequenceBatch:
    """Collate sequences into a padded SequenceBatch with mrope positions.

    Args:
        model: the policy model (for the config's token ids and ``get_rope_index``).
        sequences: N items with input_ids [T_i] and their images in placeholder order (see
            SequenceLike: PromptInput, Trajectory, ...).
        pad_token_id: id for padding (None: the config's pad id, else 0); padding is masked out.
        padding_side: "right" (training) or "left" (generation prefill).
        device: where tensors go (None: the model's device).

    Returns: SequenceBatch, T = max T_i.

    Raises:
        ValueError: empty sequence, or a sequence whose <|image_pad|> count differs from its
            images' t*h*w / merge**2 (the model forward would fail later with a less clear error).
    """
    cfg = model_config(model)
    if device is None:
        device = next(unwrap_model(model).parameters()).device
    if pad_token_id is None:
        pad_token_id = getattr(cfg.text_config, "pad_token_id", None) or getattr(cfg, "pad_token_id", None) or 0
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
        pv, thw = _images_of(seq)
        n_feat = 0 if thw is None else int((thw.reshape(-1, 3).prod(-1) // (merge * merge)).sum())
        if n_pad != n_feat:
            raise ValueError(
                f"sequence {i}: {n_pad} <|image_pad|> tokens but its images give {n_feat} features "
                "(a vision placeholder was sampled or images are missing/misordered)"
            )
        if thw is not None and pv is not None:
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
    n, t, v = logits.shape
    banned = banned_mask(banned_token_ids, v, logits.device)
    targets = batch.input_ids[:, 1:]  # [N, T-1]
    valid = batch.attention_mask[:, 1:].bool() & batch.attention_mask[:, :-1].bool()
    lp_rows, ent_rows = [], []
    for i in range(n):  # row by row: bounds the float32 [T, V] temporaries to one sequence
        logp = tempered_log_probs(logits[i, :-1], banned, temperature)  # [T-1, V]
        lp = logp.gather(-1, targets[i].unsqueeze(-1)).squeeze(-1)  # [T-1]
        lp = torch.where(valid[i] & ~banned[targets[i]], lp, torch.zeros_like(lp))
        lp_rows.append(F.pad(lp, (1, 0)))
        if with_entropy:
            p = logp.exp()
            ent = -(p * logp.masked_fill(banned, 0.0)).sum(-1)  # [T-1]
            ent = torch.where(valid[i], ent, torch.zeros_like(ent))
            ent_rows.append(F.pad(ent, (1, 0)))
    logprobs = torch.stack(lp_rows)
    entropy = torch.stack(ent_rows) if with_entropy else None
    return logprobs, entropy
