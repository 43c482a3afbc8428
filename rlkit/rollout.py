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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlkit.env_check import step_error
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

    @property
    def num_policy_tokens(self) -> int:
        """The policy tokens of this sequence (the loss mask's 1s)."""
        return int(sum(self.loss_mask))


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
    chat = policy.chat
    live: list[_Live] = []
    for g, seed in enumerate(seeds):
        for _ in range(group_size):
            live.append(_Live(env=env_spec.make(), seed=seed, group=g))

    # Turn 0: one prompt per task, G samples each.
    prompts = _first_prompts(live, seeds, group_size, chat)
    reuse_kv = bool(getattr(engine, "reuse_kv", False)) and env_spec.max_turns > 1
    if reuse_kv:
        outs, states = engine.generate_cached(prompts, _with_n(sampling, group_size))
        for ep, st in zip(live, (s for per_prompt in states for s in per_prompt)):
            ep.kv = st
        del states
    else:
        outs = engine.generate(prompts, _with_n(sampling, group_size))
    completions = [c for per_prompt in outs for c in per_prompt]  # [B*G], groups contiguous
    _apply(live, list(range(len(live))), completions, chat, env_spec.max_turns)

    _later_turns(live, engine, sampling, chat, env_spec.max_turns, reuse_kv)
    return [_trajectory(ep, policy_version) for ep in live]


def _first_prompts(live: list[_Live], seeds: list[int], group_size: int, chat: Any) -> list[Any]:
    """Turn 0 of a rollout: reset the G episodes of each task (``live``, groups contiguous) on its seed, append the
    first user turn (system prompt included) to each, and return one PromptInput per task (B of them)."""
    from rlkit.policy import PromptInput  # local: rlkit.policy imports transformers

    first_turns, first_sources = [], []
    for g, seed in enumerate(seeds):
        members = live[g * group_size : (g + 1) * group_size]
        obs = members[0].env.reset(seed)
        for m in members[1:]:
            m.env.reset(seed)
        tt = chat.user_turn(obs.text, obs.images, system=members[0].env.system_prompt, first=True)
        first_turns.append(tt)
        first_sources.append(list(obs.images))
        for m in members:
            m.append(tt.input_ids, 0)
            m.images.extend(tt.image_inputs)
            m.sources.extend(obs.images)
    return [
        PromptInput(input_ids=tt.input_ids, images=src, **chat.concat_images(tt.image_inputs))
        for tt, src in zip(first_turns, first_sources)
    ]


def _later_turns(live: list[_Live], engine: Any, sampling: Any, chat: Any, max_turns: int, reuse_kv: bool) -> None:
    """Turns 1, 2, ... of a rollout until every episode is done: each live episode has its own history (its whole
    conversation, or with ``reuse_kv`` its KV state and new tokens), and each turn its own draws (``turn_seed``)."""
    from rlkit.policy import PromptInput  # local: rlkit.policy imports transformers

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
        _apply(live, active, [o[0] for o in outs], chat, max_turns)


def _trajectory(ep: _Live, policy_version: int) -> Trajectory:
    """The finished episode ``ep`` as a Trajectory (its Episode record: terminated when its last turn was done,
    else truncated, and the env's success)."""
    last_done = bool(ep.turns and ep.turns[-1].done)
    record = Episode(
        seed=ep.seed,
        turns=ep.turns,
        terminated=last_done,
        truncated=not last_done,
        success=bool(ep.env.success()),
    )
    return Trajectory(
        input_ids=ep.ids,
        loss_mask=ep.mask,
        sampling_logprobs=ep.logprobs,
        image_inputs=ep.images,
        episode=record,
        group=ep.group,
        policy_version=policy_version,
        num_truncated_turns=ep.length_cut,
    )


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


def _apply(live: list[_Live], idx: list[int], completions: list[Any], chat: Any, max_turns: int) -> None:
    """Append each sampled completion, step its env, and append the next observation."""
    for i, comp in zip(idx, completions, strict=True):
        ep = live[i]
        ep.append(list(comp.token_ids), 1, list(comp.logprobs))
        ep.append(chat.turn_end_ids(comp.finish_reason, getattr(comp, "stop_reason", None)), 0)
        if comp.finish_reason == "length":
            ep.length_cut += 1
        try:
            out = ep.env.step(comp.text)
        except Exception as e:  # the env's bug, not the loop's: name its class and contract, keep its frame
            raise step_error(ep.env, comp.text, e) from e
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
        tt = chat.user_turn(out.observation.text, out.observation.images, system=None, first=False)
        ep.append(tt.input_ids, 0)
        ep.images.extend(tt.image_inputs)
        ep.sources.extend(out.observation.images)


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
