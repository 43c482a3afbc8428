"""Identical samples run once in the update (algorithm.dedup_identical_samples): which samples count as
identical, the weighted loss reductions, and the update with duplicates == the update without the merge."""

import copy

import pytest
import torch

from rlkit.algorithms import grpo
from rlkit.config import AlgorithmConfig
from rlkit.distributed.update import plan_update
from rlkit.update import identical_samples
from tests.core.test_shared_prefix_update import _batch, _update_grad

REDUCTIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_rows_equal_repeated_rows(reduction):
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g) * 0.1 - 1.0
    old = logp + torch.randn(3, 5, generator=g) * 0.3  # ratios far enough from 1 to clip some tokens
    adv = torch.tensor([1.0, -0.5, 0.7])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)
    counts = torch.tensor([3.0, 1.0, 2.0])
    rep = torch.tensor([0, 0, 0, 1, 2, 2])  # row i repeated counts[i] times
    loss_w, diag_w = grpo.policy_loss(logp, old, adv, mask, reduction=reduction, seq_weights=counts)
    loss_r, diag_r = grpo.policy_loss(logp[rep], old[rep], adv[rep], mask[rep], reduction=reduction)
    unweighted, _ = grpo.policy_loss(logp, old, adv, mask, reduction=reduction)
    assert float(loss_w) == pytest.approx(float(loss_r), rel=1e-6)
    assert abs(float(unweighted) - float(loss_r)) > 1e-3  # the weights matter for this batch
    assert 0 < float(diag_r["clip_fraction"]) < 1
    for key in diag_r:
        assert float(diag_w[key]) == pytest.approx(float(diag_r[key]), rel=1e-6), key
    ent = torch.rand(3, 5, generator=g)
    assert float(grpo.aggregate_loss(ent, mask, reduction, counts)) == pytest.approx(
        float(grpo.aggregate_loss(ent[rep], mask[rep], reduction)), rel=1e-6)


def test_identical_means_same_group_tokens_logprobs_advantage_and_images(policy, plan_env):
    trajs, adv = _batch(policy, plan_env, seeds=(11,), g=2)
    base = trajs[0]
    same = copy.deepcopy(base)
    other_logprob = copy.deepcopy(base)
    other_logprob.sampling_logprobs = list(base.sampling_logprobs)
    k = base.loss_mask.index(1)
    other_logprob.sampling_logprobs[k] += 1e-7
    other_group = copy.deepcopy(base)
    other_group.group = base.group + 1
    other_image = copy.deepcopy(base)
    other_image.image_inputs[0].pixel_values[0, 0] += 0.5
    batch = [base, same, other_logprob, other_group, other_image, same]
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert identical_samples(batch, list(range(6)), adv) == [(0, 3), (2, 1), (3, 1), (4, 1)]
    adv[5] = -1.0  # a different advantage is never merged
    assert identical_samples(batch, list(range(6)), adv) == [(0, 2), (2, 1), (3, 1), (4, 1), (5, 1)]


def _with_duplicates(policy, env, off_policy=False):
    """A plan-mode batch of 2 groups of 4 distinct samples, plus copies: sample 0 twice more, sample 5
    once more (each in its own group, same advantage), so 11 samples are 8 distinct ones. off_policy:
    sampling logprobs moved by up to +-0.3, so ratios differ from 1 and some tokens clip."""
    trajs, adv = _batch(policy, env)
    assert len(identical_samples(trajs, list(range(8)), adv)) == 8  # the sampled ones differ
    if off_policy:
        g = torch.Generator().manual_seed(5)
        for t in trajs:
            noise = (torch.rand(len(t.sampling_logprobs), generator=g) - 0.5) * 0.6
            t.sampling_logprobs = [v + float(e) if m else v for v, e, m in zip(t.sampling_logprobs, noise, t.loss_mask)]
    extra = [0, 0, 5]
    trajs = trajs + [copy.deepcopy(trajs[i]) for i in extra]
    adv = torch.cat([adv, adv[extra]])
    return trajs, adv


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_update_with_identical_samples_equals_the_update_without_the_merge(policy, plan_env, reduction):
    trajs, adv = _with_duplicates(policy, plan_env, off_policy=True)
    runs = {}
    for dedup in (False, True):
        cfg = AlgorithmConfig(dedup_identical_samples=dedup, loss_reduction=reduction, kl_coef=0.05,
                              micro_batch_size=3, max_grad_norm=1e9)
        runs[dedup] = _update_grad(policy, trajs, adv, cfg)
    (m_all, g_all, tok_all), (m_dedup, g_dedup, tok_dedup) = runs[False], runs[True]
    assert tok_dedup < tok_all  # the copies were not run
    assert m_all["policy/clip_ratio"] > 0.01 and abs(m_all["policy/ratio_mean"] - 1) > 1e-3  # off-policy enough to tell
    assert m_all["policy/distinct_fraction"] == 1.0
    assert m_dedup["policy/distinct_fraction"] == pytest.approx(8 / 11)
    err = float((g_all - g_dedup).abs().max()) / float(g_all.abs().max())
    assert err < 1e-4, err
    for key in ("policy/loss", "policy/pg_loss", "policy/entropy", "policy/approx_kl", "policy/kl",
                "policy/clip_ratio", "policy/dual_clip_fraction", "policy/ratio_mean", "policy/ratio_max",
                "policy/grad_norm"):
        assert m_dedup[key] == pytest.approx(m_all[key], rel=1e-5, abs=1e-6), key


def test_update_weights_copies_not_once_each(policy, plan_env):
    """Merging without the count would weigh sample 0 once instead of 3 times: a different gradient."""
    trajs, adv = _with_duplicates(policy, plan_env)
    cfg = AlgorithmConfig(max_grad_norm=1e9)
    _, g_all, _ = _update_grad(policy, trajs, adv, cfg)
    _, g_distinct, _ = _update_grad(policy, trajs[:8], adv[:8], cfg)
    assert float((g_all - g_distinct).abs().max()) > 1e-3 * float(g_all.abs().max())


def test_plan_shares_distinct_samples_with_their_counts(policy, plan_env):
    trajs, adv = _with_duplicates(policy, plan_env)
    cfg = AlgorithmConfig(micro_batch_size=2)
    plan = plan_update(trajs, adv, cfg, world_size=2, generator=torch.Generator().manual_seed(0))
    (s0,), (s1,) = plan[0].steps, plan[1].steps
    assert len(s0.indices) + len(s1.indices) == 8
    assert sum(s0.counts) + sum(s1.counts) == 11 == s0.total_seqs
    assert s0.total_tokens == sum(t.num_policy_tokens for t in trajs)
    original = {8: 0, 9: 0, 10: 5}  # the shuffle decides which copy represents its sample
    counts = {original.get(i, i): c for i, c in zip(s0.indices + s1.indices, s0.counts + s1.counts)}
    assert counts == {0: 3, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1, 7: 1}
    off = plan_update(trajs, adv, AlgorithmConfig(micro_batch_size=2, dedup_identical_samples=False), world_size=2,
                      generator=torch.Generator().manual_seed(0))
    assert sum(len(p.steps[0].indices) for p in off) == 11


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_capped_decoupled_loss_does_not_depend_on_the_micro_batches(policy, plan_env, reduction):
    """A capped token weighs 0 but stays counted, so the gradient is the same however the batch is cut."""
    trajs, adv = _with_duplicates(policy, plan_env, off_policy=True)
    grads = []
    for micro in (1, 4, 64):
        cfg = AlgorithmConfig(decoupled_loss=True, behav_imp_weight_cap=1.1, loss_reduction=reduction,
                              micro_batch_size=micro, max_grad_norm=1e9)
        metrics, g, _ = _update_grad(policy, trajs, adv, cfg)
        assert 0 < metrics["policy/behav_capped_fraction"] < 1
        grads.append(g)
    for g in grads[1:]:
        assert float((g - grads[0]).abs().max()) < 1e-4 * float(grads[0].abs().max())
