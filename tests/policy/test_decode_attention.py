"""rlkit.policy.attention: CPU decode steps take a plain product equal to transformers' sdpa."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlkit.policy.attention import NAME, decode_attention, register


class _Module(torch.nn.Module):  # what transformers' sdpa function reads off the attention module
    is_causal = True

    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_one_query_equals_sdpa(dtype, tol, mask_kind):
    g = torch.Generator().manual_seed(0)
    b, h, kvh, length, d = 3, 6, 2, 17, 32
    q = torch.randn(b, h, 1, d, generator=g).to(dtype)
    k = torch.randn(b, kvh, length, d, generator=g).to(dtype)
    v = torch.randn(b, kvh, length, d, generator=g).to(dtype)
    mask = None
    if mask_kind is not None:
        keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
        keep[0, :, :, :5] = False  # a left-padded row
        keep[2, :, :, :2] = False
        mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    module = _Module(h // kvh)
    with torch.no_grad():
        ours, _ = decode_attention(module, q, k, v, mask, scaling=d**-0.5)
        ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=d**-0.5)
        # and the fp32 math by hand, which neither path may miss by more than its dtype's rounding
        kr, vr = k.float().repeat_interleave(h // kvh, 1), v.float().repeat_interleave(h // kvh, 1)
        s = (q.float() @ kr.transpose(-1, -2)) * d**-0.5
        if mask is not None:
            keep = mask if mask.dtype == torch.bool else mask == 0
            s = s.masked_fill(~keep, float("-inf"))
        exact = (torch.softmax(s, -1) @ vr).transpose(1, 2)  # [B, 1, H, D]
    assert ours.shape == ref.shape == (b, 1, h, d) and ours.dtype == dtype
    assert torch.allclose(ours.float(), exact, atol=tol, rtol=0)
    assert torch.allclose(ref.float(), exact, atol=tol * 2, rtol=0)
    if mask is not None:  # a padded key changes nothing: perturb it
        v2 = v.clone()
        v2[0, :, :5] += 100
        with torch.no_grad():
            ours2, _ = decode_attention(module, q, k, v2, mask, scaling=d**-0.5)
        assert torch.equal(ours2[0], ours[0])


def test_longer_queries_and_training_go_to_sdpa(monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa_mod

    calls = []
    real = sdpa_mod.sdpa_attention_forward
    monkeypatch.setattr(sdpa_mod, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    with torch.no_grad():
        decode_attention(_Module(1), q, k, v, None)  # prefill: 4 queries
    decode_attention(_Module(1), q[:, :, :1], k, v, None)  # one query with autograd on: a training forward
    assert len(calls) == 2
    with torch.no_grad():
        decode_attention(_Module(1), q[:, :, :1], k, v, None)
    assert len(calls) == 2  # the decode step did not


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_policy_decodes_with_it_like_sdpa(make_policy, dtype):
    """The policy on CPU uses rlkit_sdpa; its generations equal those of transformers' sdpa."""
    from rlkit.policy import PromptInput, SamplingParams, make_engine

    from .conftest import maze_image, perturb_lora

    policy = make_policy(dtype=dtype)
    perturb_lora(policy.model, seed=0, scale=0.05)
    base = policy.model.get_base_model()
    assert base.config._attn_implementation == NAME == register()
    prompts = []
    for i in range(3):
        tt = policy.chat.user_turn("Step " * (1 + 3 * i) + "which way?", [maze_image(i)], system="Solve.")
        prompts.append(PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs)))  # 3 lengths: padding
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, seed=7)
    ours = make_engine(policy).generate(prompts, sp)
    base.set_attn_implementation("sdpa")
    ref = make_engine(policy).generate(prompts, sp)
    tol = 1e-5 if dtype == "float32" else 0.1  # bf16: its own sdpa rounds the scores to bf16, ours does not
    same = 0
    for g_ours, g_ref in zip(ours, ref):
        for a, b in zip(g_ours, g_ref):
            n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
            same += n == len(a.token_ids) == len(b.token_ids)
            assert max((abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n])), default=0.0) < tol
    assert same == 6 if dtype == "float32" else same >= 4  # seeded samples: the same tokens
