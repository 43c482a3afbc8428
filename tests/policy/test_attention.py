"""rlkit.policy.attention: small causal attention on CPU as a plain product, equal to transformers' sdpa."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlkit.policy.attention import MAX_SCORES, NAME, register, small_attention

from .conftest import maze_image, perturb_lora


class _Attn(torch.nn.Module):  # what the attention functions read off a transformers attention module
    def __init__(self, groups, causal=True):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = causal


def _qkv(b, h, kvh, q_len, length, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, q_len, d, generator=g).to(dtype), torch.randn(b, kvh, length, d, generator=g).to(dtype),
            torch.randn(b, kvh, length, d, generator=g).to(dtype))


def _exact(q, k, v, keep, causal):
    """float64 reference: [B, Q, H, D]."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    s = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    elif causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(s, -1) @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_decode_query_equals_the_exact_product(dtype, tol, mask_kind):
    b, h, kvh, length, d = 3, 6, 2, 17, 32
    q, k, v = _qkv(b, h, kvh, 1, length, d, dtype)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    keep[0, ..., :5] = False  # left-padded rows
    keep[2, ..., :2] = False
    mask = {None: None, "bool": keep,
            "float": torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)}[mask_kind]
    with torch.no_grad():
        ours, _ = small_attention(_Attn(h // kvh), q, k, v, mask, scaling=d**-0.5)
        ref, _ = sdpa_attention_forward(_Attn(h // kvh), q, k, v, mask, scaling=d**-0.5)
    exact = _exact(q, k, v, None if mask is None else keep, causal=False)
    assert ours.shape == ref.shape == (b, 1, h, d) and ours.dtype == dtype
    assert (ours.double() - exact).abs().max() < tol
    assert (ref.double() - exact).abs().max() < tol
    if mask is not None:  # a masked key changes nothing
        v2 = v.clone()
        v2[0, :, :5] += 100
        with torch.no_grad():
            assert torch.equal(small_attention(_Attn(h // kvh), q, k, v2, mask)[0][0], ours[0])


@pytest.mark.parametrize("shape", ["causal_no_mask", "prefix_mask"])
def test_training_block_and_gradients_equal_sdpa(shape):
    """Q > 1 with autograd, float32: outputs and gradients of q, k, v equal transformers' sdpa."""
    b, h, kvh, d = 2, 4, 2, 16
    if shape == "causal_no_mask":  # a whole sequence: transformers passes no mask, the call is causal
        q_len = length = 12
        mask = None
    else:  # completions (Q=5) attending to a shared prompt (7) + themselves, one row left-padded
        q_len, length = 5, 12
        mask = torch.ones(q_len, length, dtype=torch.bool).tril(diagonal=length - q_len).expand(b, 1, q_len, length).clone()
        mask[1, ..., :3] = False
    outs, grads = [], []
    for fn in (small_attention, sdpa_attention_forward):
        q, k, v = (t.requires_grad_() for t in _qkv(b, h, kvh, q_len, length, d, torch.float32, seed=3))
        out, _ = fn(_Attn(h // kvh), q, k, v, mask)
        out.pow(2).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in (q, k, v)])
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=0)
    for ga, gb in zip(*grads):
        assert torch.allclose(ga, gb, atol=1e-4, rtol=1e-4)
    if mask is None:  # causal: the first query sees only the first key
        exact = _exact(*_qkv(b, h, kvh, q_len, length, d, torch.float32, seed=3), None, causal=True)
        assert (outs[0].double() - exact).abs().max() < 1e-5


def test_what_goes_to_sdpa(monkeypatch):
    import rlkit.policy.attention as attention_mod

    calls = []
    real = attention_mod.sdpa_attention_forward
    monkeypatch.setattr(attention_mod, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v = _qkv(1, 2, 2, 4, 4, 8, torch.float32)
    small_attention(_Attn(1), q, k, v, None)
    assert calls == []  # a small causal block: the plain product
    small_attention(_Attn(1, causal=False), q, k, v, None)  # the vision tower
    small_attention(_Attn(1), q, k, v, None, dropout=0.1)
    side = int(MAX_SCORES**0.5) + 1
    small_attention(_Attn(1), *_qkv(1, 2, 2, side, side, 8, torch.float32), None)  # too long: flash kernel
    assert len(calls) == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_policy_samples_and_scores_like_sdpa(make_policy, dtype):
    """The CPU policy runs rlkit_sdpa; its seeded generations and training logprobs match transformers' sdpa."""
    from rlkit.policy import PromptInput, SamplingParams, make_engine

    policy = make_policy(dtype=dtype)
    perturb_lora(policy.model, seed=0, scale=0.05)
    base = policy.model.get_base_model()
    assert base.config._attn_implementation == NAME == register()
    prompts, turns = [], []
    for i in range(3):  # three prompt lengths: left padding in the batch
        tt = policy.chat.user_turn("Step " * (1 + 3 * i) + "which way?", [maze_image(i)], system="Solve.")
        turns.append(tt)
        prompts.append(PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs)))
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, seed=7)
    results = {}
    for impl in (NAME, "sdpa"):
        base.set_attn_implementation(impl)
        results[impl] = make_engine(policy).generate(prompts, sp)
    tol = 1e-5 if dtype == "float32" else 0.1  # bf16: the two round their scores differently
    same = 0
    for g_ours, g_ref in zip(results[NAME], results["sdpa"]):
        for a, b in zip(g_ours, g_ref):
            n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
            same += n == len(a.token_ids) == len(b.token_ids)
            assert max((abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n])), default=0.0) < tol
    assert same == 6 if dtype == "float32" else same >= 4
    if dtype == "float32":  # the training forward (with autograd) of one sampled sequence, both ways
        from rlkit.rollout import Trajectory

        c = results[NAME][2][0]
        ids = list(turns[2].input_ids) + list(c.token_ids)
        traj = Trajectory(ids, [0] * len(turns[2].input_ids) + [1] * len(c.token_ids), [0.0] * len(ids),
                          list(turns[2].image_inputs), episode=None, group=0, policy_version=0)
        lps = {}
        for impl in (NAME, "sdpa"):
            base.set_attn_implementation(impl)
            lps[impl], _ = policy.logprobs([traj], with_entropy=False)
        n = len(turns[2].input_ids)
        assert torch.allclose(lps[NAME][0, n : len(ids)], lps["sdpa"][0, n : len(ids)], atol=1e-5)
        assert torch.allclose(lps[NAME][0, n : len(ids)], torch.tensor(c.logprobs), atol=1e-4)


def _right_padded_mask(b, q_len, length, lengths):
    """Causal aligned to the last key (a prefix of length - q_len keys, then the queries' own), each row's keys
    real up to lengths[i] (right padding): the training batch's mask. bool [B, 1, Q, L]."""
    mask = torch.ones(q_len, length, dtype=torch.bool).tril(diagonal=length - q_len).expand(b, 1, q_len, length).clone()
    for i, n in enumerate(lengths):
        mask[i, ..., n:] = False
    return mask


@pytest.mark.parametrize("prefix", [0, 40])
def test_long_right_padded_block_takes_the_causal_kernel_and_equals_sdpa_on_real_rows(monkeypatch, prefix):
    """Past MAX_SCORES a right-padded causal mask runs the flash kernel with is_causal (no mask): outputs and
    gradients of q, k, v equal transformers' masked sdpa on every real query row (padding rows are not compared:
    nothing real reads them)."""
    import rlkit.policy.attention as attention_mod

    b, h, kvh, d = 3, 4, 2, 16
    q_len = int(MAX_SCORES**0.5) + 20
    length = q_len + prefix
    lengths = [length, length - 90, length - 7]  # real keys a row (prefix included)
    mask = _right_padded_mask(b, q_len, length, lengths)
    assert attention_mod._right_padded_causal(mask, q_len, length)
    calls = []
    real = attention_mod.sdpa_attention_forward
    monkeypatch.setattr(attention_mod, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    outs, grads = [], []
    for fn in (small_attention, real):
        q, k, v = (t.requires_grad_() for t in _qkv(b, h, kvh, q_len, length, d, torch.float32, seed=5))
        out, _ = fn(_Attn(h // kvh), q, k, v, mask)
        weight = torch.zeros(b, q_len, 1, 1)  # the loss reads real rows only
        for i, n in enumerate(lengths):
            weight[i, : n - prefix] = 1.0
        (out.pow(2) * weight).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in (q, k, v)])
    assert calls == []  # small_attention did not fall back to transformers' sdpa
    for i, n in enumerate(lengths):
        assert torch.allclose(outs[0][i, : n - prefix], outs[1][i, : n - prefix], atol=1e-5, rtol=0)
    for ga, gb in zip(*grads):
        assert torch.allclose(ga, gb, atol=1e-4, rtol=1e-4)


def test_other_long_masks_fall_back_to_sdpa():
    """A left-padded row, a hole in a row's keys, or a float mask is not the training batch's mask: not taken."""
    from rlkit.policy.attention import _right_padded_causal

    b, q_len, length = 2, 300, 340
    mask = _right_padded_mask(b, q_len, length, [length, length - 30])
    assert _right_padded_causal(mask, q_len, length)
    left = mask.clone()
    left[1, ..., :5] = False
    hole = mask.clone()
    hole[0, ..., 100] = False
    top_left = torch.ones(q_len, length, dtype=torch.bool).tril().expand(b, 1, q_len, length).clone()
    for bad in (left, hole, top_left, mask.float(), None):
        assert not _right_padded_causal(bad, q_len, length)


def test_a_new_turn_after_a_long_kv_cache_takes_the_masked_kernel(monkeypatch):
    """A multi-turn rollout prefills a turn's Q new tokens after its conversation's L - Q cached keys, with a mask of
    the training batch's shape when no row is padded. The causal kernel would run the L - Q cached keys as zero query
    rows (about L x L / 2 scores for Q x L real ones): with more cached keys than queries the call takes transformers'
    masked sdpa, with the same outputs."""
    import rlkit.policy.attention as attention_mod

    b, h, kvh, d = 2, 4, 2, 16
    q_len, length = 120, 1200  # a turn's picture and text after ten turns of history
    mask = _right_padded_mask(b, q_len, length, [length, length])
    assert attention_mod._right_padded_causal(mask, q_len, length)
    taken = {"sdpa": 0, "causal": 0}
    real_sdpa, real_causal = attention_mod.sdpa_attention_forward, attention_mod._causal_flash
    monkeypatch.setattr(attention_mod, "sdpa_attention_forward",
                        lambda *a, **k: taken.__setitem__("sdpa", taken["sdpa"] + 1) or real_sdpa(*a, **k))
    monkeypatch.setattr(attention_mod, "_causal_flash",
                        lambda *a, **k: taken.__setitem__("causal", taken["causal"] + 1) or real_causal(*a, **k))
    q, k, v = _qkv(b, h, kvh, q_len, length, d, torch.float32, seed=3)
    out, _ = small_attention(_Attn(h // kvh), q, k, v, mask)
    assert taken == {"sdpa": 1, "causal": 0}
    assert torch.allclose(out, real_causal(q, k, v, None), atol=1e-5)  # the same attention, computed cheaper
    # the training batch's own shape (a shared prompt shorter than the completions) still takes the causal kernel
    q_len2 = 400
    mask2 = _right_padded_mask(b, q_len2, q_len2 + 150, [q_len2 + 150, q_len2 + 100])
    q2, k2, v2 = _qkv(b, h, kvh, q_len2, q_len2 + 150, d, torch.float32, seed=4)
    small_attention(_Attn(h // kvh), q2, k2, v2, mask2)
    assert taken == {"sdpa": 1, "causal": 1}
