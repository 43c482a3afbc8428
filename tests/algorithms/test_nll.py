"""rlkit.algorithms.nll: the auxiliary supervised terms (AuxTerm) of the GRPO update (rlkit.update), e.g. the
ReLIFT-style demonstration term (aux_loss.demo_coef), and the NLL they add."""

import copy

import pytest
import torch

from rlkit.algorithms.nll import AuxTerm, active_terms, demonstration_nll
from rlkit.config import AlgorithmConfig
from rlkit.demonstrations import demonstration_trajectory
from rlkit.update import grpo_update
from tests.core.test_rollout_update import _batch
from tests.test_update import _update_grad


def _grad(policy, trajs, adv, cfg, demos=None, coef=0.0):
    """(metrics, accumulated gradient) of one grpo_update with lr 0 on a copy of the policy; ``demos`` (if any)
    as the recipe hands them in: the ``demo`` term with coefficient ``coef`` (aux_loss.demo_coef)."""
    terms = [AuxTerm("demo", coef, demos)] if demos is not None else None
    metrics, grad, _ = _update_grad(policy, trajs, adv, cfg, aux_terms=terms)
    return metrics, grad


def _nll_grad(policy, demos):
    model = copy.deepcopy(policy.model)
    shadow = copy.copy(policy)
    shadow.model = model
    nll = demonstration_nll(shadow, demos)
    nll.backward()
    return float(nll.detach()), torch.cat([q.grad.flatten() for q in model.parameters() if q.requires_grad])


def test_demo_term_adds_coef_times_the_demonstrations_gradient(policy, plan_env):
    trajs, adv = _batch(policy, plan_env)
    demos = [demonstration_trajectory(plan_env, policy, s) for s in (21, 22)]
    assert all(d is not None for d in demos)
    nll, g_demo = _nll_grad(policy, demos)
    base = dict(micro_batch_size=4, max_grad_norm=1e9)
    _, g_rl = _grad(policy, trajs, adv, AlgorithmConfig(**base))
    m, g_both = _grad(policy, trajs, adv, AlgorithmConfig(**base), demos, coef=0.3)
    assert torch.allclose(g_both, g_rl + 0.3 * g_demo, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(g_both, g_rl, atol=1e-6, rtol=1e-4)  # the term is not negligible here
    assert m["demo/nll"] == pytest.approx(nll, rel=1e-5) and m["policy/optimizer_steps"] == 1.0
    # demo_coef 0 (the default): demonstrations handed in change nothing
    m0, g0 = _grad(policy, trajs, adv, AlgorithmConfig(**base), demos)
    assert torch.equal(g0, g_rl) and "demo/nll" not in m0


def test_demo_term_steps_alone_when_no_group_has_signal(policy, plan_env):
    trajs, _ = _batch(policy, plan_env, seeds=(11,), g=2)
    zero = torch.zeros(len(trajs))
    demos = [demonstration_trajectory(plan_env, policy, 23)]
    cfg = AlgorithmConfig(filter_zero_variance_groups=True, max_grad_norm=1e9)
    m, g = _grad(policy, trajs, zero, cfg, demos, coef=1.0)
    _, g_demo = _nll_grad(policy, demos)
    assert torch.allclose(g, g_demo, atol=1e-6, rtol=1e-4) and m["policy/optimizer_steps"] == 1.0
    # without demonstrations the same batch is skipped
    assert _grad(policy, trajs, zero, cfg)[0] == {"policy/skipped": 1.0}
    # and a real step on them lowers their NLL
    shadow = copy.copy(policy)
    shadow.model = copy.deepcopy(policy.model)
    opt = torch.optim.AdamW([q for q in shadow.model.parameters() if q.requires_grad], lr=1e-2)
    with torch.no_grad():
        before = float(demonstration_nll(shadow, demos))
    grpo_update(shadow, opt, trajs, zero, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0),
                aux_terms=[AuxTerm("demo", 1.0, demos)])
    with torch.no_grad():
        assert float(demonstration_nll(shadow, demos)) < before


def test_two_terms_each_log_their_nll_and_add_their_coef_times_gradient(policy, plan_env):
    """Two named terms in one update: each logs ``<name>/nll`` (its own sequences' NLL before the step), and
    the update's gradient is the GRPO gradient plus each term's coef x its NLL gradient (computed by hand)."""
    trajs, adv = _batch(policy, plan_env)
    demos = [demonstration_trajectory(plan_env, policy, s) for s in (21, 22, 23)]
    assert all(d is not None for d in demos)
    first, second = demos[:2], demos[2:]
    nll_a, g_a = _nll_grad(policy, first)
    nll_b, g_b = _nll_grad(policy, second)
    assert abs(nll_a - nll_b) > 1e-4  # the two terms' sequences differ, so a mixed-up metric would show
    base = AlgorithmConfig(micro_batch_size=4, max_grad_norm=1e9)
    _, g_rl = _grad(policy, trajs, adv, base)
    terms = [AuxTerm("demo", 0.3, first), AuxTerm("extra", 0.7, second)]
    m, g, _ = _update_grad(policy, trajs, adv, base, aux_terms=terms)
    assert m["demo/nll"] == pytest.approx(nll_a, rel=1e-5)
    assert m["extra/nll"] == pytest.approx(nll_b, rel=1e-5)
    assert torch.allclose(g, g_rl + 0.3 * g_a + 0.7 * g_b, atol=1e-6, rtol=1e-4)
    # a term with coef 0 or no sequence adds nothing and logs nothing
    m0, g0, _ = _update_grad(policy, trajs, adv, base, aux_terms=[AuxTerm("demo", 0.3, first), AuxTerm("off", 0.0, second),
                                                                   AuxTerm("empty", 0.5, [])])
    assert "off/nll" not in m0 and "empty/nll" not in m0
    assert torch.allclose(g0, g_rl + 0.3 * g_a, atol=1e-6, rtol=1e-4)


def test_active_terms_are_those_with_a_positive_coef_and_a_sequence():
    on = AuxTerm("a", 0.1, [object()])
    assert active_terms([on, AuxTerm("b", 0.0, [object()]), AuxTerm("c", 0.2, [])]) == [on]
    assert active_terms(None) == []
    with pytest.raises(ValueError, match="at least one demonstration"):
        demonstration_nll(None, [])
