"""Rollout: run G episodes per task with the policy and record token-level trajectories.

All episodes of a call advance in lockstep, one policy turn at a time, so each turn is one batched
``engine.generate`` call. On the first turn the G episodes of a task share their prompt, so the
engine is asked for ``n = G`` samples of each distinct prompt (it can prefill the shared prompt once).

Multi-turn without re-prefill: when the engine offers it (``engine.reuse_kv``, e.g.
rlkit.policy.engine.TransformersEngine; ``rollout.reuse_kv_cache`` in the config), each live
episode keeps the KV state its last turn left (``engine.generate_cached``), so a later turn
prefills only its new tokens and image; the state is dropped as soon as the episode ends. Same
tokens and logprobs as re-prefilling the conversation every turn (within float32 rounding).

Random draws: every engine call draws from a fresh generator seeded with ``sampling.seed`` (rlkit's engine and
the vLLM worker alike), so turn ``t >= 1`` of a rollout samples with ``turn_seed(sampling.seed, t)``, a seed of
its own derived from the step's seed and the turn. Without it every turn of an episode would draw the same
uniforms at the same token positions (the same quantile of the policy's distribution each turn). Turn 0 keeps
``sampling.seed``, so one-turn (plan-mode) rollouts sample exactly as before; a rerun or a resume with the same
seed draws the same noise.

Trajectories are built token by token and never re-tokenized: the ids the policy sampled are the ids
the update trains on, and the loss mask is 1 exactly on them (user messages, images, chat-template
glue and padding are 0). This is what lets the sampling logprobs serve as the "old" logprobs of the
first update pass.

Token layout of one trajectory (Qwen chat format; see rlkit.policy.chat):
    [system + user turn 0 + assistant header] [completion 0] [turn end]
    [user turn 1 + assistant header] [completion 1] [turn end] ...

History window (``history_images=k``, config ``rollout.history_images``; None = every picture kept, the
layout above, this module's code path unchanged): a turn's context shows only the last k pictures of the
conversation; an older user turn keeps its text and loses its pictures (rendered by ``chat.user_turn`` with
fewer images; sampled ids are never re-tokenized). Dropping a picture changes tokens in the middle of the
conversation, so turn t's context is then not turn t-1's context + its completion, and one sequence per
episode would train tokens in a context they were not sampled in. So an episode is cut into *segments*:
a segment is one token stream that only ever extends, holding the turns sampled in it (turns 0..k-1 share
the first; from turn k on, while each turn drops a picture, every turn opens a segment of its own whose
context carries the earlier completions as context, loss mask 0). Each segment's loss mask is 1 exactly on
the tokens sampled in that very context, its sampling logprobs are theirs, so the update scores every
sampled token in the context it was sampled in (``training_sequences``: one training sequence per segment,
each with the episode's advantage; under ``token_mean`` the loss is the episode's). Segments of one episode
are ``Trajectory.input_ids`` etc. (the first) and ``Trajectory.segments`` (the later ones). KV reuse: within
a segment as without a window; at a segment's start the kept state is cut to the part of the conversation
both contexts share (``engine.trim_state``: the text before the dropped picture), so a new segment prefills
only what follows it: the dropped picture's turn as text, the later turns and the new turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlkit.types import EnvSpec, Episode, Turn


@dataclass
class Trajectory:
    """One episode as the policy saw it.

    input_ids: [T] every token of the conversation.
    loss_mask: [T] 1 on tokens the policy sampled, else 0.
    sampling_logprobs: [T] logprob of each sampled token under the sampling policy, 0 elsewhere.
    image_inputs: processed images of the conversation, in order (each with pixel_values
        [P_i, D] float32 and image_grid_thw [1, 3] long), concatenated by the policy's chat format.
    episode: the env-level record a reward function reads.
    group: index of the task in the step (the G samples of a task share it).
    policy_version: the adapter version that sampled it: the number of GRPO updates applied to the
        weights (0 = before the first update, so training step s samples with s - 1; an evaluation
        after step s has s; -1 = not sampled, e.g. SFT demonstrations). The same in every backend.
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    image_inputs: list[Any]
    episode: Episode
    group: int
    policy_version: int
    num_truncated_turns: int = 0
    #: the episode's later segments under a history window (module doc), in turn order; [] = one sequence
    segments: list["Segment"] = field(default_factory=list)

    @property
    def num_policy_tokens(self) -> int:
        """The policy tokens of this episode (the loss masks' 1s, all segments)."""
        return int(sum(self.loss_mask)) + sum(int(sum(s.loss_mask)) for s in self.segments)

    @property
    def num_tokens(self) -> int:
        """Token positions of all of this episode's sequences (its segments' lengths summed)."""
        return len(self.input_ids) + sum(len(s.input_ids) for s in self.segments)


@dataclass
class Segment:
    """One later segment of a windowed episode (module doc): input_ids, loss_mask, sampling_logprobs [T_s] and
    image_inputs as in Trajectory, for the context the segment's turns were sampled in."""

    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    image_inputs: list[Any]


def training_sequences(trajectories: list[Trajectory], advantages: torch.Tensor) -> tuple[list[Trajectory], torch.Tensor]:
    """The sequences the update trains on: each trajectory, then each of its ``segments`` as a Trajectory of its
    own (same episode, group, version and truncation count, ``segments`` []), in order; advantages [N] float32
    repeated per segment -> [N'] (N' = N + total segments). Trajectories without segments come back as they are,
    so without a history window the result is the input. Raises ValueError when len(advantages) != N."""
    if len(advantages) != len(trajectories):
        raise ValueError(f"{len(advantages)} advantages for {len(trajectories)} trajectories")
    if not any(getattr(t, "segments", None) for t in trajectories):  # (duck-typed sequences have none)
        return trajectories, advantages
    seqs, index = [], []
    for i, t in enumerate(trajectories):
        seqs.append(replace(t, segments=[]))
        index.append(i)
        for s in t.segments:
            seqs.append(replace(t, input_ids=s.input_ids, loss_mask=s.loss_mask, sampling_logprobs=s.sampling_logprobs,
                                image_inputs=s.image_inputs, segments=[]))
            index.append(i)
    return seqs, advantages[torch.tensor(index, dtype=torch.long)]


@dataclass
class _Live:
    env: Any
    seed: int
    group: int
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    sources: list[Any] = field(default_factory=list)  # the images as the env gave them (PromptInput.images)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    length_cut: int = 0
    kv: Any = None  # the engine's KV state after the last turn (engine.reuse_kv), None once done
    # history window only (module doc): the conversation as blocks (_UserBlock, or the ids of a completion and
    # its turn end), and the segments closed so far; ids/mask/logprobs/images/sources are the open segment's
    blocks: list[Any] = field(default_factory=list)
    closed: list[Segment] = field(default_factory=list)

    def append(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.ids.extend(ids)
        self.mask.extend([mask_value] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


@dataclass
class _UserBlock:
    """A user turn as the env gave it (text, PIL images, system prompt for the first), rendered on demand with
    its last m pictures (``tokens``; the rendering with all of them is made once and shared by a group)."""

    text: str
    images: list[Any]
    system: str | None
    first: bool
    variants: dict[int, Any] = field(default_factory=dict)  # pictures kept -> TurnTokens

    def tokens(self, chat: Any, m: int) -> Any:
        if m not in self.variants:
            self.variants[m] = chat.user_turn(self.text, self.images[len(self.images) - m :], system=self.system,
                                              first=self.first)
        return self.variants[m]


def rollout(
    env_spec: EnvSpec,
    policy: Any,
    engine: Any,
    seeds: list[int],
    group_size: int,
    sampling: Any,
    policy_version: int,
    history_images: int | None = None,
) -> list[Trajectory]:
    """Run ``group_size`` episodes on each task seed; return B*G trajectories, groups contiguous.

    Args:
        env_spec: the EnvSpec (``make()``, ``max_turns``).
        policy: the Policy (its ``chat`` format turns observations into tokens).
        engine: a rollout engine with ``generate(prompts, sampling) -> list[list[Completion]]``.
        seeds: B task seeds. group_size: G. sampling: SamplingParams (``n`` is set here).
        policy_version: recorded in every trajectory.
        history_images: None = every picture stays in the conversation (one sequence per episode); k >= 1 = each
            turn's context shows only the last k pictures (module doc, "History window"; ``rollout.history_images``).

    Returns: list of length B*G; trajectory i belongs to task i // G.

    Raises: ValueError for history_images < 1.
    """
    from rlkit.policy import PromptInput  # local: rlkit.policy imports transformers

    if history_images is not None and (isinstance(history_images, bool) or int(history_images) != history_images
                                       or history_images < 1):
        raise ValueError(f"history_images={history_images!r} must be null (keep every picture) or an integer >= 1")
    window = None if history_images is None else int(history_images)
    chat = policy.chat
    live: list[_Live] = []
    for g, seed in enumerate(seeds):
        for _ in range(group_size):
            live.append(_Live(env=env_spec.make(), seed=seed, group=g))

    # Turn 0: one prompt per task, G samples each.
    first_turns, first_sources = [], []
    for g, seed in enumerate(seeds):
        members = live[g * group_size : (g + 1) * group_size]
        obs = members[0].env.reset(seed)
        for m in members[1:]:
            m.env.reset(seed)
        tt = chat.user_turn(obs.text, obs.images, system=members[0].env.system_prompt, first=True)
        sources = list(obs.images)
        if window is not None:  # one block per group: its renderings are made once
            block = _UserBlock(obs.text, list(obs.images), members[0].env.system_prompt, True, {len(obs.images): tt})
            kept = min(len(obs.images), window)
            tt, sources = block.tokens(chat, kept), sources[len(sources) - kept :]
            for m in members:
                m.blocks.append(block)
        first_turns.append(tt)
        first_sources.append(sources)
        for m in members:
            m.append(tt.input_ids, 0)
            m.images.extend(tt.image_inputs)
            m.sources.extend(sources)
    reuse_kv = bool(getattr(engine, "reuse_kv", False)) and env_spec.max_turns > 1
    prompts = [
        PromptInput(input_ids=tt.input_ids, images=src, **chat.concat_images(tt.image_inputs))
        for tt, src in zip(first_turns, first_sources)
    ]
    if reuse_kv:
        outs, states = engine.generate_cached(prompts, _with_n(sampling, group_size))
        for ep, st in zip(live, (s for per_prompt in states for s in per_prompt)):
            ep.kv = st
        del states
    else:
        outs = engine.generate(prompts, _with_n(sampling, group_size))
    completions = [c for per_prompt in outs for c in per_prompt]  # [B*G], groups contiguous
    _apply(live, list(range(len(live))), completions, chat, env_spec.max_turns, window, engine)

    # Later turns: each live episode has its own history, and each turn its own draws.
    turn = 0
    while True:
        active = [i for i, ep in enumerate(live) if not ep.done]
        if not active:
            break
        turn += 1
        turn_sampling = _with_n(replace(sampling, seed=turn_seed(sampling.seed, turn)), 1)
        prompts = [
            PromptInput(input_ids=list(live[i].ids), images=list(live[i].sources), **chat.concat_images(live[i].images))
            for i in active
        ]
        if reuse_kv:
            outs, states = engine.generate_cached(prompts, turn_sampling, [live[i].kv for i in active])
            for i, per_prompt in zip(active, states):
                live[i].kv = per_prompt[0]
            del states
        else:
            outs = engine.generate(prompts, turn_sampling)
        _apply(live, active, [o[0] for o in outs], chat, env_spec.max_turns, window, engine)

    trajectories = []
    for ep in live:
        last_done = bool(ep.turns and ep.turns[-1].done)
        record = Episode(
            seed=ep.seed,
            turns=ep.turns,
            terminated=last_done,
            truncated=not last_done,
            success=bool(ep.env.success()),
        )
        segments = [*ep.closed, Segment(ep.ids, ep.mask, ep.logprobs, ep.images)]  # one, without a window
        first = segments[0]
        trajectories.append(
            Trajectory(
                input_ids=first.input_ids,
                loss_mask=first.loss_mask,
                sampling_logprobs=first.sampling_logprobs,
                image_inputs=first.image_inputs,
                episode=record,
                group=ep.group,
                policy_version=policy_version,
                num_truncated_turns=ep.length_cut,
                segments=segments[1:],
            )
        )
    return trajectories


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of turn ``turn`` (0-based) of a rollout whose calls share ``seed``.

    Turn 0 keeps ``seed``; a later turn gets a 63-bit seed hashed from (seed, turn) by NumPy's SeedSequence
    (its documented mixing of an entropy pool), so turns neither repeat each other's draws nor land on a nearby
    step's or rollout worker's seed (those are ``seed + k``: rlkit.sampling.step, rlkit.distributed.cluster).
    ``None`` (fresh randomness) stays None. Raises nothing for any int seed (negative ones are taken mod 2**64).
    """
    if seed is None or turn == 0:
        return seed
    import numpy as np

    state = np.random.SeedSequence([int(seed) % 2**64, int(turn)]).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def _with_n(sampling: Any, n: int) -> Any:
    return replace(sampling, n=n)


def _apply(live: list[_Live], idx: list[int], completions: list[Any], chat: Any, max_turns: int,
           window: int | None = None, engine: Any = None) -> None:
    """Append each sampled completion, step its env, and append the next observation (under a history window
    ``window``: the next turn's context, in the open segment or a new one: _advance)."""
    for i, comp in zip(idx, completions, strict=True):
        ep = live[i]
        ep.append(list(comp.token_ids), 1, list(comp.logprobs))
        turn_end = chat.turn_end_ids(comp.finish_reason, getattr(comp, "stop_reason", None))
        ep.append(turn_end, 0)
        if window is not None:
            ep.blocks.append([*comp.token_ids, *turn_end])
        if comp.finish_reason == "length":
            ep.length_cut += 1
        out = ep.env.step(comp.text)
        info = dict(out.info)
        ep.turns.append(
            Turn(
                action_text=comp.text,
                env_reward=float(out.reward),
                done=bool(out.done),
                info=info,
                finish_reason=comp.finish_reason,
            )
        )
        if out.done or len(ep.turns) >= max_turns or out.observation is None:
            ep.done = True
            ep.kv = None  # the episode's KV cache is not needed any more
            continue
        if window is not None:
            ep.blocks.append(_UserBlock(out.observation.text, list(out.observation.images), None, False))
            _advance(ep, window, chat, engine)
            continue
        tt = chat.user_turn(out.observation.text, out.observation.images, system=None, first=False)
        ep.append(tt.input_ids, 0)
        ep.images.extend(tt.image_inputs)
        ep.sources.extend(out.observation.images)


def _context(ep: _Live, window: int, chat: Any) -> tuple[list[int], list[Any], list[Any]]:
    """The conversation of ``ep.blocks`` with its last ``window`` pictures: (ids, ImageInputs, source images)."""
    kept, left = {}, window
    for b in reversed(ep.blocks):
        if isinstance(b, _UserBlock):
            kept[id(b)] = min(len(b.images), left)
            left -= kept[id(b)]
    ids: list[int] = []
    images: list[Any] = []
    sources: list[Any] = []
    for b in ep.blocks:
        if isinstance(b, _UserBlock):
            m = kept[id(b)]
            tt = b.tokens(chat, m)
            ids += tt.input_ids
            images += tt.image_inputs
            sources += b.images[len(b.images) - m :]
        else:
            ids += b
    return ids, images, sources


def _advance(ep: _Live, window: int, chat: Any, engine: Any) -> None:
    """Make the next turn's context the open segment: extend it when the context extends it (same tokens, the
    same ImageInputs), else close it and open a new one holding the whole context (loss mask 0), its KV state cut
    to the tokens both share (``engine.trim_state``; None when the engine has none: a full prefill)."""
    ids, images, sources = _context(ep, window, chat)
    n = len(ep.ids)
    if ids[:n] == ep.ids and len(images) >= len(ep.images) and all(a is b for a, b in zip(images, ep.images)):
        ep.append(ids[n:], 0)
        ep.images.extend(images[len(ep.images) :])
        ep.sources.extend(sources[len(ep.sources) :])
        return
    ep.closed.append(Segment(ep.ids, ep.mask, ep.logprobs, ep.images))
    if ep.kv is not None:
        trim = getattr(engine, "trim_state", None)
        ep.kv = None if trim is None else trim(ep.kv, _common_len(ep.kv.input_ids, ids))
    ep.ids, ep.mask, ep.logprobs, ep.images, ep.sources = [], [], [], list(images), list(sources)
    ep.append(ids, 0)


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((j for j in range(n) if a[j] != b[j]), n)


def rollout_stats(trajectories: list[Trajectory]) -> dict[str, float]:
    """Episode-level metrics: env/{mean_turns,parse_failures,success_rate,truncated} and generate/*."""
    n = max(len(trajectories), 1)
    eps = [t.episode for t in trajectories]
    policy_tokens = [t.num_policy_tokens for t in trajectories]
    return {
        "env/success_rate": sum(e.success for e in eps) / n,
        "env/mean_turns": sum(len(e.turns) for e in eps) / n,
        "env/parse_failures": sum(e.parse_failures for e in eps) / n,
        "env/truncated": sum(e.truncated for e in eps) / n,
        "generate/mean_tokens": sum(policy_tokens) / n,
        "generate/max_tokens": float(max(policy_tokens, default=0)),
        "generate/length_cut": sum(t.num_truncated_turns for t in trajectories) / n,
        "generate/mean_seq_len": sum(t.num_tokens for t in trajectories) / n,  # all segments (history window)
    }


def to_tensor(values: list[list[float]] | list[list[int]], dtype: torch.dtype, pad: float = 0) -> torch.Tensor:
    """Right-pad ragged lists into a [N, T_max] tensor."""
    t_max = max((len(v) for v in values), default=0)
    out = torch.full((len(values), t_max), pad, dtype=dtype)
    for i, v in enumerate(values):
        if v:
            out[i, : len(v)] = torch.tensor(v, dtype=dtype)
    return out
