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
(``batch_select_indices``), so long-tail rows do not keep the batch wide. After the prefill the cache
gets room for the new tokens (``_GrowingLayer``), so a decode step writes one position instead of
concatenating the whole cache as transformers' DynamicLayer does.

Multi-turn without re-prefill (``generate_cached``): after a turn, each completion's KV cache is kept
as a ``KVState`` (its rows of the batch cache, padding removed, plus the mrope position of the next
token); the next turn of that conversation prefills only the tokens after the state (the last sampled
token, the turn end and the new user turn with its new images) against it. Qwen3-VL's
``get_rope_index`` is translation invariant (each text run and image starts at the running
max position + 1), so the new tokens' positions are ``get_rope_index`` of the new tokens alone plus
the state's next position: the positions a full re-prefill gives them. Same tokens and logprobs as
re-prefilling (``generate``) within float32 rounding (tests/policy/test_kv_reuse.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import torch
from transformers.cache_utils import DynamicLayer

from rlkit.policy.batching import _ids_list, _image_list, sequence_batch
from rlkit.policy.logprobs import banned_mask, tempered_log_probs
from rlkit.policy.lora import unwrap_model


@dataclass
class PromptInput:
    """One prompt: input_ids (the whole conversation so far, ending with the assistant header),
    pixel_values [P, D] float32 and image_grid_thw [n_images, 3] long of all its images in order
    (both None for a text-only prompt). images: the source images (PIL) of those pixel values, in order, for
    engines that encode images themselves (rlkit.policy.vllm_engine); None where the caller has none (rlkit's
    engine reads only the pixel values)."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    images: list | None = None


@dataclass
class KVState:
    """The KV cache of one conversation kept after a turn (``TransformersEngine.generate_cached``).

    keys, values: one tensor per decoder layer, [H_kv, L, D] (the model's dtype and device; no padding).
    input_ids: the L tokens the cache covers: the turn's prompt and the completion without its last
        token (which was sampled but never fed to the model).
    num_images: images of the conversation in the covered tokens (all of them start before the cut).
    next_position: mrope position of the token after the covered ones (every axis; a text token).

    Valid only for the weights that made it (a state outlives no adapter update: rlkit.rollout drops
    it when its episode ends). Its tensors are inference tensors (made under torch.inference_mode).
    Size: 2 x layers x H_kv x L x D elements (``nbytes``).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    input_ids: list[int]
    num_images: int
    next_position: int

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class SamplingParams:
    """Sampling settings of one generate call.

    temperature: 0 = greedy (argmax; logprobs at temperature 1). top_p: nucleus mass in (0, 1]
    (1 = off). top_k: keep the k most likely ids (0 or -1 = off). max_new_tokens: per completion,
    including the stop token. n: completions per prompt. seed: seeds the draw (same seed, prompts
    and weights -> same samples); None = fresh randomness. stop: strings that end a completion as
    soon as its text contains one (vLLM's ``stop`` with ``include_stop_str_in_output=True``: the
    text keeps the stop string and is cut right after it; token_ids keep every sampled token, so
    the last one may reach past it); the end-of-turn token always ends it too. top_logprobs: at each
    step also report the k most likely token ids and their logprobs (``TopLogprobs``, k = top_logprobs;
    0 = none, and nothing is computed), from the distribution the sampled token's logprob comes from
    (the untruncated tempered one: rlkit.policy.logprobs); they do not change what is sampled.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 48
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0

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
        if isinstance(self.stop, str) or any(not isinstance(x, str) or not x for x in self.stop):
            raise ValueError(f"stop={self.stop!r} must be a list of non-empty strings")
        if isinstance(self.top_logprobs, bool) or not isinstance(self.top_logprobs, int) or self.top_logprobs < 0:
            raise ValueError(f"top_logprobs={self.top_logprobs!r} must be an int >= 0")


class TopLogprobs(NamedTuple):
    """The k most likely tokens at one step of a completion (``SamplingParams.top_logprobs`` = k).

    token_ids: k ids, most likely first (equal logprobs among them: lower id first). logprobs: their k logprobs
    (natural log, float; -inf for a banned id, which only appears when fewer than k ids are allowed), of
    the same distribution as ``Completion.logprobs``: log_softmax((logits + ban) / tau), before top-k /
    top-p truncation. The sampled token's own entry, when it is among them, equals its logprob exactly.
    """

    token_ids: list[int]
    logprobs: list[float]


@dataclass
class Completion:
    """One sampled completion.

    token_ids: sampled ids, ending with <|im_end|> when finish_reason == "stop" and stop_reason is None.
    logprobs: one float per token (see rlkit.policy.logprobs for the exact quantity).
    text: decoded token_ids without the final <|im_end|> (cut right after the stop string when one
    ended it). finish_reason: "stop" | "length". stop_reason: the stop string (SamplingParams.stop)
    that ended it, None when the end-of-turn token did or it ran out of tokens (vLLM's field).
    top_logprobs: one TopLogprobs per token (the k most likely at that step) when
    ``SamplingParams.top_logprobs`` > 0, else None.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: str | None = None
    top_logprobs: list[TopLogprobs] | None = None


@dataclass
class GenerateStats:
    """Counters of the last generate call (seconds, tokens)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    extra: dict = field(default_factory=dict)


#: ``on_token(prompt_index, sample_index, token_id, logprob)`` of ``TransformersEngine.generate``; with
#: ``SamplingParams.top_logprobs`` > 0 it gets a fifth argument, the step's TopLogprobs.
TokenCallback = Callable[..., None]


@runtime_checkable
class RolloutEngine(Protocol):
    """What the rollout loop needs from an engine.

    generate(prompts, sampling) -> for each prompt, ``sampling.n`` Completions (in order).
    """

    def generate(self, prompts: Sequence[PromptInput], sampling: SamplingParams) -> list[list[Completion]]: ...


def _inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` [R, V] (rows sum to 1; zeros allowed) by inverse-CDF sampling:
    the first index whose cumulative probability exceeds u * total, u ~ U[0, 1) (float64, so a
    token of probability 0 is never drawn). Returns [R] long. The same distribution as
    ``torch.multinomial(probs, 1)``, whose CPU kernel draws V exponentials a row (1.1 ms against
    0.06 ms for [64, 1024], fp32, 1 thread)."""
    cdf = probs.double().cumsum(dim=-1)  # [R, V]
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device)  # [R, 1]
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [R, 1]: cdf[t - 1] <= u * total < cdf[t]
    return tokens.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


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
    tokens, chosen, _ = _draw(logits, banned, sampling, generator)
    return tokens, chosen


def top_logprobs_of(logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely ids of each row of ``logp`` [R, V] (log-probabilities): (ids [R, k'] long,
    values [R, k'] of ``logp``'s dtype), k' = min(k, V), most likely first; equal values among them are ordered
    by id (lower first), so their order does not depend on torch.topk's (which of the ids tied at the k-th
    value are kept does)."""
    vals, ids = torch.topk(logp, min(int(k), logp.shape[-1]), dim=-1)  # [R, k']
    by_id = ids.argsort(dim=-1)
    ids, vals = ids.gather(-1, by_id), vals.gather(-1, by_id)
    order = vals.argsort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), vals.gather(-1, order)


def _draw(logits, banned, sampling, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sample_from_logits`` that also returns the distribution the logprobs are read from:
    (tokens [R] long, logprobs [R] float32, log-distribution [R, V] float32)."""
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
        tokens = _inverse_cdf_draw(probs, generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), logp


class TransformersEngine:
    """RolloutEngine on the policy's transformers model (KV-cached, batched, left-padded).

    Args:
        policy: a rlkit.policy.Policy (model, chat format, banned ids). The engine samples from
            ``policy.model`` as it is at call time, so a colocated trainer needs no weight sync; a
            separate engine process loads new adapters with ``load_adapter``.
        max_batch_rows: most sequences decoded together (prompts x n); larger calls run in chunks.
        share_prefill: prefill each prompt once and repeat its KV cache n times (True), or prefill
            every row separately (False; for benchmarks).
        reuse_kv: multi-turn rollouts keep each episode's KV cache across turns and prefill only the
            new tokens (``generate_cached``; rlkit.rollout reads this flag). False: every turn
            re-prefills the whole conversation (``generate``), as before.
        share_prompt_prefix: with ``share_prefill``, the distinct prompts of a call also share the token
            prefix they have in common before their first image (the system prompt and the user turn's
            header: 90 of the 159 tokens of a VisGym plan prompt): it is prefilled once and the prompts
            continue from its KV cache, as a later turn continues from its conversation's (``KVState``).
            Same tokens and logprobs as prefilling each prompt whole, within float32 rounding
            (tests/policy/test_engine.py).
    """

    #: Shortest common prompt prefix worth its own forward (tokens).
    MIN_SHARED_PROMPT_PREFIX = 16

    def __init__(self, policy, max_batch_rows: int = 256, share_prefill: bool = True, reuse_kv: bool = True,
                 share_prompt_prefix: bool = True) -> None:
        self.policy = policy
        self.max_batch_rows = int(max_batch_rows)
        self.share_prefill = bool(share_prefill)
        self.reuse_kv = bool(reuse_kv)
        self.share_prompt_prefix = bool(share_prompt_prefix)
        self.last_stats = GenerateStats()
        self._pieces: dict[int, str] = {}  # token id -> its text, for the stop-string check
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

    def generate(self, prompts: Sequence[PromptInput], sampling: SamplingParams,
                 on_token: TokenCallback | None = None) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for each prompt.

        Args:
            prompts, sampling: what to sample from and how.
            on_token: called on this thread as each token is sampled, before the next decode step:
                ``on_token(prompt_index, sample_index, token_id, logprob)`` (ints and a float, the values the
                Completion gets; per step in row order, so the tokens of one completion arrive in order). A
                completion's last call is its last token (``<|im_end|>``, the token completing a stop string,
                or the ``max_new_tokens``-th). With ``sampling.top_logprobs`` = k > 0 it is called with a fifth
                argument, the step's TopLogprobs (k ids and their logprobs, ``Completion.top_logprobs``' entry),
                ``on_token(prompt_index, sample_index, token_id, logprob, top)``; with k = 0 with four, as before.
                It does not change what is sampled; an exception it raises ends the call (propagated; nothing
                is returned). None: no calls, no cost.

        Returns: list (one per prompt, in order) of lists of n Completions.

        Raises:
            ValueError: bad sampling params, an empty prompt, or a prompt whose image placeholders
                do not match its images.
        """
        return self._generate(prompts, sampling, None, keep=False, on_token=on_token)[0]

    def generate_cached(
        self,
        prompts: Sequence[PromptInput],
        sampling: SamplingParams,
        states: Sequence[KVState | None] | None = None,
    ) -> tuple[list[list[Completion]], list[list[KVState]]]:
        """``generate`` that starts from kept KV caches and returns the new ones (multi-turn rollouts).

        Args:
            prompts: the whole conversation so far of each prompt (all its tokens and all its images,
                as for ``generate``).
            sampling: as for ``generate``.
            states: one KVState or None per prompt (None for all: every prompt prefilled in full). A
                state must cover a proper prefix of its prompt's input_ids (the ids are checked) and
                the first ``num_images`` of its images; only the tokens and images after it are
                prefilled. States are read, never changed, so one may serve several calls.

        Returns:
            (completions, states): completions as ``generate`` returns them (the same tokens and
            logprobs as ``generate`` on the same prompts, within float32 rounding); states[i][k] is
            the KVState after completion k of prompt i (prompt + completion without its last token).

        Raises:
            ValueError: as ``generate``; a state that is not a prefix of its prompt, or ``states``
                of another length than ``prompts``.
        """
        return self._generate(prompts, sampling, states, keep=True)

    def _generate(self, prompts, sampling, states, keep: bool,
                  on_token: TokenCallback | None = None) -> tuple[list[list[Completion]], list[list[KVState]]]:
        sampling.validate()
        if not prompts:
            return [], []
        if states is None:
            states = [None] * len(prompts)
        if len(states) != len(prompts):
            raise ValueError(f"{len(states)} KV states for {len(prompts)} prompts (one state or None per prompt)")
        device = next(self.policy.model.parameters()).device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(int(sampling.seed))
        stats = GenerateStats()
        model = self.policy.model
        was_training = model.training
        model.eval()
        n = sampling.n
        try:
            with torch.inference_mode():
                out: list[list[Completion]] = []
                kept: list[list[KVState]] = []
                per_chunk = max(1, self.max_batch_rows // n)
                for start in range(0, len(prompts), per_chunk):
                    chunk = list(prompts[start : start + per_chunk])
                    chunk_states = list(states[start : start + per_chunk])
                    emit = None if on_token is None else _row_callback(on_token, start, n)
                    if self.share_prefill:
                        comps, ks = self._generate_chunk(chunk, chunk_states, sampling, n, generator, stats, device, keep,
                                                         emit)
                        out.extend(comps)
                        kept.extend(ks)
                    else:
                        rows = [p for p in chunk for _ in range(n)]
                        row_states = [s for s in chunk_states for _ in range(n)]
                        flat, flat_k = self._generate_chunk(rows, row_states, sampling, 1, generator, stats, device, keep,
                                                            emit)
                        out.extend([[c[0] for c in flat[i * n : (i + 1) * n]] for i in range(len(chunk))])
                        if keep:
                            kept.extend([[k[0] for k in flat_k[i * n : (i + 1) * n]] for i in range(len(chunk))])
        finally:
            model.train(was_training)
        self.last_stats = stats
        return out, kept

    def _prefill(self, prompts, states, device, stats):
        """Prefill a chunk: (model output with its KV cache, attention mask [B, L], next position [B]).

        Without states: the whole prompts, left-padded. With states: a cache [B, H, C_max, D] of the
        states (each right-aligned, padding masked), then the prompts' tokens after their states,
        left-padded, at the states' positions + the new tokens' own ``get_rope_index`` positions.
        """
        model = self.policy.model
        chat = self.policy.chat
        shared = None  # prompt_tokens counts the tokens prefilled: a shared prompt prefix once
        if all(s is None for s in states) and self.share_prefill and self.share_prompt_prefix:
            shared = self._common_prompt_prefix(prompts, device)
            if shared is not None:
                states = [shared] * len(prompts)
                stats.prompt_tokens += shared.num_tokens
                stats.extra["shared_prompt_tokens"] = stats.extra.get("shared_prompt_tokens", 0) + shared.num_tokens
        if all(s is None for s in states):
            batch = sequence_batch(model, prompts, pad_token_id=chat.pad_id, padding_side="left", device=device)
            next_pos = batch.position_ids.masked_fill(batch.attention_mask[None] == 0, -1).amax(dim=(0, 2)) + 1  # [B]
            out = model(**batch.model_inputs(), use_cache=True, logits_to_keep=1)
            stats.prompt_tokens += sum(batch.lengths)
            return out, batch.attention_mask, next_pos

        from transformers import DynamicCache

        new_prompts, offsets, cached = [], [], []
        for i, (p, st) in enumerate(zip(prompts, states)):
            ids = _ids_list(p.input_ids)
            images = _image_list(p)  # [(pixel_values [P_i, D], image_grid_thw [1, 3])]
            c, k, off = 0, 0, 0
            if st is not None:
                c, k, off = st.num_tokens, st.num_images, st.next_position
                if c >= len(ids) or ids[:c] != st.input_ids:
                    raise ValueError(f"prompt {i}: its KV state ({c} tokens) is not a proper prefix of its "
                                     f"{len(ids)} input_ids (pass the conversation the state was made from, "
                                     "extended by at least one token)")
                if k > len(images):
                    raise ValueError(f"prompt {i}: its KV state covers {k} images but the prompt has {len(images)}")
            new = images[k:]
            new_prompts.append(PromptInput(
                input_ids=ids[c:],
                pixel_values=torch.cat([pv for pv, _ in new], 0) if new else None,
                image_grid_thw=torch.cat([g for _, g in new], 0) if new else None,
            ))
            offsets.append(off)
            cached.append(c)
        batch = sequence_batch(model, new_prompts, pad_token_id=chat.pad_id, padding_side="left", device=device)
        b = len(prompts)
        offset = torch.tensor(offsets, dtype=torch.long, device=device)  # [B]
        real = batch.attention_mask[None] == 1  # [1, B, N]
        pos = torch.where(real, batch.position_ids + offset.view(1, -1, 1), batch.position_ids)  # [3, B, N]
        next_pos = pos.masked_fill(~real, -1).amax(dim=(0, 2)) + 1  # [B]
        c_max = max(cached)
        ref = next(s for s in states if s is not None)
        same = all(st is ref for st in states)  # one state for every prompt (a shared prompt prefix)
        kv = []
        for layer in range(len(ref.keys)):
            h, _, d = ref.keys[layer].shape
            if same:  # [B, H_kv, C, D]
                keys = ref.keys[layer].unsqueeze(0).expand(b, -1, -1, -1).contiguous()
                values = ref.values[layer].unsqueeze(0).expand(b, -1, -1, -1).contiguous()
                kv.append((keys, values))
                continue
            keys = ref.keys[layer].new_zeros(b, h, c_max, d)  # [B, H_kv, C_max, D]
            values = ref.values[layer].new_zeros(b, h, c_max, d)
            for i, st in enumerate(states):
                if st is not None:
                    keys[i, :, c_max - cached[i] :] = st.keys[layer]
                    values[i, :, c_max - cached[i] :] = st.values[layer]
            kv.append((keys, values))
        cache = DynamicCache(ddp_cache_data=kv, config=unwrap_model(model).config)
        cache_mask = torch.zeros((b, c_max), dtype=batch.attention_mask.dtype, device=device)  # [B, C_max]
        for i, c in enumerate(cached):
            cache_mask[i, c_max - c :] = 1
        attn = torch.cat([cache_mask, batch.attention_mask], dim=1)  # [B, C_max + N]
        out = model(input_ids=batch.input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                    pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw, use_cache=True,
                    logits_to_keep=1)
        stats.prompt_tokens += sum(batch.lengths)
        if shared is None:  # tokens taken from kept conversation states
            stats.extra["cached_tokens"] = stats.extra.get("cached_tokens", 0) + sum(cached)
        return out, attn, next_pos

    def _common_prompt_prefix(self, prompts, device) -> KVState | None:
        """The KVState of the token prefix all ``prompts`` share, cut before the first image or video
        placeholder and leaving every prompt at least one token of its own; None for fewer than 2
        prompts or a prefix shorter than MIN_SHARED_PROMPT_PREFIX. Text only, so its mrope positions
        are 0..P-1 and the prompts' own tokens continue at P (the translation invariance _prefill's
        states path relies on)."""
        if len(prompts) < 2:
            return None
        from rlkit.policy.batching import _common_prefix_len, _vision_token_ids, model_config

        ids = [_ids_list(p.input_ids) for p in prompts]
        first = ids[0]
        cut = min(len(x) for x in ids) - 1
        for other in ids[1:]:
            if cut < self.MIN_SHARED_PROMPT_PREFIX:
                return None
            cut = min(cut, _common_prefix_len(first[:cut], other[:cut]))
        cfg = model_config(self.policy.model)
        vision = _vision_token_ids(cfg)
        cut = next((j for j in range(cut) if first[j] in vision), cut)
        if cut < self.MIN_SHARED_PROMPT_PREFIX:
            return None
        prefix = PromptInput(input_ids=first[:cut])
        batch = sequence_batch(self.policy.model, [prefix], pad_token_id=self.policy.chat.pad_id, padding_side="left",
                               device=device)
        out = self.policy.model(**batch.model_inputs(), use_cache=True, logits_to_keep=1)
        layers = out.past_key_values.layers
        return KVState(keys=[layer.keys[0] for layer in layers], values=[layer.values[0] for layer in layers],
                       input_ids=list(prefix.input_ids), num_images=0,
                       next_position=int(batch.position_ids.amax()) + 1)

    def _generate_chunk(self, prompts, states, sampling, n, generator, stats, device, keep: bool = False,
                        emit=None) -> tuple[list[list[Completion]], list[list[KVState]]]:
        """Sample a chunk (prompts x n rows). emit: None or ``emit(row, token_id, logprob)`` per sampled token
        (``emit(row, token_id, logprob, top)`` with ``sampling.top_logprobs`` > 0, top a TopLogprobs)."""
        model = self.policy.model
        chat = self.policy.chat
        im_end = chat.im_end_id
        t0 = time.perf_counter()
        out, attn, next_pos = self._prefill(prompts, states, device, stats)
        cache = out.past_key_values
        logits = out.logits[:, -1]  # [B, V]
        banned = banned_mask(self.policy.banned_token_ids, logits.shape[-1], device)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attn = attn.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)
        if _PREALLOCATE and sampling.max_new_tokens > 1:
            cache.layers = [_GrowingLayer(layer.keys, layer.values, sampling.max_new_tokens - 1) for layer in cache.layers]
        stats.prefill_s += time.perf_counter() - t0

        t1 = time.perf_counter()
        rows = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        k_top = sampling.top_logprobs
        tops: list[list[TopLogprobs]] | None = [[] for _ in range(rows)] if k_top > 0 else None
        finish = ["length"] * rows
        stop_reason: list[str | None] = [None] * rows
        stops = tuple(sampling.stop)
        stop_tails = {x[-1] for x in stops}
        kept: list[KVState | None] = [None] * rows
        alive = torch.arange(rows, device=device)  # original row index of each live batch row
        for step in range(sampling.max_new_tokens):
            tok, lp, logp = _draw(logits, banned, sampling, generator)
            tok_l, lp_l, alive_l = tok.tolist(), lp.tolist(), alive.tolist()
            top_l = None
            if tops is not None:  # the step's k most likely, of the distribution lp is read from
                top_ids, top_vals = top_logprobs_of(logp, k_top)  # [R, k]
                top_l = [TopLogprobs(i, v) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
            keep_rows = []
            for j, r in enumerate(alive_l):
                tokens[r].append(tok_l[j])
                logps[r].append(lp_l[j])
                if top_l is not None:
                    tops[r].append(top_l[j])
                if tok_l[j] == im_end:
                    finish[r] = "stop"
                elif stops and (hit := self._stop_hit(tokens[r], stops, stop_tails)) is not None:
                    finish[r], stop_reason[r] = "stop", hit
                else:
                    keep_rows.append(j)
            if emit is not None:
                for j, r in enumerate(alive_l):
                    if top_l is None:
                        emit(r, tok_l[j], lp_l[j])
                    else:
                        emit(r, tok_l[j], lp_l[j], top_l[j])
            stats.generated_tokens += len(alive_l)
            last = not keep_rows or step == sampling.max_new_tokens - 1
            if keep:  # rows that end now: their cache holds the prompt and all but the last sampled token
                next_l = next_pos.tolist()
                for j, r in enumerate(alive_l):
                    if last or finish[r] == "stop":
                        kept[r] = self._kv_state(cache, attn, j, prompts[r // n], tokens[r], next_l[j])
            if last:
                break
            if len(keep_rows) < len(alive_l):
                idx = torch.tensor(keep_rows, device=device)
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
        states_out: list[list[KVState]] = []
        for i in range(len(prompts)):
            results.append([Completion(tokens[r], logps[r], self._text(tokens[r], stop_reason[r]), finish[r],
                                       stop_reason[r], None if tops is None else tops[r])
                             for r in range(i * n, (i + 1) * n)])
            if keep:
                states_out.append([kept[r] for r in range(i * n, (i + 1) * n)])
        return results, states_out

    def _piece(self, token_id: int) -> str:
        """The text of one token id (cached per id: the stop check decodes each new token once)."""
        if token_id not in self._pieces:
            self._pieces[token_id] = self.policy.chat.decode([token_id])
        return self._pieces[token_id]

    def _stop_hit(self, tokens: list[int], stops: tuple[str, ...], tails: set[str]) -> str | None:
        """The stop string the completion ``tokens`` now contains, or None. Only decoded when the
        newest token holds a stop string's last character (or part of a character); an earlier
        occurrence would have ended it already, so a window of the last 4 * len(stop) tokens suffices
        (a UTF-8 character spans at most 4 byte-level tokens)."""
        piece = self._piece(tokens[-1])
        if "\ufffd" not in piece and not any(c in piece for c in tails):  # (a token may hold part of a character)
            return None
        window = self.policy.chat.decode(tokens[-4 * max(len(x) for x in stops):])
        return next((x for x in stops if x in window), None)

    def _text(self, tokens: list[int], stop: str | None) -> str:
        text = self.policy.chat.decode(tokens)
        at = -1 if stop is None else text.find(stop)
        return text if at < 0 else text[: at + len(stop)]

    @staticmethod
    def _kv_state(cache, attn: torch.Tensor, j: int, prompt: PromptInput, tokens: list[int], next_position: int) -> KVState:
        """Batch row ``j`` of ``cache`` (padding dropped by ``attn`` [R, L]) as a KVState of ``prompt``
        followed by ``tokens`` without the last one."""
        real = attn[j].bool()  # [L]
        ids = _ids_list(prompt.input_ids) + list(tokens[:-1])
        keys = [layer.keys[j][:, real] for layer in cache.layers]  # [H_kv, L_j, D] each (a copy)
        values = [layer.values[j][:, real] for layer in cache.layers]
        if keys and keys[0].shape[1] != len(ids):
            raise RuntimeError(f"internal: a kept KV cache has {keys[0].shape[1]} positions for {len(ids)} tokens")
        num_images = 0 if prompt.image_grid_thw is None else int(prompt.image_grid_thw.reshape(-1, 3).shape[0])
        return KVState(keys=keys, values=values, input_ids=ids, num_images=num_images, next_position=int(next_position))


def _row_callback(on_token: TokenCallback, first_prompt: int, n: int) -> Callable[..., None]:
    """``emit(row, token_id, logprob[, top])`` for the rows of a chunk whose first prompt is ``first_prompt``: rows
    are prompt-major (n per prompt, with or without a shared prefill), so row r is sample r % n of prompt r // n;
    ``top`` (a TopLogprobs, only with ``SamplingParams.top_logprobs`` > 0) is passed on as on_token's fifth argument."""

    def emit(row: int, token_id: int, logprob: float, *top: TopLogprobs) -> None:
        on_token(first_prompt + row // n, row % n, token_id, logprob, *top)

    return emit


#: Decode into KV buffers with room for the new tokens (_GrowingLayer) instead of transformers'
#: DynamicLayer, which concatenates the whole cache at every step.
_PREALLOCATE = True


class _GrowingLayer(DynamicLayer):
    """A transformers DynamicLayer that writes new keys/values into a zero-filled buffer with ``reserve`` spare
    positions, instead of concatenating the whole cache every decode step.

    ``keys`` / ``values`` are views [B, H_kv, L, D] of the filled part (what the cache holds), but ``update``
    hands attention the whole buffer [B, H_kv, C, D] (C = capacity), and ``get_mask_sizes`` announces C keys, so
    transformers' mask pads the 2D attention mask with False over the unfilled positions (which also lie in the
    query's causal future). Attention over a contiguous buffer skips the copy a strided view costs every layer
    and step: the matmul of a bf16 decode query with a [B, H_kv, L, D] view of a larger buffer copied it first
    (1.0 ms against 0.23 ms a layer at issue 15's sizes, bench/bench_vs_trl.py). The unfilled positions are
    zeros, masked, so they get softmax weight exactly 0 and add nothing (within float32 rounding of the sums)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, reserve: int) -> None:
        super().__init__()
        b, h, length, d = keys.shape
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._k = keys.new_zeros(b, h, length + reserve, d)  # [B, H_kv, C, D]; zeros: masked keys never meet NaN
        self._v = values.new_zeros(b, h, length + reserve, d)
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self._len = length
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._len], self._v[:, :, : self._len]

    def _make_room(self, n: int) -> None:
        if self._len + n > self._k.shape[-2]:  # out of room: grow (not expected within max_new_tokens)
            extra = max(n, 16)
            self._k = torch.cat([self._k, self._k.new_zeros(*self._k.shape[:2], extra, self._k.shape[-1])], dim=-2)
            self._v = torch.cat([self._v, self._v.new_zeros(*self._v.shape[:2], extra, self._v.shape[-1])], dim=-2)
            self._views()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        self._make_room(n)
        self._k[:, :, self._len : self._len + n] = key_states
        self._v[:, :, self._len : self._len + n] = value_states
        self._len += n
        self._views()
        return self._k, self._v  # the whole buffer; positions >= _len are masked (get_mask_sizes)

    def get_seq_length(self) -> int:
        return self._len

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        self._make_room(query_length)  # the capacity announced here is the key length update() returns
        return self._k.shape[-2], 0

    def get_max_cache_shape(self) -> int:
        return -1

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k, self._v = self._k.repeat_interleave(repeats, dim=0), self._v.repeat_interleave(repeats, dim=0)
        self._views()


def make_engine(policy, **kwargs) -> TransformersEngine:
    """The rollout engine of the native backend for ``policy`` (kwargs: TransformersEngine's)."""
    return TransformersEngine(policy, **kwargs)
