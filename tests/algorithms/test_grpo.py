"""Hand-computed checks of the GRPO math (rlkit/algorithms/grpo.py)."""

import math

import pytest
import torch

from rlkit.algorithms import grpo


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0 -> mean 0.5, unbiased std sqrt(0.5) = 0.7071
    # group 2: rewards 1, 1 -> zero variance -> advantages 0
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv = grpo.group_advantages(r, group_size=2, eps=0.0)
    s = math.sqrt(0.5)
    assert torch.allclose(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]), atol=1e-6)


def test_group_advantages_dr_grpo_no_std():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0])
    adv = grpo.group_advantages(r, group_size=3, norm_by_std=False)
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3, -4 / 3, 5 / 3, -1 / 3])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_group_advantages_g1_and_errors():
    assert torch.equal(grpo.group_advantages(torch.tensor([1.0, 0.0]), 1), torch.zeros(2))
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo.group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.zeros(4), 0)


def test_zero_variance_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert grpo.zero_variance_groups(r, 2).tolist() == [True, False, True]


def _loss(lp, old, adv, mask=None, **kw):
    lp = torch.tensor([[lp]], dtype=torch.float32)
    old = torch.tensor([[old]], dtype=torch.float32)
    mask = torch.ones_like(lp) if mask is None else mask
    return grpo.policy_loss(lp, old, torch.tensor([adv]), mask, **kw)


@pytest.mark.parametrize(
    "ratio, adv, expected, clipped",
    [
        (1.1, 1.0, -1.1, False),  # inside the range: -A * ratio
        (1.5, 1.0, -1.2, True),  # above 1+eps, A>0: clipped to -A*(1.2)
        (0.5, 1.0, -0.5, False),  # below 1-eps, A>0: min of surrogates keeps unclipped (pessimistic)
        (0.5, -1.0, 0.8, True),  # below 1-eps, A<0: clipped to -A*0.8
        (1.5, -1.0, 1.5, False),  # above 1+eps, A<0: unclipped is larger -> kept
    ],
)
def test_policy_loss_clip_cases(ratio, adv, expected, clipped):
    loss, diag = _loss(math.log(ratio), 0.0, adv, eps_clip_low=0.2, eps_clip_high=0.2)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert diag["clip_fraction"].item() == (1.0 if clipped else 0.0)


def test_clip_higher_asymmetric():
    # ratio 1.25 with A>0: inside [0.8, 1.28] -> unclipped; with symmetric 0.2 it would clip at 1.2
    loss, _ = _loss(math.log(1.25), 0.0, 1.0, eps_clip_low=0.2, eps_clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25, abs=1e-5)
    loss, _ = _loss(math.log(1.25), 0.0, 1.0, eps_clip_low=0.2, eps_clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2, abs=1e-5)


def test_dual_clip_bounds_negative_advantage():
    # ratio 10, A=-1: PPO loss would be 10; dual clip with c=3 bounds it to 3
    loss, diag = _loss(math.log(10.0), 0.0, -1.0, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(3.0, abs=1e-4)
    assert diag["dual_clip_fraction"].item() == 1.0
    with pytest.raises(ValueError):
        _loss(0.0, 0.0, 1.0, clip_ratio_c=0.5)


def test_reductions_hand_computed():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert grpo.aggregate_loss(per_token, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert grpo.aggregate_loss(per_token, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert grpo.aggregate_loss(per_token, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="unknown loss reduction"):
        grpo.aggregate_loss(per_token, mask, "nope")
    # an all-masked batch gives 0, not NaN
    zero = grpo.aggregate_loss(per_token, torch.zeros_like(mask), "seq_mean_token_mean")
    assert zero.item() == 0.0


def test_kl_estimators_hand_computed():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    d = math.log(0.5) - math.log(0.25)  # log p - log p_ref = log 2
    assert grpo.kl_penalty(lp, ref, "k1").item() == pytest.approx(d)
    assert grpo.kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert grpo.kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1.0)
    assert grpo.kl_penalty(ref, ref, "k3").item() == 0.0


def test_k3_is_unbiased_kl_estimate():
    # E_{x~p}[k3] = KL(p || q) for two categorical distributions
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    exact = (p * (p / q).log()).sum().item()
    est = (p * grpo.kl_penalty(p.log()[None], q.log()[None], "k3")[0]).sum().item()
    assert est == pytest.approx(exact, rel=1e-5)


def test_vectorised_loss_matches_plain_loop():
    g = torch.Generator().manual_seed(0)
    N, T = 6, 9
    lp = torch.randn(N, T, generator=g) * 0.3 - 1.0
    old = lp + torch.randn(N, T, generator=g) * 0.2
    adv = torch.randn(N, generator=g)
    mask = (torch.rand(N, T, generator=g) > 0.3).float()
    lo, hi, c = 0.2, 0.28, 3.0
    for reduction in ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]:
        loss, _ = grpo.policy_loss(lp, old, adv, mask, lo, hi, c, reduction)
        seq_vals, all_vals = [], []
        for i in range(N):
            toks = []
            for t in range(T):
                if mask[i, t] == 0:
                    continue
                ratio = math.exp(lp[i, t].item() - old[i, t].item())
                a = adv[i].item()
                v = max(-a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi))
                if a < 0:
                    v = min(v, -a * c)
                toks.append(v)
            all_vals += toks
            if toks:
                seq_vals.append(sum(toks) / len(toks) if reduction == "seq_mean_token_mean" else sum(toks))
        expected = sum(all_vals) / len(all_vals) if reduction == "token_mean" else sum(seq_vals) / len(seq_vals)
        assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6), reduction


def test_gradient_direction():
    # One gradient step on the loss raises the logprob of positive-advantage tokens and lowers negative ones.
    logits = torch.zeros(2, 4, requires_grad=True)  # two sequences, one token each, vocab 4
    taken = torch.tensor([1, 2])
    adv = torch.tensor([1.0, -1.0])
    lp = torch.log_softmax(logits, -1).gather(1, taken[:, None])  # [2, 1]
    loss, _ = grpo.policy_loss(lp, lp.detach(), adv, torch.ones(2, 1))
    loss.backward()
    with torch.no_grad():
        new = torch.log_softmax(logits - 1.0 * logits.grad, -1).gather(1, taken[:, None])
    assert new[0, 0] > lp[0, 0] and new[1, 0] < lp[1, 0]
