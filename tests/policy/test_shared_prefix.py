"""Shared-prefix logprobs (each group's common prefix run once) == full-sequence logprobs, with gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlkit.policy import SamplingParams, make_engine
from rlkit.policy.logprobs import compute_logprobs
from rlkit.policy.shared_prefix import compute_logprobs_shared_prefix, forward_images, shared_prefix_clusters
from rlkit.rollout import rollout

from .conftest import perturb_lora

SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)


def _env(mode: str, max_turns: int):
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode=mode, parser="plan" if mode == "plan" else "tuple", max_turns=max_turns)


def _ragged(trajs, cut=(0, 3, 1, 5)):
    """Copies with the last few tokens cut off, so rows of a group differ in length (right padding)."""
    out = []
    for i, t in enumerate(trajs):
        k = cut[i % len(cut)]
        n = len(t.input_ids) - k
        out.append(dataclasses.replace(t, input_ids=t.input_ids[:n], loss_mask=t.loss_mask[:n],
                                       sampling_logprobs=t.sampling_logprobs[:n]))
    return out


def _grads(policy, lp, ent):
    params = policy.trainable_parameters()
    # a loss touching every position of both outputs
    w = torch.linspace(0.5, 1.5, lp.shape[1])
    return torch.autograd.grad(((lp + 0.3 * ent) * w).sum(), params)


def _assert_same(policy, trajs, temperature=1.0, **kwargs):
    lp_a, ent_a = compute_logprobs(policy.model, trajs, temperature, policy.banned_token_ids)
    g_a = _grads(policy, lp_a, ent_a)
    lp_b, ent_b = compute_logprobs_shared_prefix(policy.model, trajs, temperature, policy.banned_token_ids, **kwargs)
    g_b = _grads(policy, lp_b, ent_b)
    assert lp_a.shape == lp_b.shape and ent_a.shape == ent_b.shape
    assert torch.allclose(lp_a, lp_b, atol=2e-5, rtol=0), float((lp_a - lp_b).abs().max())
    assert torch.allclose(ent_a, ent_b, atol=2e-5, rtol=0), float((ent_a - ent_b).abs().max())
    # the two float32 paths sum a prefix's gradient in different orders: on these batches they differ by
    # up to 6e-5 of the largest entry (1.2e-3 of 20.7); a wrong position, mask or cache row is off by
    # the gradient's own size
    for x, y in zip(g_a, g_b):
        assert torch.allclose(x, y, atol=1e-4 * float(x.abs().max()) + 1e-7, rtol=1e-4), float((x - y).abs().max())


@pytest.mark.parametrize("mode,turns", [("plan", 18), ("interactive", 2)], ids=["plan", "interactive-2-turn"])
def test_shared_prefix_logprobs_and_gradients_equal_full_forward(make_policy, mode, turns):
    policy = make_policy()
    perturb_lora(policy.model, seed=1, scale=0.2)
    trajs = rollout(_env(mode, turns), policy, make_engine(policy), seeds=[11, 12], group_size=4, sampling=SAMPLE,
                    policy_version=0)
    trajs = _ragged(trajs)
    clusters = shared_prefix_clusters(trajs, policy.hf_model.config.image_token_id)
    assert [c.rows for c in clusters] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for c in clusters:
        first_policy_token = trajs[c.rows[0]].loss_mask.index(1)
        assert c.prefix_len >= first_policy_token and c.num_prefix_images == 1  # at least the first prompt
    if mode == "interactive":
        assert all(len(t.image_inputs) == 2 for t in trajs)  # the second turn's image is in the suffix
    _assert_same(policy, trajs, temperature=0.8)


def test_shared_prefix_full_fine_tuning(make_policy):
    policy = make_policy(train_mode="full")
    trajs = rollout(_env("plan", 18), policy, make_engine(policy), seeds=[3], group_size=3, sampling=SAMPLE,
                    policy_version=0)
    _assert_same(policy, _ragged(trajs))


def test_prefix_stops_before_a_differing_image_and_singletons_run_in_full(make_policy):
    policy = make_policy()
    perturb_lora(policy.model, seed=2, scale=0.2)
    env = _env("plan", 18)
    trajs = rollout(env, policy, make_engine(policy), seeds=[7, 8], group_size=2, sampling=SAMPLE, policy_version=0)
    # same token ids before the image, but a different maze: claim they are one group
    a, b = trajs[0], dataclasses.replace(trajs[2], group=trajs[0].group)
    lone = dataclasses.replace(trajs[3], group=99)
    mixed = [a, trajs[1], b, lone]
    image_id = policy.hf_model.config.image_token_id
    (c,) = shared_prefix_clusters(mixed, image_id)
    assert c.rows == [0, 1, 2] and c.num_prefix_images == 0
    assert c.prefix_len <= a.input_ids.index(image_id)  # cut before the first image (the differing one)
    _assert_same(policy, mixed)


def test_clusters_leave_every_row_a_suffix_and_never_split_an_image():
    @dataclasses.dataclass
    class Seq:
        input_ids: list
        group: int = 0

    img = 9
    # identical rows: the prefix leaves the last token to each row
    (c,) = shared_prefix_clusters([Seq([1, 2, 3, 4]), Seq([1, 2, 3, 4])], img)
    assert c.prefix_len == 3
    # a text-only prefix that ends inside an image run is cut at the run's start
    assert shared_prefix_clusters([Seq([1, 2, img, img, 5]), Seq([1, 2, img, img])], img)[0].prefix_len == 2
    # nothing in common
    assert shared_prefix_clusters([Seq([1, 2]), Seq([3, 4])], img) == []
    with pytest.raises(ValueError, match="group_keys"):
        shared_prefix_clusters([Seq([1, 2])], img, group_keys=[0, 1])


def test_clusters_with_different_prefix_lengths_share_one_prefix_forward(make_policy):
    policy = make_policy()
    perturb_lora(policy.model, seed=3, scale=0.2)
    plan = rollout(_env("plan", 18), policy, make_engine(policy), seeds=[4], group_size=3, sampling=SAMPLE,
                   policy_version=0)
    inter = rollout(_env("interactive", 2), policy, make_engine(policy), seeds=[5], group_size=2, sampling=SAMPLE,
                    policy_version=0)
    mixed = [plan[0], *[dataclasses.replace(t, group=1) for t in inter], plan[1], plan[2]]
    clusters = shared_prefix_clusters(mixed, policy.hf_model.config.image_token_id)
    assert [c.rows for c in clusters] == [[0, 3, 4], [1, 2]]
    assert clusters[0].prefix_len != clusters[1].prefix_len
    calls = []
    hook = policy.hf_model.get_input_embeddings().register_forward_hook(lambda m, a, o: calls.append(tuple(a[0].shape)))
    try:
        _assert_same(policy, _ragged(mixed))
    finally:
        hook.remove()
    # plain: 1 forward; shared: 1 root forward [1, R] of the text both clusters' prompts open with (their
    # system prompts' common start), 1 prefix forward [2, P_max - R] after its cache, 1 suffix forward [5, S_max]
    p_max = max(c.prefix_len for c in clusters)
    assert calls[0][0] == 5 and [c[0] for c in calls[1:]] == [1, 2, 5]
    r = calls[1][1]
    assert 16 <= r < min(c.prefix_len for c in clusters) and calls[2][1] == p_max - r
    assert mixed[0].input_ids[:r] == mixed[1].input_ids[:r] and mixed[0].input_ids[r] != mixed[1].input_ids[r]
    # FSDP ranks must run the same forwards: uniform_forwards never adds the root's
    calls.clear()
    hook = policy.hf_model.get_input_embeddings().register_forward_hook(lambda m, a, o: calls.append(tuple(a[0].shape)))
    try:
        _assert_same(policy, _ragged(mixed), uniform_forwards=True)
    finally:
        hook.remove()
    assert [c[0] for c in calls[1:]] == [2, 5]


def test_root_prefix_is_cut_before_the_first_image():
    """Two groups of one env share their system prompt up to the image: the root stops at its placeholder."""
    from types import SimpleNamespace

    from rlkit.policy.shared_prefix import MIN_ROOT_PREFIX, PrefixCluster, _root_prefix_len

    img, n = 9, MIN_ROOT_PREFIX + 4
    ids = torch.tensor([[*range(10, 10 + n), img, img, 1, 2, 3], [*range(10, 10 + n), img, img, 4, 5, 6]])
    batch = SimpleNamespace(input_ids=ids)
    clusters = [PrefixCluster([0], 24, 1), PrefixCluster([1], 24, 1)]
    assert _root_prefix_len(batch, clusters, {img}) == n
    assert _root_prefix_len(batch, clusters[:1], {img}) == 0  # one cluster: its prefix forward is the root
    short = torch.tensor([[*range(10, 20), img, 1], [*range(10, 20), img, 2]])
    assert _root_prefix_len(SimpleNamespace(input_ids=short), clusters, {img}) == 0  # 10 < MIN_ROOT_PREFIX tokens
    ids[1, 3] = 99  # the texts part at token 3
    assert _root_prefix_len(batch, clusters, {img}) == 0


def test_trajectory_images_are_not_copied_for_the_prefix_search(make_policy):
    """A group's trajectories share their first turn's ImageInputs: _image_list hands back those very
    tensors (so shared_prefix_clusters compares them by identity, not pixel by pixel), and
    sequence_batch without pixels gives the same positions and ids as with them."""
    from rlkit.policy.batching import _image_list, sequence_batch

    policy = make_policy()
    trajs = rollout(_env("interactive", 2), policy, make_engine(policy), seeds=[11], group_size=2, sampling=SAMPLE,
                    policy_version=0)
    a, b = _image_list(trajs[0]), _image_list(trajs[1])
    assert a[0][0] is trajs[0].image_inputs[0].pixel_values and a[0][0] is b[0][0]
    assert len(a) == len(trajs[0].image_inputs) and all(g.shape == (1, 3) for _, g in a)
    for (pv, g), im in zip(a, trajs[0].image_inputs):
        assert pv is im.pixel_values and torch.equal(g, im.image_grid_thw.reshape(1, 3))
    full = sequence_batch(policy.model, trajs)
    lean = sequence_batch(policy.model, trajs, with_pixels=False)
    assert lean.pixel_values is None and full.pixel_values is not None
    assert torch.equal(full.position_ids, lean.position_ids) and torch.equal(full.input_ids, lean.input_ids)
    assert torch.equal(full.image_grid_thw, lean.image_grid_thw)


def test_uniform_forwards_run_two_model_calls_whatever_the_batch_holds(make_policy):
    """uniform_forwards (FSDP ranks): a row without a group partner is a cluster of one, so the model is
    called exactly twice (prefix, suffix) for any batch, and the result still equals the full forward."""
    policy = make_policy()
    perturb_lora(policy.model, seed=2, scale=0.2)
    trajs = rollout(_env("interactive", 2), policy, make_engine(policy), seeds=[11, 12], group_size=3,
                    sampling=SAMPLE, policy_version=0)
    image_id = policy.hf_model.config.image_token_id
    mixed = _ragged([trajs[0], trajs[1], trajs[3]])  # a group of 2 and a row alone
    clusters = shared_prefix_clusters(mixed, image_id, min_rows=1)
    assert [c.rows for c in clusters] == [[0, 1], [2]]
    assert clusters[1].prefix_len == len(mixed[2].input_ids) - 1 and clusters[1].num_prefix_images == 2
    assert [c.rows for c in shared_prefix_clusters(mixed, image_id)] == [[0, 1]]  # min_rows=2: the row runs plain
    # the pair's second-turn images are in its suffix; the row alone keeps both in its prefix
    assert forward_images(mixed, image_id) == (True, True)
    assert forward_images([mixed[2]], image_id) == (True, False)
    calls = []
    hook = policy.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        for batch in (mixed, [mixed[2]], mixed[:2]):
            calls.clear()
            _assert_same(policy, batch, temperature=0.9, uniform_forwards=True)
            assert len(calls) == 2 + 1, len(calls)  # 2 shared-prefix calls + _assert_same's full forward
            calls.clear()
            compute_logprobs_shared_prefix(policy.model, batch, 0.9, policy.banned_token_ids)
            assert len(calls) == (3 if batch is mixed else 1 if len(batch) == 1 else 2)  # plain rows add a call
    finally:
        hook.remove()
