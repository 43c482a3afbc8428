"""rlkit.update, the GRPO update.

The shared-prefix forward (algorithm.shared_prefix) == the full-sequence update: logprobs, loss (and its parts)
and parameter gradients, for each loss reduction, with KL on, with micro-batches that cut groups, in plan mode
and on a 2-turn interactive batch. Identical samples run once (algorithm.dedup_identical_samples): which samples
count as identical, the weighted loss reductions, and the update with duplicates == the update without the merge.
"""

import copy

import pytest
import torch

from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams, make_engine
from rlkit.rollout import rollout
from rlkit.algorithms import grpo
from rlkit.distributed.update import plan_update
from rlkit.update import grpo_update, identical_samples, micro_batch_loss, order_by_group, use_shared_prefix

SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)


def _perturbed(policy):
    """A trained-looking adapter, so the reference (adapter off) differs from the policy and KL > 0."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return policy


def _batch(policy, env, seeds=(11, 12), g=4):
    trajs = rollout(env, policy, make_engine(policy), seeds=list(seeds), group_size=g, sampling=SAMPLE, policy_version=0)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.5, 0.75, -0.25, 1.25, -1.0])[: len(trajs)]
    return trajs, adv


def _update_grad(policy, trajs, adv, cfg, aux_terms=None):
    """(metrics, accumulated gradient, token positions embedded) of one grpo_update with lr 0 (the step changes nothing)."""
    model = copy.deepcopy(policy.model)
    shadow = copy.copy(policy)
    shadow.model = model
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)
    captured = {}
    orig_step = opt.step

    def step(*a):
        captured["g"] = torch.cat([q.grad.flatten() for q in params])
        return orig_step(*a)

    opt.step = step
    tokens = [0]
    embed = shadow.hf_model.get_input_embeddings()
    hook = embed.register_forward_hook(lambda mod, args, out: tokens.__setitem__(0, tokens[0] + args[0].numel()))
    try:
        metrics = grpo_update(shadow, opt, trajs, adv, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0),
                              aux_terms=aux_terms)
    finally:
        hook.remove()
    return metrics, captured.get("g"), tokens[0]  # no gradient when the update was skipped


def _assert_update_equal(policy, trajs, adv, **algo):
    runs = {}
    for shared in (False, True):
        cfg = AlgorithmConfig(shared_prefix=shared, max_grad_norm=1e9, **algo)
        runs[shared] = _update_grad(policy, trajs, adv, cfg)
    (m_plain, g_plain, tok_plain), (m_shared, g_shared, tok_shared) = runs[False], runs[True]
    assert tok_shared < tok_plain  # the shared path ran: fewer token positions through the model
    assert float(g_plain.abs().max()) > 0
    # float32 rounding, relative to the gradient's scale: the two paths sum in different orders, and
    # oneDNN's kernels (AMX / AVX-512 machines differ) set how far apart: up to 1.9e-5 x max|g| seen on
    # one element here. A wrong prefix gradient is off by O(max|g|).
    err = float((g_plain - g_shared).abs().max()) / float(g_plain.abs().max())
    assert err < 1e-4, err
    for key in ("policy/loss", "policy/pg_loss", "policy/entropy", "policy/approx_kl", "policy/kl", "policy/grad_norm"):
        if key in m_plain:
            assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-5, abs=1e-6), key
    assert set(m_plain) == set(m_shared)
    return m_plain


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_shared_prefix_update_equals_plain_plan_mode(policy, plan_env, reduction):
    policy = _perturbed(policy)
    trajs, adv = _batch(policy, plan_env)
    # micro-batches of 3 cut the groups of 4 (each part recomputes its prefix); 8 = one micro-batch
    for micro in (3, 8):
        _assert_update_equal(policy, trajs, adv, loss_reduction=reduction, micro_batch_size=micro)


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_shared_prefix_update_equals_plain_with_kl(policy, plan_env, reduction):
    policy = _perturbed(policy)
    trajs, adv = _batch(policy, plan_env)
    m = _assert_update_equal(policy, trajs, adv, loss_reduction=reduction, micro_batch_size=4, kl_coef=0.5,
                             entropy_coef=0.01, mini_batch_size=4)
    assert m["policy/kl"] > 0 and m["policy/optimizer_steps"] == 2.0


def test_shared_prefix_update_equals_plain_two_turn_interactive(policy):
    from envs.visgym import VisGymMaze

    env = VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=2)
    policy = _perturbed(policy)
    trajs, adv = _batch(policy, env)
    assert max(len(t.episode.turns) for t in trajs) == 2
    _assert_update_equal(policy, trajs, adv, micro_batch_size=8, kl_coef=0.1)


def test_micro_batch_logprobs_and_loss_equal(policy, plan_env):
    policy = _perturbed(policy)
    trajs, adv = _batch(policy, plan_env)
    cfg = AlgorithmConfig(kl_coef=0.2)
    lp_plain, _ = policy.logprobs(trajs)
    lp_shared, _ = policy.logprobs(trajs, shared_prefix=True)
    assert torch.allclose(lp_plain, lp_shared, atol=2e-5, rtol=0)
    loss_plain, _, d_plain = micro_batch_loss(policy, trajs, adv, cfg, 1.0, shared_prefix=False)
    loss_shared, _, d_shared = micro_batch_loss(policy, trajs, adv, cfg, 1.0, shared_prefix=True)
    assert float(loss_shared.detach()) == pytest.approx(float(loss_plain.detach()), rel=1e-5, abs=1e-7)
    assert float(d_shared["kl"]) == pytest.approx(float(d_plain["kl"]), rel=1e-5, abs=1e-7)


def test_order_by_group_and_fallbacks(policy, plan_env):
    trajs, _ = _batch(policy, plan_env)
    assert order_by_group(trajs, [5, 0, 6, 1, 4, 2]) == [5, 6, 4, 0, 1, 2]
    assert use_shared_prefix(policy, AlgorithmConfig()) and not use_shared_prefix(policy, AlgorithmConfig(shared_prefix=False))
    policy.hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert not use_shared_prefix(policy, AlgorithmConfig())  # the KV cache is dropped under checkpointing


def test_supervised_batch_shares_the_system_prompt_exactly(policy, plan_env):
    """SFT and grounding batches (rlkit.algorithms.nll.batch_shares_prefix): every demonstration is group 0, so
    the batch's common prefix (the system prompt, up to the first image, which differs by maze) runs
    once; the loss and its gradients equal the full-sequence forward's."""
    from rlkit.policy.shared_prefix import shared_prefix_clusters
    from rlkit.algorithms.nll import batch_shares_prefix
    from rlkit.demonstrations import demonstration_trajectory

    demos = [demonstration_trajectory(plan_env, policy, seed=s) for s in (1000, 1001, 1002, 1003)]
    demos = [d for d in demos if d is not None]
    assert len(demos) >= 3 and batch_shares_prefix(policy)
    (cluster,) = shared_prefix_clusters(demos, policy.chat.image_pad_id)
    first_image = demos[0].input_ids.index(policy.chat.image_pad_id)
    assert cluster.prefix_len == first_image and cluster.num_prefix_images == 0  # cut at the image: mazes differ

    def loss_and_grad(shared):
        policy.model.zero_grad(set_to_none=True)
        lp, _ = policy.logprobs(demos, temperature=1.0, with_entropy=False, shared_prefix=shared)
        mask = torch.zeros_like(lp)
        for i, d in enumerate(demos):
            mask[i, : len(d.loss_mask)] = torch.tensor(d.loss_mask, dtype=torch.float32)
        loss = -(lp * mask).sum() / mask.sum()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.requires_grad])
        return float(loss.detach()), grads

    (l_plain, g_plain), (l_shared, g_shared) = loss_and_grad(False), loss_and_grad(True)
    assert l_shared == pytest.approx(l_plain, rel=1e-6)
    assert float(g_plain.abs().max()) > 0
    assert torch.allclose(g_plain, g_shared, atol=1e-6 * float(g_plain.abs().max()) + 1e-8, rtol=1e-4)


def test_minibatches_hold_whole_groups_and_run_each_prompt_once(policy, plan_env):
    from rlkit.update import minibatches

    class T:
        def __init__(self, group):
            self.group = group

    trajs = [T(i // 4) for i in range(16)]  # 4 groups of 4
    gen = torch.Generator().manual_seed(0)
    batches = minibatches(trajs, list(range(16)), 8, gen)
    assert [len(b) for b in batches] == [8, 8] and sorted(i for b in batches for i in b) == list(range(16))
    for b in batches:  # two whole groups each
        assert len({i // 4 for i in b}) == 2
        assert all(sum(1 for j in b if j // 4 == i // 4) == 4 for i in b)
    # the groups' order is the generator's: another seed draws another pairing or order
    orders = {tuple(map(tuple, minibatches(trajs, list(range(16)), 8, torch.Generator().manual_seed(s)))) for s in range(8)}
    assert len(orders) > 1
    # one mini-batch: a shuffle of the sequences (unchanged draws); no group: each sequence its own
    ref = torch.Generator().manual_seed(1)
    assert minibatches(trajs, list(range(16)), 16, torch.Generator().manual_seed(1)) == [torch.randperm(16, generator=ref).tolist()]
    plain = [object() for _ in range(6)]
    ref = torch.Generator().manual_seed(2)
    order = torch.randperm(6, generator=ref).tolist()
    assert minibatches(plain, list(range(6)), 4, torch.Generator().manual_seed(2)) == [order[:4], order[4:]]
    # in the update: mini-batches of whole groups run each group's prompt once (token positions counted)
    policy = _perturbed(policy)
    batch, adv = _batch(policy, plan_env)  # 2 groups of 4
    _, _, tok_all = _update_grad(policy, batch, adv, AlgorithmConfig(micro_batch_size=8))
    _, _, tok_mini = _update_grad(policy, batch, adv, AlgorithmConfig(micro_batch_size=8, mini_batch_size=4))
    alone = [_update_grad(policy, batch[k : k + 4], adv[k : k + 4], AlgorithmConfig())[2] for k in (0, 4)]
    assert tok_mini == sum(alone)  # each mini-batch: its group's prompt once
    # one mini-batch of both groups: their common system prompt once too (the root prefix)
    assert tok_all < tok_mini


# -- identical samples run once ------------------------------------------------------------------
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
