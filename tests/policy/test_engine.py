"""Rollout engine: determinism, stopping, banned tokens, shared prefill, batching."""

from __future__ import annotations

import pytest
import torch

from rlkit.policy import PromptInput, SamplingParams, TransformersEngine, make_engine
from rlkit.policy.engine import sample_from_logits
from rlkit.policy.logprobs import sequence_batch

from .conftest import maze_image, perturb_lora


@pytest.fixture
def policy(make_policy):
    p = make_policy()
    perturb_lora(p.model, seed=0, scale=0.05)
    return p


def _prompts(policy, k):
    out = []
    for i in range(k):
        tt = policy.chat.user_turn("Step " * (1 + 3 * i) + "which way?", [maze_image(i)], system="Solve." if i % 2 else None)
        out.append(PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs)))
    return out


def test_greedy_is_deterministic_and_batch_independent(policy):
    eng = make_engine(policy)
    prompts = _prompts(policy, 3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, n=2)
    a = eng.generate(prompts, greedy)
    b = eng.generate(prompts, greedy)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert all(g[0].token_ids == g[1].token_ids for g in a)  # n greedy samples coincide
    alone = [eng.generate([p], greedy)[0][0] for p in prompts]  # no left padding
    for g, c in zip(a, alone):
        assert g[0].token_ids == c.token_ids
        assert max(abs(x - y) for x, y in zip(g[0].logprobs, c.logprobs)) < 1e-4


def test_seeded_sampling_reproducible(policy):
    eng = make_engine(policy)
    prompts = _prompts(policy, 2)
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=6, n=4, seed=123)
    a = eng.generate(prompts, sp)
    b = eng.generate(prompts, sp)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    c = eng.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6, n=4, seed=124))
    assert [[x.token_ids for x in g] for g in a] != [[x.token_ids for x in g] for g in c]
    assert len(a) == 2 and all(len(g) == 4 for g in a)


def test_shared_prefill_matches_per_row_prefill(policy):
    prompts = _prompts(policy, 2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, n=3)
    shared = TransformersEngine(policy, share_prefill=True).generate(prompts, greedy)
    rows = TransformersEngine(policy, share_prefill=False).generate(prompts, greedy)
    for gs, gr in zip(shared, rows):
        for cs, cr in zip(gs, gr):
            assert cs.token_ids == cr.token_ids
            assert max(abs(x - y) for x, y in zip(cs.logprobs, cr.logprobs)) < 1e-4


@pytest.mark.parametrize("share_prefill", [True, False])
def test_on_token_sees_every_sampled_token_in_order_and_changes_nothing(policy, share_prefill):
    """Seeded sampling with 3 prompts x n=3 in chunks of 2 prompts (max_batch_rows=6), a stop string and the
    end-of-turn token: the callback gets each completion's token ids and logprobs in order, with the prompt and
    sample index across chunks, and the completions are those of the same seed without a callback."""
    eng = TransformersEngine(policy, max_batch_rows=6, share_prefill=share_prefill)
    prompts = _prompts(policy, 3)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, n=3, seed=5)
    plain = eng.generate(prompts, sp)
    text = plain[1][2].text
    sp.stop = (text[4:6],)  # ends that completion early, others may stop on it too
    plain = eng.generate(prompts, sp)
    seen: dict[tuple[int, int], list[tuple[int, float]]] = {}
    watched = eng.generate(prompts, sp, on_token=lambda i, k, t, lp: seen.setdefault((i, k), []).append((t, lp)))
    assert [[(c.token_ids, c.logprobs, c.text, c.finish_reason, c.stop_reason) for c in g] for g in watched] == \
        [[(c.token_ids, c.logprobs, c.text, c.finish_reason, c.stop_reason) for c in g] for g in plain]
    assert sorted(seen) == [(i, k) for i in range(3) for k in range(3)]
    for i, g in enumerate(watched):
        for k, c in enumerate(g):
            assert seen[i, k] == list(zip(c.token_ids, c.logprobs)), (i, k)
            assert all(type(t) is int and type(lp) is float for t, lp in seen[i, k])
    assert plain[1][2].stop_reason == sp.stop[0] and len(plain[1][2].token_ids) < 12
    assert len({len(c.token_ids) for g in plain for c in g}) > 1  # rows really finished at different steps


def test_an_exception_in_on_token_ends_generate(policy):
    """The callback's exception leaves generate at once (the server's way to drop a request whose client left),
    with the model back in the mode it was in."""

    class Gone(Exception):
        pass

    eng = make_engine(policy)
    calls = []

    def stop_after_3(i, k, t, lp):
        calls.append(t)
        if len(calls) == 3:
            raise Gone

    policy.model.train()
    with pytest.raises(Gone):
        eng.generate(_prompts(policy, 1), SamplingParams(temperature=0.0, max_new_tokens=20), on_token=stop_after_3)
    assert len(calls) == 3 and policy.model.training
    again = eng.generate(_prompts(policy, 1), SamplingParams(temperature=0.0, max_new_tokens=20))
    assert again[0][0].token_ids[:3] == calls


def _teacher_forced_dist(policy, prompt: PromptInput, token_ids: list[int], temperature: float) -> torch.Tensor:
    """[T, V] float32: log_softmax((logits masked on policy.banned_token_ids) / tau) at the T positions that
    predict ``token_ids``, from one forward of prompt + completion (no KV cache, no engine code)."""
    seq = PromptInput(input_ids=[*prompt.input_ids, *token_ids], pixel_values=prompt.pixel_values,
                      image_grid_thw=prompt.image_grid_thw)
    with torch.no_grad():
        batch = sequence_batch(policy.model, [seq], padding_side="right")
        logits = policy.model(**batch.model_inputs(), use_cache=False).logits[0].float()  # [L, V]
    logits[:, list(policy.banned_token_ids)] = float("-inf")
    tau = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / tau, dim=-1)[-len(token_ids) - 1:-1]


@pytest.mark.parametrize("share_prefill", [True, False])
def test_top_logprobs_are_the_teacher_forced_top_of_the_sampled_distribution(policy, share_prefill):
    """Seeded sampling at temperature 0.7 with top-k / top-p truncation, 2 prompts x n=2 (left padding, rows
    finishing apart), extra banned ids (ids the unbanned policy ranks top at the first step, so the mask shows):
    each step's top 5 are the top 5 of a teacher-forced forward of prompt + completion with the same mask and
    temperature, before truncation (ids equal, values within 1e-4 in float32); the token's own logprob is its
    entry; on_token gets them as its fifth argument; the tokens and logprobs are those sampled without them."""
    k, temperature = 5, 0.7
    prompts = _prompts(policy, 2)
    eng = TransformersEngine(policy, share_prefill=share_prefill)
    first = eng.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=1, top_logprobs=k))
    extra = first[0][0].top_logprobs[0].token_ids[:2] + first[1][0].top_logprobs[0].token_ids[:1]
    policy.banned_token_ids = sorted({*policy.banned_token_ids, *extra})
    sp = SamplingParams(temperature=temperature, top_k=30, top_p=0.9, max_new_tokens=10, n=2, seed=3)
    plain = eng.generate(prompts, sp)
    seen: dict[tuple[int, int], list] = {}
    sp_top = SamplingParams(**{**sp.__dict__, "top_logprobs": k})
    got = eng.generate(prompts, sp_top, on_token=lambda i, j, t, lp, top: seen.setdefault((i, j), []).append(top))
    assert all(c.top_logprobs is None for g in plain for c in g)
    assert [[(c.token_ids, c.logprobs, c.text) for c in g] for g in got] == \
        [[(c.token_ids, c.logprobs, c.text) for c in g] for g in plain]
    for i, g in enumerate(got):
        for j, c in enumerate(g):
            assert seen[i, j] == c.top_logprobs and len(c.top_logprobs) == len(c.token_ids)
            dist = _teacher_forced_dist(policy, prompts[i], c.token_ids, temperature)  # [T, V]
            want_vals, want_ids = dist.topk(k, dim=-1)  # [T, k]
            for t, (tok, lp, top) in enumerate(zip(c.token_ids, c.logprobs, c.top_logprobs)):
                assert top.token_ids == want_ids[t].tolist(), (i, j, t)
                assert torch.allclose(torch.tensor(top.logprobs), want_vals[t], atol=1e-4, rtol=0), (i, j, t)
                assert not set(top.token_ids) & set(extra)
                assert top.logprobs == sorted(top.logprobs, reverse=True)
                if tok in top.token_ids:
                    assert top.logprobs[top.token_ids.index(tok)] == lp  # exact: the same tensor
                else:
                    assert lp <= top.logprobs[-1]
            assert (dist.topk(sp.top_k, dim=-1).values.exp().sum(-1) < 0.99).all()  # truncation drops mass


def test_top_logprobs_of_orders_ties_by_id():
    from rlkit.policy.engine import top_logprobs_of

    logp = torch.tensor([[-1.0, -0.5, -1.0, -3.0, -0.5], [-2.0, -2.0, -2.0, -2.0, -2.0]])
    ids, vals = top_logprobs_of(logp, 4)  # (which of the ids tied at the cut are kept is torch.topk's choice)
    assert ids[0].tolist() == [1, 4, 0, 2] and vals.tolist() == [[-0.5, -0.5, -1.0, -1.0], [-2.0] * 4]
    assert ids[1].tolist() == sorted(ids[1].tolist())
    ids, vals = top_logprobs_of(logp, 3)
    assert ids[0, :2].tolist() == [1, 4] and ids[0, 2] in (0, 2)
    assert top_logprobs_of(logp, 9)[0].tolist() == [[1, 4, 0, 2, 3], [0, 1, 2, 3, 4]]


def test_sampling_params_check_top_logprobs():
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="top_logprobs"):
            SamplingParams(top_logprobs=bad).validate()
    SamplingParams(top_logprobs=20).validate()


def test_stop_and_length_finish_reasons(policy):
    chat = policy.chat
    # Make <|im_end|> the only likely token after 2 steps: bias the output layer.
    eng = make_engine(policy)
    with torch.no_grad():
        policy.hf_model.lm_head.weight[chat.im_end_id] += 50.0 * policy.hf_model.lm_head.weight[chat.im_end_id].sign()
    outs = eng.generate(_prompts(policy, 2), SamplingParams(temperature=0.0, max_new_tokens=5, n=1))
    stopped = [g[0] for g in outs if g[0].finish_reason == "stop"]
    assert stopped, "expected at least one completion to stop on <|im_end|>"
    for c in stopped:
        assert c.token_ids[-1] == chat.im_end_id and chat.im_end_id not in c.token_ids[:-1]
        assert c.text == chat.decode(c.token_ids) and "<|im_end|>" not in c.text
        assert len(c.logprobs) == len(c.token_ids)
    cut = make_engine(policy).generate(_prompts(policy, 1), SamplingParams(temperature=1.0, max_new_tokens=1, n=8, seed=0))
    assert all(len(c.token_ids) == 1 for c in cut[0])
    assert all(c.finish_reason == ("stop" if c.token_ids == [chat.im_end_id] else "length") for c in cut[0])


def test_banned_tokens_never_sampled(policy):
    """1,000 completions of random weights (every token has mass): no vision/pad/im_start token."""
    eng = make_engine(policy, max_batch_rows=500)
    banned = set(policy.banned_token_ids)
    # Push mass onto banned ids so a missing mask would show up.
    prompts = _prompts(policy, 2)
    with torch.no_grad():
        b = sequence_batch(policy.model, prompts[:1])
        top = policy.model(**b.model_inputs()).logits[0, -1].argmax()
        w = policy.hf_model.lm_head.weight
        w[sorted(banned)] = 10.0 * w[top]  # banned logits = 10x the top logit
        unmasked = torch.softmax(policy.model(**b.model_inputs()).logits[0, -1] / 1.5, -1)
    # without the mask, the 1,000 first tokens alone would hold > 30 banned ids on average
    assert unmasked[sorted(banned)].sum() > 0.03
    outs = eng.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=3, n=500, seed=7))
    seen = {t for g in outs for c in g for t in c.token_ids}
    assert sum(len(g) for g in outs) == 1000
    assert not seen & banned
    assert len(seen) > 50  # it really sampled broadly


def test_sample_from_logits_semantics():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]])
    banned = torch.tensor([False, False, False, False, True])
    sp = SamplingParams(temperature=0.5, top_k=2)
    toks = [sample_from_logits(logits, banned, sp, g)[0].item() for _ in range(200)]
    assert set(toks) <= {0, 1}  # top-2 among the unbanned
    tok, lp = sample_from_logits(logits, banned, sp, g)
    ref = torch.log_softmax(logits[0, :4] / 0.5, -1)[tok.item()]  # untruncated, tempered, banned-masked
    assert abs(lp.item() - ref.item()) < 1e-6
    greedy_tok, greedy_lp = sample_from_logits(logits, banned, SamplingParams(temperature=0.0), None)
    assert greedy_tok.item() == 0 and abs(greedy_lp.item() - torch.log_softmax(logits[0, :4], -1)[0].item()) < 1e-6
    p_tok = [sample_from_logits(logits, banned, SamplingParams(temperature=1.0, top_p=0.5), g)[0].item() for _ in range(50)]
    assert set(p_tok) == {0}  # token 0 alone holds > 50% of the unbanned mass


def test_inverse_cdf_draw_follows_the_distribution_and_never_draws_a_zero():
    from rlkit.policy.engine import _inverse_cdf_draw

    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0]).repeat(40_000, 1)  # zeros first, between and last
    toks = _inverse_cdf_draw(probs, torch.Generator().manual_seed(0))
    assert toks.shape == (40_000,) and toks.dtype == torch.long
    freq = torch.bincount(toks, minlength=6).double() / len(toks)
    assert freq[[0, 2, 5]].sum() == 0
    assert torch.allclose(freq, probs[0].double(), atol=0.01)  # 3 sigma is ~0.0075 for p = 0.5
    # seeded: the same generator state gives the same draws
    a = _inverse_cdf_draw(probs[:8], torch.Generator().manual_seed(3))
    b = _inverse_cdf_draw(probs[:8], torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_bad_inputs_raise(policy):
    eng = make_engine(policy)
    tt = policy.chat.user_turn("x", [maze_image(0)])
    with pytest.raises(ValueError, match="image_pad"):
        eng.generate([PromptInput(tt.input_ids)], SamplingParams())  # images missing
    with pytest.raises(ValueError, match="top_p"):
        eng.generate([PromptInput(tt.input_ids)], SamplingParams(top_p=0.0))


def test_stop_strings_cut_the_completion_where_vllm_would(policy):
    """A stop string ends a completion at the first token whose text completes it: the tokens are
    the prefix of the unstopped greedy completion, the text is cut right after the stop string
    (kept, as vLLM's include_stop_str_in_output=True), finish_reason "stop", stop_reason the string."""
    eng = make_engine(policy)
    chat = policy.chat
    prompts = _prompts(policy, 3)
    free = [g[0] for g in eng.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))]
    ids = free[0].token_ids
    stop = chat.decode(ids[3:5])  # text of tokens 3-4 of the first completion: it must stop by token 4
    assert stop and "<|im_end|>" not in stop
    cut = [g[0] for g in eng.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12, stop=(stop,)))]
    hits = 0
    for f, c in zip(free, cut):
        if stop in f.text:
            hits += 1
            k = len(c.token_ids)
            assert c.token_ids == f.token_ids[:k] and stop in chat.decode(c.token_ids)
            assert stop not in chat.decode(c.token_ids[:-1])  # the first token that completes it
            assert c.text == f.text[: f.text.index(stop) + len(stop)]
            assert (c.finish_reason, c.stop_reason) == ("stop", stop)
            assert c.logprobs == pytest.approx(f.logprobs[:k], abs=1e-5)
        else:
            assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (f.token_ids, f.text, f.finish_reason, None)
    assert hits >= 1 and len(cut[0].token_ids) <= 5
    # the turn is closed with <|im_end|> + "\n" (not sampled: loss mask 0 in a rollout)
    assert chat.turn_end_ids("stop", stop) == chat.turn_end_ids("length") == [chat.im_end_id, *chat.newline_ids]
    assert chat.turn_end_ids("stop") == list(chat.newline_ids)


def test_bad_stop_strings_are_refused():
    for bad in ("</answer>", ("",), (3,)):
        with pytest.raises(ValueError, match="stop="):
            SamplingParams(stop=bad).validate()


def test_stop_string_ending_inside_a_multibyte_character(policy):
    """A stop string whose last character is split over byte-level tokens is still found: the
    newest token alone decodes to U+FFFD, which also triggers the check."""
    eng = make_engine(policy)
    ids = policy.tokenizer("ab\u00e9")["input_ids"]
    assert policy.chat.decode(ids) == "ab\u00e9" and eng._piece(ids[-1]) == "\ufffd"  # split over byte tokens
    assert eng._stop_hit(ids, ("\u00e9",), {"\u00e9"}) == "\u00e9"
    assert eng._stop_hit(ids[:-1], ("\u00e9",), {"\u00e9"}) is None  # only its first byte so far
    assert eng._text(ids, "\u00e9") == "ab\u00e9" and eng._text(ids, "zz") == "ab\u00e9"


def _same_system_prompts(policy, k):
    """k prompts that share a system prompt and differ from their image on (as the G-sample groups'
    prompts of one rollout do): their common prefix is the system prompt and the user turn's header."""
    system = "You are the blue dot in the maze. Reach the red square; gray cells are walls. Reply with a route."
    out = []
    for i in range(k):
        tt = policy.chat.user_turn("Your route? " * (1 + i), [maze_image(10 + i)], system=system)
        out.append(PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs)))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_shared_prompt_prefix_matches_whole_prompt_prefill(policy, temperature):
    prompts = _same_system_prompts(policy, 3)
    sp = SamplingParams(temperature=temperature, max_new_tokens=8, n=2, seed=5)
    shared_eng = TransformersEngine(policy)
    shared = shared_eng.generate(prompts, sp)
    first_image = prompts[0].input_ids.index(policy.hf_model.config.image_token_id)
    # the prefix ran once: everything before the first image, counted once in prompt_tokens
    assert shared_eng.last_stats.extra["shared_prompt_tokens"] == first_image >= 16
    assert shared_eng.last_stats.prompt_tokens == sum(len(p.input_ids) - first_image for p in prompts) + first_image
    whole_eng = TransformersEngine(policy, share_prompt_prefix=False)
    whole = whole_eng.generate(prompts, sp)
    assert "shared_prompt_tokens" not in whole_eng.last_stats.extra
    for gs, gw in zip(shared, whole):
        for cs, cw in zip(gs, gw):
            assert cs.token_ids == cw.token_ids
            assert max(abs(x - y) for x, y in zip(cs.logprobs, cw.logprobs)) < 1e-5
    # and a prompt set without a long common prefix (different system prompts) is prefilled whole
    eng = TransformersEngine(policy)
    eng.generate([prompts[0], _prompts(policy, 2)[1]], sp)
    assert "shared_prompt_tokens" not in eng.last_stats.extra


def test_preallocated_decode_matches_transformers_cache(policy, monkeypatch):
    """Decoding into _GrowingLayer's buffer (attention over the whole zero-filled buffer, the unfilled
    positions masked) samples what transformers' DynamicLayer (a cache as long as its tokens) samples."""
    from rlkit.policy import engine as engine_mod

    prompts = _prompts(policy, 3)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=3, seed=9)
    grown = TransformersEngine(policy).generate(prompts, sp)
    monkeypatch.setattr(engine_mod, "_PREALLOCATE", False)
    plain = TransformersEngine(policy).generate(prompts, sp)
    lengths = set()
    for gg, gp in zip(grown, plain):
        for cg, cp in zip(gg, gp):
            assert cg.token_ids == cp.token_ids
            assert max(abs(x - y) for x, y in zip(cg.logprobs, cp.logprobs)) < 1e-5
            lengths.add(len(cg.token_ids))
    assert max(lengths) == 10


def test_growing_layer_hands_attention_its_whole_buffer():
    from rlkit.policy.engine import _GrowingLayer

    keys, values = torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4)
    layer = _GrowingLayer(keys, values, reserve=3)
    assert layer.get_mask_sizes(1) == (8, 0)
    k, v = layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert k.shape == v.shape == (2, 1, 8, 4) and k.is_contiguous()
    assert torch.equal(k[:, :, :5], keys) and torch.equal(k[:, :, 5], torch.ones(2, 1, 4))
    assert torch.equal(k[:, :, 6:], torch.zeros(2, 1, 2, 4))  # unfilled: zeros, masked by the announced size
    assert layer.get_seq_length() == 6 and layer.keys.shape == (2, 1, 6, 4)
    layer.update(torch.ones(2, 1, 2, 4), torch.ones(2, 1, 2, 4))
    assert layer.get_mask_sizes(1) == (24, 0)  # out of room: it grows before announcing the size
    k, _ = layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert k.shape[2] == 24 and layer.get_seq_length() == 9
