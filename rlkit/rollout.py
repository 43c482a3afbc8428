"""Rollout: run G episodes per task with the policy and record token-level trajectories.

All episodes of a call advance in lockstep, one policy turn at a time, so each turn is one batched
``engine.generate`` call. On the first turn the G episodes of a task share their prompt, so the
engine is asked for ``n = G`` samples of each distinct prompt (it can prefill the shared prompt once).

Multi-turn without re-prefill: when the engine offers it (``engine.reuse_kv``, e.g.
rlkit.policy.engine.TransformersEngine; ``rollout.reuse_kv_cache`` in the config), each live
episode keeps the KV state its last turn left (``engine.generate_cached``), so a later turn
prefills only its new tokens and image; the state is dropped as soon as the episode ends. Same
tokens and logprobs as re-prefilling the conversation every turn (within float32 rounding).

Trajectories are built token by token and never re-tokenized: the ids the policy sampled are the ids
the update trains on, and the loss mask is 1 exactly on them (user messages, images, chat-template
glue and padding are 0). This is what lets the sampling logprobs serve as the "old" logprobs of the
first update pass.

Token layout of one trajectory (Qwen chat format; see rlkit.policy.chat):
    [system + user turn 0 + assistant header] [completion 0] [turn end]
    [user turn 1 + assistant header] [completion 1] [turn end] ...

Route pass (an env with ``route_context == "text"``, e.g. VisGym ``plan_map`` with ``env.route_context=text``):
the one policy turn is written in two passes. The first, with the picture, stops at ``env_spec.route_opening``
(``<answer>``: the policy's notes, the walls and both ends, then the opening); the second continues those same
tokens in a context of text alone (``rlkit.sft.route_prompt``: the env's prompt without the picture), where the
policy writes the route. The env acts on the two texts joined. The trajectory is the first pass's sequence, and
``Trajectory.continuation`` the second's, whose loss mask is 1 on the route only; both carry the episode's
advantage in the update (``with_continuations``). Layout of the continuation:
    [system + user turn 0 without the picture + assistant header] [notes + opening (mask 0)] [route] [turn end]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlkit.types import Episode, EnvSpec, Turn


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
    continuation: "Trajectory | None" = None  # the route pass's sequence (module doc), else None

    @property
    def num_policy_tokens(self) -> int:
        """The policy tokens of this sequence (the loss mask's 1s)."""
        return int(sum(self.loss_mask))

    @property
    def num_episode_tokens(self) -> int:
        """The policy tokens of the whole episode: this sequence's and its route pass continuation's."""
        return self.num_policy_tokens + (self.continuation.num_policy_tokens if self.continuation is not None else 0)


@dataclass
class _Live:
    env: Any
    seed: int
    group: int
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    length_cut: int = 0
    kv: Any = None  # the engine's KV state after the last turn (engine.reuse_kv), None once done
    continuation: Any = None  # the route pass's (ids, mask, logprobs), module doc

    def append(self, ids: list[int], mask_value: int, logprobs: list[float] | None = None) -> None:
        self.ids.extend(ids)
        self.mask.extend([mask_value] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def rollout(
    env_spec: EnvSpec,
    policy: Any,
    engine: Any,
    seeds: list[int],
    group_size: int,
    sampling: Any,
    policy_version: int,
) -> list[Trajectory]:
    """Run ``group_size`` episodes on each task seed; return B*G trajectories, groups contiguous.

    Args:
        env_spec: the EnvSpec (``make()``, ``max_turns``).
        policy: the Policy (its ``chat`` format turns observations into tokens).
        engine: a rollout engine with ``generate(prompts, sampling) -> list[list[Completion]]``.
        seeds: B task seeds. group_size: G. sampling: SamplingParams (``n`` is set here).
        policy_version: recorded in every trajectory.

    Returns: list of length B*G; trajectory i belongs to task i // G.
    """
    from rlkit.policy import PromptInput  # local: rlkit.policy imports transformers

    chat = policy.chat
    route_pass = route_in_text(env_spec)
    route_sampling = sampling
    if route_pass:  # the first pass ends at the route's opening (module doc); the second with the run's stops
        sampling = replace(sampling, stop=tuple(dict.fromkeys((*sampling.stop, env_spec.route_opening))))
    live: list[_Live] = []
    for g, seed in enumerate(seeds):
        for _ in range(group_size):
            live.append(_Live(env=env_spec.make(), seed=seed, group=g))

    # Turn 0: one prompt per task, G samples each.
    first_turns = []
    for g, seed in enumerate(seeds):
        members = live[g * group_size : (g + 1) * group_size]
        obs = members[0].env.reset(seed)
        for m in members[1:]:
            m.env.reset(seed)
        tt = chat.user_turn(obs.text, obs.images, system=members[0].env.system_prompt, first=True)
        first_turns.append(tt)
        for m in members:
            m.append(tt.input_ids, 0)
            m.images.extend(tt.image_inputs)
    reuse_kv = bool(getattr(engine, "reuse_kv", False)) and env_spec.max_turns > 1
    prompts = [
        PromptInput(input_ids=tt.input_ids, **chat.concat_images(tt.image_inputs)) for tt in first_turns
    ]
    if reuse_kv:
        outs, states = engine.generate_cached(prompts, _with_n(sampling, group_size))
        for ep, st in zip(live, (s for per_prompt in states for s in per_prompt)):
            ep.kv = st
        del states
    else:
        outs = engine.generate(prompts, _with_n(sampling, group_size))
    completions = [c for per_prompt in outs for c in per_prompt]  # [B*G], groups contiguous
    if route_pass:
        _route_pass(env_spec, policy, engine, route_sampling, live, completions)
    else:
        _apply(live, list(range(len(live))), completions, chat, env_spec.max_turns)

    # Later turns: each live episode has its own history.
    while True:
        active = [i for i, ep in enumerate(live) if not ep.done]
        if not active:
            break
        prompts = [
            PromptInput(input_ids=list(live[i].ids), **chat.concat_images(live[i].images)) for i in active
        ]
        if reuse_kv:
            outs, states = engine.generate_cached(prompts, _with_n(sampling, 1), [live[i].kv for i in active])
            for i, per_prompt in zip(active, states):
                live[i].kv = per_prompt[0]
            del states
        else:
            outs = engine.generate(prompts, _with_n(sampling, 1))
        _apply(live, active, [o[0] for o in outs], chat, env_spec.max_turns)

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
        continuation = None
        if ep.continuation is not None:  # the route pass's sequence: no image, the same episode
            ids, mask, logprobs = ep.continuation
            # the episode's length cuts on both sequences: overlong_filtering leaves the two out together
            continuation = Trajectory(ids, mask, logprobs, [], record, ep.group, policy_version, ep.length_cut)
        trajectories.append(
            Trajectory(
                input_ids=ep.ids,
                loss_mask=ep.mask,
                sampling_logprobs=ep.logprobs,
                image_inputs=ep.images,
                episode=record,
                group=ep.group,
                policy_version=policy_version,
                num_truncated_turns=ep.length_cut,
                continuation=continuation,
            )
        )
    return trajectories


def route_in_text(env_spec: Any) -> bool:
    """Whether ``env_spec`` asks for its route in a second context of text alone (module doc: route pass)."""
    return getattr(env_spec, "route_context", "picture") == "text"


def _with_n(sampling: Any, n: int) -> Any:
    return replace(sampling, n=n)


def _route_pass(env_spec: Any, policy: Any, engine: Any, sampling: Any, live: list[_Live],
                notes: list[Any]) -> None:
    """The route pass (module doc) of single-turn episodes ``live`` whose first pass sampled ``notes``
    (one Completion each): each first pass that ended at ``env_spec.route_opening`` is continued in the text
    context (one batched generate, one sample each); the env then acts on both texts joined. A first pass
    that ended otherwise (no opening: it wrote ``</answer>`` or ran out of tokens) is acted on alone, as the
    one-pass rollout would."""
    from rlkit.policy import PromptInput  # local: rlkit.policy imports transformers
    from rlkit.sft import route_prompt

    if env_spec.max_turns != 1:
        raise ValueError(f"the route pass needs single-turn episodes; this env has max_turns={env_spec.max_turns}")
    chat, opening = policy.chat, env_spec.route_opening
    prompt = list(route_prompt(env_spec, policy).input_ids)
    todo = [i for i, c in enumerate(notes) if c.finish_reason == "stop" and c.stop_reason == opening]
    routes: dict[int, Any] = {}
    if todo:
        # a seed of its own: seed + 1 is the next step's first pass (rlkit.backends.native draws seed + step)
        second = replace(sampling, n=1, seed=None if sampling.seed is None else sampling.seed + ROUTE_SEED_OFFSET)
        outs = engine.generate([PromptInput(input_ids=prompt + list(notes[i].token_ids)) for i in todo], second)
        routes = {i: out[0] for i, out in zip(todo, outs, strict=True)}
    for i, (ep, first) in enumerate(zip(live, notes, strict=True)):
        ep.append(list(first.token_ids), 1, list(first.logprobs))
        ep.append(chat.turn_end_ids(first.finish_reason, first.stop_reason), 0)
        route = routes.get(i)
        text, last = first.text, first
        token_ids = list(first.token_ids)
        if route is not None:
            text = chat.decode(list(first.token_ids)) + route.text  # every first-pass token's text, then the route
            token_ids += list(route.token_ids)
            end = chat.turn_end_ids(route.finish_reason, route.stop_reason)
            n_context = len(prompt) + len(first.token_ids)
            ep.continuation = (
                prompt + list(first.token_ids) + list(route.token_ids) + end,
                [0] * n_context + [1] * len(route.token_ids) + [0] * len(end),
                [0.0] * n_context + list(route.logprobs) + [0.0] * len(end),
            )
            last = route
        ep.length_cut += int(first.finish_reason == "length") + int(route is not None and route.finish_reason == "length")
        out = ep.env.step(text)
        info = dict(out.info)
        if isinstance(info.get("unexecuted_from"), int):  # counted over both passes' tokens; all in the route's
            info["unexecuted_tokens"] = tokens_from(chat.tokenizer, token_ids, info["unexecuted_from"])
        ep.turns.append(Turn(action_text=text, env_reward=float(out.reward), done=bool(out.done), info=info,
                             finish_reason=last.finish_reason))
        ep.done, ep.kv = True, None


def with_continuations(trajectories: list[Trajectory], advantages: torch.Tensor | None = None,
                       ) -> tuple[list[Trajectory], torch.Tensor | None]:
    """The sequences the update (or a supervised loss) trains on: every trajectory, then the route pass's
    continuation of each one that has one (module doc), each continuation with its trajectory's advantage and
    a group of its own (``group + CONTINUATION_GROUP``: the continuations of one task share their text prompt,
    which the shared-prefix forward then runs once). The returned trajectories carry no continuation, so a
    second call changes nothing. Returns (sequences, advantages [N'] or None when ``advantages`` is None);
    the input is returned as it is when no trajectory has a continuation.

    Each sequence counts once in the loss's reduction: under ``token_mean`` (the default) every policy token
    weighs the same, wherever it is; under the sequence reductions (``seq_mean_*``) an episode with a route pass
    counts as two sequences."""
    extra = [i for i, t in enumerate(trajectories) if getattr(t, "continuation", None) is not None]
    if not extra:
        return trajectories, advantages
    mains = [replace(t, continuation=None) for t in trajectories]
    # the group of the trajectory, which a backend may have renumbered (rlkit.distributed.cluster), not the copy's
    conts = [replace(trajectories[i].continuation, group=(trajectories[i].group or 0) + CONTINUATION_GROUP,
                     continuation=None) for i in extra]
    if advantages is None:
        return mains + conts, None
    idx = torch.tensor(extra, dtype=torch.long)
    return mains + conts, torch.cat([advantages, advantages[idx]])


#: Offset of a continuation's group id (``with_continuations``): apart from every task's group.
CONTINUATION_GROUP = 1 << 30

#: The route pass samples with the first pass's seed + this (apart from any other step's or worker's seed).
ROUTE_SEED_OFFSET = 1 << 40


def _apply(live: list[_Live], idx: list[int], completions: list[Any], chat: Any, max_turns: int) -> None:
    """Append each sampled completion, step its env, and append the next observation."""
    for i, comp in zip(idx, completions, strict=True):
        ep = live[i]
        ep.append(list(comp.token_ids), 1, list(comp.logprobs))
        ep.append(chat.turn_end_ids(comp.finish_reason, getattr(comp, "stop_reason", None)), 0)
        if comp.finish_reason == "length":
            ep.length_cut += 1
        out = ep.env.step(comp.text)
        info = dict(out.info)
        if isinstance(info.get("unexecuted_from"), int):
            info["unexecuted_tokens"] = tokens_from(chat.tokenizer, list(comp.token_ids), info["unexecuted_from"])
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
        tt = chat.user_turn(out.observation.text, out.observation.images, system=None, first=False)
        ep.append(tt.input_ids, 0)
        ep.images.extend(tt.image_inputs)


def tokens_from(tokenizer: Any, token_ids: list[int], offset: int) -> int:
    """How many of ``token_ids`` (one sampled turn) start at or after character ``offset`` of their text.

    An env that acted on only the first ``offset`` characters of a turn (``info["unexecuted_from"]``,
    e.g. a VisGym plan that ended at a wall) leaves this many trailing tokens unexecuted; Turn.info
    records it as ``unexecuted_tokens`` for ``algorithm.mask_unexecuted``. Token j starts at
    ``len(decode(token_ids[:j]))``. Returns 0..len(token_ids).
    """
    for j in range(len(token_ids)):
        if len(tokenizer.decode(token_ids[:j])) >= offset:
            return len(token_ids) - j
    return 0


def rollout_stats(trajectories: list[Trajectory]) -> dict[str, float]:
    """Episode-level metrics: env/{mean_turns,parse_failures,success_rate,truncated}, generate/* (a route
    pass's tokens count in its episode's generate/mean_tokens and max_tokens; mean_seq_len is the first pass's)."""
    n = max(len(trajectories), 1)
    eps = [t.episode for t in trajectories]
    policy_tokens = [t.num_episode_tokens for t in trajectories]
    return {
        "env/success_rate": sum(e.success for e in eps) / n,
        "env/mean_turns": sum(len(e.turns) for e in eps) / n,
        "env/parse_failures": sum(e.parse_failures for e in eps) / n,
        "env/truncated": sum(e.truncated for e in eps) / n,
        "generate/mean_tokens": sum(policy_tokens) / n,
        "generate/max_tokens": float(max(policy_tokens, default=0)),
        "generate/length_cut": sum(t.num_truncated_turns for t in trajectories) / n,
        "generate/mean_seq_len": sum(len(t.input_ids) for t in trajectories) / n,
    }


def to_tensor(values: list[list[float]] | list[list[int]], dtype: torch.dtype, pad: float = 0) -> torch.Tensor:
    """Right-pad ragged lists into a [N, T_max] tensor."""
    t_max = max((len(v) for v in values), default=0)
    out = torch.full((len(values), t_max), pad, dtype=dtype)
    for i, v in enumerate(values):
        if v:
            out[i, : len(v)] = torch.tensor(v, dtype=dtype)
    return out
