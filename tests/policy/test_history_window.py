"""History window (rollout.history_images): the last k pictures in a turn's context, an episode cut into segments.

Checks (rlkit.rollout's module doc, "History window"): a window that never drops a picture gives the default's
trajectories bit for bit; with a window every turn's context holds at most k pictures, each sampled token sits in
exactly one segment, in the context it was sampled in (the sampling logprobs equal the training forward's within
1e-4, float32); kept KV caches (cut at a segment's start) sample what re-prefilling samples; the update trains on
every segment; the config key is range-checked.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams, TransformersEngine
from rlkit.rollout import rollout, to_tensor, training_sequences
from rlkit.update import grpo_update

from .test_kv_reuse import _Counting, _Spec, policy  # noqa: F401  (policy: the fixture, im_end made likely)


class _CountingTrim(_Counting):
    """_Counting that passes the engine's trim_state through (the rollout cuts kept states with it)."""

    def trim_state(self, state, num_tokens):
        return self.engine.trim_state(state, num_tokens)


def _sequences(t):
    return [(t.input_ids, t.loss_mask, t.sampling_logprobs, t.image_inputs)] + [
        (s.input_ids, s.loss_mask, s.sampling_logprobs, s.image_inputs) for s in t.segments]


def _run(policy, engine, k, seeds=(1, 2, 3), g=3, turns=5, temperature=1.0):
    sampling = SamplingParams(temperature=temperature, max_new_tokens=6, seed=11)
    return rollout(_Spec(max_turns=turns), policy, engine, seeds=list(seeds), group_size=g, sampling=sampling,
                   policy_version=0, history_images=k)


@pytest.mark.parametrize("reuse", [True, False])
def test_a_window_that_drops_nothing_is_the_default_bit_for_bit(policy, reuse):
    # the scripted env shows 1 or 2 pictures a turn: 5 turns hold at most 8, so a window of 8 drops none
    engine = TransformersEngine(policy, reuse_kv=reuse)
    a, b = _run(policy, engine, None), _run(policy, engine, 8)
    assert max(len(t.episode.turns) for t in a) >= 3
    for ta, tb in zip(a, b):
        assert tb.segments == [] and ta.segments == []
        assert ta.input_ids == tb.input_ids and ta.loss_mask == tb.loss_mask
        assert ta.sampling_logprobs == tb.sampling_logprobs  # bitwise: the same engine calls
        assert len(ta.image_inputs) == len(tb.image_inputs)
        assert all(torch.equal(x.pixel_values, y.pixel_values) for x, y in zip(ta.image_inputs, tb.image_inputs))
        assert [x.action_text for x in ta.episode.turns] == [x.action_text for x in tb.episode.turns]


@pytest.mark.parametrize("k", [1, 2])
def test_window_segments_hold_each_sampled_token_in_its_context(policy, k):
    chat = policy.chat
    b = _run(policy, TransformersEngine(policy, reuse_kv=True), k)
    assert max(len(t.episode.turns) for t in b) >= 3
    cut = 0
    for t in b:
        seqs = _sequences(t)
        spans = []
        for ids, mask, lps, images in seqs:
            assert len(ids) == len(mask) == len(lps)
            assert len(images) <= k  # never more than k pictures in a context
            assert ids.count(chat.image_pad_id) == sum(chat.num_image_tokens(x) for x in images)
            cur = []
            for tok, m in zip(ids, mask):
                if m:
                    cur.append(tok)
                elif cur:
                    spans.append(cur)
                    cur = []
            assert not cur
            # a later segment carries the earlier completions as context, loss mask 0, logprob 0
            assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        # every turn's completion is trained exactly once, in turn order
        assert [chat.decode(s) for s in spans] == [x.action_text for x in t.episode.turns]
        cut += len(t.segments)
        assert t.num_policy_tokens == sum(len(s) for s in spans)
    assert cut > 0  # the test covers what it claims: some contexts dropped a picture


@pytest.mark.parametrize("k", [1, 2])
def test_window_sampling_logprobs_are_the_training_logprobs(policy, k):
    b = _run(policy, TransformersEngine(policy, reuse_kv=True), k)
    seqs, adv = training_sequences(b, torch.arange(len(b), dtype=torch.float32))
    assert len(seqs) == len(b) + sum(len(t.segments) for t in b) > len(b)
    # each segment carries its episode's advantage
    owners = [i for i, t in enumerate(b) for _ in range(1 + len(t.segments))]
    assert adv.tolist() == [float(i) for i in owners]
    policy.model.eval()
    for shared in (False, True):  # the plain and the shared-prefix forward (the update's default)
        with torch.no_grad():
            lp, _ = policy.logprobs(seqs, temperature=1.0, with_entropy=False, **({"shared_prefix": True} if shared else {}))
        mask = to_tensor([s.loss_mask for s in seqs], torch.float32)
        old = to_tensor([s.sampling_logprobs for s in seqs], torch.float32)
        assert float(((lp - old).abs() * mask).max()) <= 1e-4


def test_window_kept_caches_equal_reprefill_and_are_cut_not_dropped(policy):
    plain = _Counting(TransformersEngine(policy, reuse_kv=False, share_prompt_prefix=False))
    cached = _CountingTrim(TransformersEngine(policy, reuse_kv=True))
    a, b = _run(policy, plain, 1), _run(policy, cached, 1)
    for ta, tb in zip(a, b):
        sa, sb = _sequences(ta), _sequences(tb)
        assert [s[0] for s in sa] == [s[0] for s in sb] and [s[1] for s in sa] == [s[1] for s in sb]
        diff = max((torch.tensor(x[2]) - torch.tensor(y[2])).abs().max().item() for x, y in zip(sa, sb))
        assert diff <= 1e-5, diff
    # every later turn starts a segment under k=1 (its picture replaces the last one), yet reuses the text before
    # the dropped picture: fewer tokens prefilled than re-prefilling, and some taken from the kept states
    for (full, _), (new, kept) in zip(plain.calls[1:], cached.calls[1:]):
        assert new + kept == full and kept > 0 and new < full


def test_update_trains_every_segment(policy):
    b = _run(policy, TransformersEngine(policy, reuse_kv=True), 1, seeds=(1, 2), g=2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    cfg = AlgorithmConfig(micro_batch_size=64, filter_zero_variance_groups=False)
    seqs, seq_adv = training_sequences(b, adv)

    def grads(trajs, advantages):
        p = copy.deepcopy(policy)
        opt = torch.optim.SGD(p.trainable_parameters(), lr=0.0)
        p.model.train()
        out = {}

        def grab():
            out.update({n: w.grad.clone() for n, w in p.model.named_parameters() if w.grad is not None})

        grpo_update(p, opt, trajs, advantages, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0),
                    on_backward=grab)
        return out

    # the trajectories (segments expanded inside the update) give the gradient of their segments as sequences
    g1, g2 = grads(b, adv), grads(seqs, seq_adv)
    assert g1 and g1.keys() == g2.keys()
    assert all(torch.allclose(g1[n], g2[n], atol=1e-6) for n in g1)
    # and the later segments matter: without them the gradient differs
    firsts = [copy.copy(t) for t in b]
    for t in firsts:
        t.segments = []
    g3 = grads(firsts, adv)
    assert any(not torch.allclose(g1[n], g3[n], atol=1e-6) for n in g1)


def test_history_images_must_be_a_positive_integer(policy):
    engine = TransformersEngine(policy, reuse_kv=True)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="history_images"):
            _run(policy, engine, bad)
