"""Rollout engines: token ids in, sampled completions (ids, logprobs, text) out.

``RolloutEngine`` is the interface the rollout loop uses; ``TransformersEngine`` implements it with
the policy's own transformers model, colocated with training (the native backend). It is a
prefill + decode loop written here rather than ``model.generate``, because it needs exact control of
three things ``generate`` does not give together:

- the sampling distribution and its logprobs: banned ids masked to -inf, temperature, then top-k /
  top-p truncation only for the draw; the reported logprob is from the untruncated tempered
  distribution (rlkit.policy.logprobs.tempered_log_probs, shared with compute_logprobs);
- Qwen-VL mrope positions for left-padded batches: prefill positions come from the model's
  ``get_rope_index`` with the padding mask, decode positions continue each row at max + 1, and
  nothing relies on the model's cached ``rope_deltas`` state;
- one prefill per distinct prompt: the G samples of a prompt share its image encoding and prompt
  prefill; the KV cache is repeated G times afterwards (``DynamicCache.batch_repeat_interleave``).

Finished rows (sampled <|im_end|>) are dropped from the batch and KV cache as they finish
(``batch_select_indices``), so long-tail rows do not keep the batch wide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch

from rlkit.policy.logprobs import banned_mask, sequence_batch, tempered_log_probs


@dataclass
class PromptInput:
    """One prompt: input_ids (the whole conversation so far, ending with the assistant header),
    pixel_values [P, D] float32 and image_grid_thw [n_images, 3] long of all its images in order
    (both None for a text-only prompt)."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


@dataclass
class SamplingParams:
    """Sampling settings of one generate call.

    temperature: 0 = greedy (argmax; logprobs at temperature 1). top_p: nucleus mass in (0, 1]
    (1 = off). top_k: keep the k most likely ids (0 or -1 = off). max_new_tokens: per completion,
    including the stop token. n: completions per prompt. seed: seeds the draw (same seed, prompts
    and weights -> same samples); None = fresh randomness.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 48
    n: int = 1
    seed: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.n < 1:
            raise ValueError(f"n={self.n} must be >= 1")


@dataclass
class Completion:
    """One sampled completion.

    token_ids: sampled ids, ending with <|im_end|> when finish_reason == "stop".
    logprobs: one float per token (see rlkit.policy.logprobs for the exact quantity).
    text: decoded token_ids without the final <|im_end|>. finish_reason: "stop" | "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@dataclass
class GenerateStats:
    """Counters of the last generate call (seconds, tokens)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    extra: dict = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the rollout loop needs from an engine.

    generate(prompts, sampling) -> for each prompt, ``sampling.n`` Completions (in order).
    """

    def generate(self, prompts: Sequence[PromptInput], sampling: SamplingParams) -> list[list[Completion]]: ...


def sample_from_logits(
    logits: torch.Tensor,
    banned: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    Args:
        logits [R, V] (any float dtype); banned [V] bool; sampling: temperature / top_p / top_k.
        generator: torch RNG on the logits' device (None = global RNG).

    Returns:
        tokens [R] long and logprobs [R] float32: log_softmax((logits + ban) / tau)[token] of the
        untruncated distribution (tau = 1 for greedy). Top-k / top-p restrict only the draw
        (vLLM semantics: k first, then p over the k survivors, at least one token kept).
    """
    logp = tempered_log_probs(logits, banned, sampling.temperature)  # [R, V] float32
    if sampling.temperature <= 0:
        tokens = logp.argmax(dim=-1)
    else:
        scores = logp  # log-probs are tempered logits up to a per-row constant
        if sampling.top_k and 0 < sampling.top_k < scores.shape[-1]:
            kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if sampling.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
            probs = torch.softmax(sorted_scores, dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            drop_sorted = mass_before >= sampling.top_p
            drop_sorted[:, 0] = False
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class TransformersEngine:
    """RolloutEngine on the policy's transformers model (KV-cached, batched, left-padded).

    Args:
        policy: a rlkit.policy.Policy (model, chat format, banned ids). The engine samples from
            ``policy.model`` as it is at call time, so a colocated trainer needs no weight sync; a
            separate engine process loads new adapters with ``load_adapter``.
        max_batch_rows: most sequences decoded together (prompts x n); larger calls run in chunks.
        share_prefill: prefill each prompt once and repeat its KV cache n times (True), or prefill
            every row separately (False; for benchmarks).
    """

    def __init__(self, policy, max_batch_rows: int = 256, share_prefill: bool = True) -> None:
        self.policy = policy
        self.max_batch_rows = int(max_batch_rows)
        self.share_prefill = bool(share_prefill)
        self.last_stats = GenerateStats()
        self.adapter_info = None

    @property
    def model(self):
        return self.policy.model

    def load_adapter(self, path):
        """Hot-swap a saved LoRA adapter into the policy (rlkit.policy.lora.load_adapter_inplace);
        returns and remembers its AdapterInfo (``adapter_info``: version, sha256)."""
        from rlkit.policy.lora import load_adapter_inplace

        self.adapter_info = load_adapter_inplace(self.policy.model, path)
        return self.adapter_info

    def generate(self, prompts: Sequence[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for each prompt.

        Returns: list (one per prompt, in order) of lists of n Completions.

        Raises:
            ValueError: bad sampling params, an empty prompt, or a prompt whose image placeholders
                do not match its images.
        """
        sampling.validate()
        if not prompts:
            return []
        device = next(self.policy.model.parameters()).device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(int(sampling.seed))
        stats = GenerateStats()
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                out: list[list[Completion]] = []
                per_chunk = max(1, self.max_batch_rows // sampling.n)
                for start in range(0, len(prompts), per_chunk):
                    chunk = list(prompts[start : start + per_chunk])
                    if self.share_prefill:
                        out.extend(self._generate_chunk(chunk, sampling, sampling.n, generator, stats, device))
                    else:
                        rows = [p for p in chunk for _ in range(sampling.n)]
                        flat = self._generate_chunk(rows, sampling, 1, generator, stats, device)
                        out.extend([[c[0] for c in flat[i * sampling.n : (i + 1) * sampling.n]] for i in range(len(chunk))])
        finally:
            model.train(was_training)
        self.last_stats = stats
        return out

    def _generate_chunk(self, prompts, sampling, n, generator, stats, device) -> list[list[Completion]]:
        model = self.policy.model
        chat = self.policy.chat
        im_end = chat.im_end_id
        t0 = time.perf_counter()
        batch = sequence_batch(model, prompts, pad_token_id=chat.pad_id, padding_side="left", device=device)
        next_pos = batch.position_ids.masked_fill(batch.attention_mask[None] == 0, -1).amax(dim=(0, 2)) + 1  # [B]
        out = model(**batch.model_inputs(), use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1]  # [B, V]
        banned = banned_mask(self.policy.banned_token_ids, logits.shape[-1], device)
        attn = batch.attention_mask
        stats.prompt_tokens += sum(batch.lengths)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attn = attn.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)
        stats.prefill_s += time.perf_counter() - t0

        t1 = time.perf_counter()
        rows = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        alive = torch.arange(rows, device=device)  # original row index of each live batch row
        for step in range(sampling.max_new_tokens):
            tok, lp = sample_from_logits(logits, banned, sampling, generator)
            tok_l, lp_l, alive_l = tok.tolist(), lp.tolist(), alive.tolist()
            keep = []
            for j, r in enumerate(alive_l):
                tokens[r].append(tok_l[j])
                logps[r].append(lp_l[j])
                if tok_l[j] == im_end:
                    finish[r] = "stop"
                else:
                    keep.append(j)
            stats.generated_tokens += len(alive_l)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(alive_l):
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                alive, tok, attn, next_pos = alive[idx], tok[idx], attn[idx], next_pos[idx]
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)
            pos = next_pos.view(1, -1, 1).expand(3, -1, 1)
            out = model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
            stats.decode_steps += 1
        stats.decode_s += time.perf_counter() - t1

        results: list[list[Completion]] = []
        for i in range(len(prompts)):
            group = []
            for r in range(i * n, (i + 1) * n):
                group.append(Completion(tokens[r], logps[r], chat.decode(tokens[r]), finish[r]))
            results.append(group)
        return results


def make_engine(policy, **kwargs) -> TransformersEngine:
    """The rollout engine of the native backend for ``policy`` (kwargs: TransformersEngine's)."""
    return TransformersEngine(policy, **kwargs)
