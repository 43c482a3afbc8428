"""algorithm.demo_coef: the ReLIFT-style demonstration term of the GRPO update (rlkit.update)."""

import copy

import pytest
import torch

from rlkit.config import AlgorithmConfig
from rlkit.rollout import Trajectory
from rlkit.sft import demonstration_nll, demonstration_trajectory
from rlkit.types import Episode
from rlkit.update import demonstration_tasks, grpo_update
from tests.core.test_rollout_update import _batch
from tests.core.test_shared_prefix_update import _update_grad


def _grad(policy, trajs, adv, cfg, demos=None):
    """(metrics, accumulated gradient) of one grpo_update with lr 0 on a copy of the policy."""
    metrics, grad, _ = _update_grad(policy, trajs, adv, cfg, demonstrations=demos)
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
    m, g_both = _grad(policy, trajs, adv, AlgorithmConfig(demo_coef=0.3, **base), demos)
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
    cfg = AlgorithmConfig(demo_coef=1.0, filter_zero_variance_groups=True, max_grad_norm=1e9)
    m, g = _grad(policy, trajs, zero, cfg, demos)
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
                demonstrations=demos)
    with torch.no_grad():
        assert float(demonstration_nll(shadow, demos)) < before


def _traj(seed, success):
    ep = Episode(seed=seed, turns=[], terminated=True, truncated=False, success=success)
    return Trajectory([1], [1], [0.0], [], ep, group=0, policy_version=0)


def test_demonstration_tasks_are_the_groups_without_a_success():
    g = 3
    groups = [(5, [False, False, False]), (6, [False, True, False]), (7, [False] * 3), (5, [False] * 3),
              (8, [True] * 3)]
    trajs = [_traj(seed, s) for seed, flags in groups for s in flags]
    assert demonstration_tasks(trajs, g) == [5, 7]  # in order, each once (task 5 drawn again in a later round)
    with pytest.raises(ValueError, match="whole groups"):
        demonstration_tasks(trajs[:-1], g)


def test_demo_max_successes_also_picks_groups_with_few_successes():
    g = 4
    groups = [(5, [False] * 4), (6, [False, True, False, False]), (7, [True, True, False, False]),
              (8, [True] * 4), (9, [False, False, False, True])]
    trajs = [_traj(seed, s) for seed, flags in groups for s in flags]
    assert demonstration_tasks(trajs, g, max_successes=0) == [5]
    assert demonstration_tasks(trajs, g, max_successes=1) == [5, 6, 9]
    assert demonstration_tasks(trajs, g, max_successes=2) == [5, 6, 7, 9]
    assert demonstration_tasks(trajs, g, max_successes=3) == [5, 6, 7, 9]  # an all-success group is never picked
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="demo_max_successes"):
            demonstration_tasks(trajs, g, max_successes=bad)
