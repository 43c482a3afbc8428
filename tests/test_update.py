"""The GRPO update with the shared-prefix forward (algorithm.shared_prefix) == the full-sequence update:
logprobs, loss (and its parts) and parameter gradients, for each loss reduction, with KL on, with
micro-batches that cut groups, in plan mode and on a 2-turn interactive batch."""

import copy

import pytest
import torch

from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams, make_engine
from rlkit.rollout import rollout
from rlkit.update import grpo_update, micro_batch_loss, order_by_group, use_shared_prefix

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


def _update_grad(policy, trajs, adv, cfg, demonstrations=None, route_questions=None):
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
                              demonstrations=demonstrations, route_questions=route_questions)
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
    """SFT and grounding batches (rlkit.sft.batch_shares_prefix): every demonstration is group 0, so
    the batch's common prefix (the system prompt, up to the first image, which differs by maze) runs
    once; the loss and its gradients equal the full-sequence forward's."""
    from rlkit.policy.logprobs import shared_prefix_clusters
    from rlkit.sft import batch_shares_prefix, demonstration_trajectory

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
