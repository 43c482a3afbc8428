"""The vision feature cache: a frozen tower's kept outputs equal fresh ones; it steps aside when the tower trains
or its weights change."""

from __future__ import annotations

import torch

from rlkit.policy import SamplingParams, make_engine
from rlkit.policy.logprobs import compute_logprobs
from rlkit.policy.shared_prefix import compute_logprobs_shared_prefix
from rlkit.rollout import rollout

from .conftest import perturb_lora


def _env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=2)


def _logprobs_and_grads(policy, trajs, shared):
    fn = compute_logprobs_shared_prefix if shared else compute_logprobs
    lp, ent = fn(policy.model, trajs, 1.0, policy.banned_token_ids)
    grads = torch.autograd.grad((lp + 0.3 * ent).sum(), policy.trainable_parameters())
    return lp.detach(), grads


def test_kept_features_equal_fresh_ones_in_logprobs_and_gradients(make_policy):
    policy = make_policy()
    perturb_lora(policy.model, seed=3, scale=0.2)
    cache = policy.vision_cache
    assert cache is not None and cache.enabled
    trajs = rollout(_env(), policy, make_engine(policy), seeds=[21, 22], group_size=3,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=6, seed=2), policy_version=0)
    n_images = sum(len(t.image_inputs) for t in trajs)
    assert cache.misses >= 2  # the rollout encoded its images and kept them
    for shared in (False, True):
        hits = cache.hits
        lp_a, g_a = _logprobs_and_grads(policy, trajs, shared)  # images served from the cache
        assert cache.hits > hits
        cache.enabled = False
        lp_b, g_b = _logprobs_and_grads(policy, trajs, shared)  # every image encoded afresh
        cache.enabled = True
        assert torch.equal(lp_a, lp_b)
        for x, y in zip(g_a, g_b):
            assert torch.equal(x, y)
    assert n_images > 2


def test_a_batch_repeating_an_image_encodes_it_once(make_policy):
    policy = make_policy()
    cache = policy.vision_cache
    trajs = rollout(_env(), policy, make_engine(policy), seeds=[5], group_size=4,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=4, seed=1), policy_version=0)
    cache.clear()
    misses = cache.misses
    with torch.no_grad():
        lp_a, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
    distinct = {id(im.pixel_values) for t in trajs for im in t.image_inputs}  # turn-1 image shared by the group
    assert cache.misses - misses <= len(distinct) < sum(len(t.image_inputs) for t in trajs)
    cache.enabled = False
    with torch.no_grad():
        lp_b, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
    assert torch.equal(lp_a, lp_b)


def test_cache_steps_aside_when_the_tower_trains_or_changes(make_policy):
    policy = make_policy()
    cache = policy.vision_cache
    trajs = rollout(_env(), policy, make_engine(policy), seeds=[9], group_size=2,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=4, seed=1), policy_version=0)
    visual = cache.visual
    # a changed vision weight empties the cache: the features are computed with the new weights
    with torch.no_grad():
        before, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
        next(visual.parameters()).mul_(1.5)
        misses = cache.misses
        after, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
        assert cache.misses > misses and not torch.equal(before, after)
        cache.enabled = False
        fresh, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
        cache.enabled = True
        assert torch.equal(after, fresh)
    # a trainable tower (full fine-tuning) gets its graph: no kept features, gradients reach it
    for p in visual.parameters():
        p.requires_grad_(True)
    hits, misses = cache.hits, cache.misses
    lp, _ = compute_logprobs(policy.model, trajs, 1.0, policy.banned_token_ids)
    assert (cache.hits, cache.misses) == (hits, misses)
    lp.sum().backward()
    assert next(visual.parameters()).grad is not None


def test_full_fine_tuning_policy_bypasses_the_cache(make_policy):
    policy = make_policy(lora={"enabled": False})
    cache = policy.vision_cache
    rollout(_env(), policy, make_engine(policy), seeds=[9], group_size=2,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=4, seed=1), policy_version=0)
    assert cache.hits == cache.misses == 0
