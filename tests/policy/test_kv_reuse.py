"""Multi-turn without re-prefill: kept KV caches give the same tokens and logprobs as re-prefilling.

``TransformersEngine(reuse_kv=True)`` makes rlkit.rollout keep each episode's KV state across turns
(``generate_cached``) and prefill only the new user turn; ``reuse_kv=False`` re-prefills the whole
conversation every turn. Both must sample the same tokens with the same logprobs (float32 rounding:
the batch shapes differ, so sums run in another order) for seeded multi-turn episodes with images,
including groups whose episodes end at different turns and turns cut by max_new_tokens.
"""

from __future__ import annotations

import pytest
import torch

from rlkit.policy import PromptInput, SamplingParams, TransformersEngine
from rlkit.rollout import rollout
from rlkit.types import Observation, StepOutput

from .conftest import maze_image, perturb_lora

ATOL = 1e-5


@pytest.fixture
def policy(make_policy):
    p = make_policy()
    perturb_lora(p.model, seed=3, scale=0.05)
    chat = p.chat
    with torch.no_grad():  # make <|im_end|> likely enough that some turns stop and others are cut
        w = p.hf_model.lm_head.weight
        w[chat.im_end_id] += 0.5 * w[chat.im_end_id].sign()
    return p


class _Env:
    """A scripted multi-turn env: images every turn (two on odd turns), done when the action's text
    length is divisible by 4, so the episodes of one group end at different turns."""

    system_prompt = "Find the exit."

    def __init__(self) -> None:
        self.seed, self.turn = 0, 0

    def reset(self, seed: int) -> Observation:
        self.seed, self.turn = seed, 0
        return Observation(f"Maze {seed}. Which way?", [maze_image(seed)])

    def step(self, action_text: str) -> StepOutput:
        self.turn += 1
        if len(action_text) % 4 == 0:
            return StepOutput(None, 1.0, True, {"parse_ok": True})
        images = [maze_image(100 * self.seed + self.turn + k) for k in range(1 + self.turn % 2)]
        return StepOutput(Observation(f"turn {self.turn}: you wrote {len(action_text)} chars", images), 0.0, False)

    def success(self) -> bool:
        return False


class _Spec:
    eval_set_name = "scripted"

    def __init__(self, max_turns: int) -> None:
        self.max_turns = max_turns

    def make(self):
        return _Env()

    def eval_seeds(self):
        return [0]

    def is_eval_seed(self, seed):
        return False


class _Counting:
    """Wraps an engine, recording each call's prompt tokens (prefilled) and cached tokens."""

    def __init__(self, engine) -> None:
        self.engine, self.reuse_kv, self.calls = engine, engine.reuse_kv, []

    def _record(self):
        st = self.engine.last_stats
        self.calls.append((st.prompt_tokens, st.extra.get("cached_tokens", 0)))

    def generate(self, prompts, sampling):
        out = self.engine.generate(prompts, sampling)
        self._record()
        return out

    def generate_cached(self, prompts, sampling, states=None):
        out = self.engine.generate_cached(prompts, sampling, states)
        self._record()
        return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for ta, tb in zip(a, b):
        assert ta.input_ids == tb.input_ids
        assert ta.loss_mask == tb.loss_mask
        assert [t.finish_reason for t in ta.episode.turns] == [t.finish_reason for t in tb.episode.turns]
        diff = (torch.tensor(ta.sampling_logprobs) - torch.tensor(tb.sampling_logprobs)).abs().max().item()
        assert diff <= ATOL, diff


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_cached_rollout_equals_reprefill(policy, temperature):
    spec = _Spec(max_turns=5)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=6, seed=11)
    # plain: every prompt prefilled whole (no shared prompt prefix either), so its prompt_tokens are whole prompts
    plain = _Counting(TransformersEngine(policy, reuse_kv=False, share_prompt_prefix=False))
    cached = _Counting(TransformersEngine(policy, reuse_kv=True))
    a = rollout(spec, policy, plain, seeds=[1, 2, 3], group_size=3, sampling=sampling, policy_version=0)
    b = rollout(spec, policy, cached, seeds=[1, 2, 3], group_size=3, sampling=sampling, policy_version=0)
    _assert_same(a, b)
    turns = [len(t.episode.turns) for t in b]
    if temperature > 0:  # the test covers what it claims: episodes ending at different turns, both finishes
        assert len(set(turns)) >= 3, turns
        assert len(set(turns[:3])) > 1 or len(set(turns[3:6])) > 1 or len(set(turns[6:])) > 1, turns
        reasons = {t.finish_reason for tr in b for t in tr.episode.turns}
        assert reasons == {"stop", "length"}, reasons
    assert max(turns) >= 2  # at least one turn continued from a kept state
    # later turns prefill only the new tokens: the rest of each re-prefilled prompt comes from the kept states
    assert len(plain.calls) == len(cached.calls)
    for (full, _), (new, kept) in zip(plain.calls[1:], cached.calls[1:]):
        assert new + kept == full and kept > 0
    # the sampling logprobs are still the training logprobs (what the update relies on)
    policy.model.eval()
    with torch.no_grad():
        lp, _ = policy.logprobs(b, temperature=temperature if temperature > 0 else 1.0, with_entropy=False)
    for i, t in enumerate(b):
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        got = torch.tensor(t.sampling_logprobs)[m]
        assert (lp[i, : len(t.input_ids)][m] - got).abs().max().item() < 1e-4


def test_cached_rollout_with_stop_strings_equals_reprefill(policy):
    """Turns ended by a stop string keep their KV state like turns ended by <|im_end|>; the turn is
    closed with <|im_end|> "\\n" (loss mask 0) before the next user turn."""
    spec = _Spec(max_turns=4)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11, stop=("e", "a"))
    a = rollout(spec, policy, TransformersEngine(policy, reuse_kv=False), seeds=[1, 2], group_size=3,
                sampling=sampling, policy_version=0)
    b = rollout(spec, policy, TransformersEngine(policy, reuse_kv=True), seeds=[1, 2], group_size=3,
                sampling=sampling, policy_version=0)
    _assert_same(a, b)
    by_string = [t.action_text for tr in b for t in tr.episode.turns if t.action_text.endswith(("e", "a"))]
    assert by_string and max(len(tr.episode.turns) for tr in b) >= 2
    im_end = policy.chat.im_end_id
    for tr in b:  # a sampled <|im_end|> (loss mask 1) only in turns that no stop string ended
        sampled = sum(1 for t, m in zip(tr.input_ids, tr.loss_mask) if t == im_end and m == 1)
        by_end = [t for t in tr.episode.turns if t.finish_reason == "stop" and not set("ea") & set(t.action_text)]
        assert sampled == len(by_end)


def test_cached_rollout_on_visgym_interactive(policy):
    from envs.visgym import VisGymMaze

    env = VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=4)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    a = rollout(env, policy, TransformersEngine(policy, reuse_kv=False), seeds=[7, 8], group_size=2,
                sampling=sampling, policy_version=0)
    b = rollout(env, policy, TransformersEngine(policy, reuse_kv=True), seeds=[7, 8], group_size=2,
                sampling=sampling, policy_version=0)
    _assert_same(a, b)
    assert max(len(t.episode.turns) for t in b) == 4
    assert all(len(t.image_inputs) == len(t.episode.turns) for t in b)  # one new maze image per turn


def _turn(policy, text, seed, first):
    tt = policy.chat.user_turn(text, [maze_image(seed)], system="Solve." if first else None, first=first)
    return tt


def test_generate_cached_states_mixed_and_reusable(policy):
    """A batch mixing prompts with and without a state; a state read twice gives the same result."""
    chat = policy.chat
    eng = TransformersEngine(policy)
    sp = SamplingParams(temperature=1.0, max_new_tokens=5, n=2, seed=3)
    t0 = [_turn(policy, "Step " * (1 + 4 * i) + "which way?", i, True) for i in range(2)]
    prompts = [PromptInput(t.input_ids, **chat.concat_images(t.image_inputs)) for t in t0]
    outs, states = eng.generate_cached(prompts, sp)
    assert len(states) == 2 and all(len(s) == 2 for s in states)
    st = states[0][1]
    comp = outs[0][1]
    assert st.input_ids == prompts[0].input_ids + comp.token_ids[:-1] and st.num_images == 1
    assert st.keys[0].shape[1] == st.num_tokens
    # turn 2 of conversation 0 (continued from its state) next to a fresh prompt without a state
    nxt = _turn(policy, "again", 9, False)
    ids = list(prompts[0].input_ids) + comp.token_ids + chat.turn_end_ids(comp.finish_reason) + nxt.input_ids
    conv = PromptInput(ids, **chat.concat_images(t0[0].image_inputs + nxt.image_inputs))
    fresh = prompts[1]
    sp1 = SamplingParams(temperature=1.0, max_new_tokens=5, n=1, seed=4)
    ref = eng.generate([conv, fresh], sp1)
    for _ in range(2):  # the state is not consumed
        got, _ = eng.generate_cached([conv, fresh], sp1, [st, None])
        for g, r in zip(got, ref):
            assert g[0].token_ids == r[0].token_ids
            assert max(abs(x - y) for x, y in zip(g[0].logprobs, r[0].logprobs)) <= ATOL


def test_generate_cached_rejects_a_state_of_another_conversation(policy):
    chat = policy.chat
    eng = TransformersEngine(policy)
    sp = SamplingParams(temperature=0.0, max_new_tokens=3, n=1)
    a, b = (_turn(policy, t, s, True) for t, s in (("left", 1), ("right maze", 2)))
    pa = PromptInput(a.input_ids, **chat.concat_images(a.image_inputs))
    pb = PromptInput(b.input_ids + [chat.im_end_id], **chat.concat_images(b.image_inputs))
    _, states = eng.generate_cached([pa], sp)
    with pytest.raises(ValueError, match="not a proper prefix"):
        eng.generate_cached([pb], sp, [states[0][0]])
    with pytest.raises(ValueError, match="KV states for"):
        eng.generate_cached([pa, pb], sp, [None])


def test_switch_selects_the_path(policy):
    """rollout.reuse_kv_cache (default true) composes; reuse_kv=False never calls generate_cached."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    import rlkit.config  # noqa: F401  registers the schema
    from rlkit.config import RolloutConfig
    from rlkit.run import to_dataclass

    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        on = compose(config_name="train", overrides=["env=visgym_interactive"])
        off = compose(config_name="train", overrides=["env=visgym_interactive", "rollout.reuse_kv_cache=false"])
    assert to_dataclass(on.rollout, RolloutConfig).reuse_kv_cache is True
    assert to_dataclass(off.rollout, RolloutConfig).reuse_kv_cache is False

    class Plain(_Counting):
        def generate_cached(self, *a):
            raise AssertionError("reuse_kv=False must re-prefill")

    sampling = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    eng = Plain(TransformersEngine(policy, reuse_kv=False))
    rollout(_Spec(max_turns=3), policy, eng, seeds=[1], group_size=2, sampling=sampling, policy_version=0)
    assert all(kept == 0 for _, kept in eng.calls)
