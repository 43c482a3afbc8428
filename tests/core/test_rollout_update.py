"""Rollout trajectories, the GRPO update and the SFT encoding on a tiny real policy."""

import copy

import pytest
import torch

from rlkit.config import AlgorithmConfig
from rlkit.demonstrations import demonstration_trajectory
from rlkit.policy import SamplingParams, make_engine
from rlkit.rollout import rollout, rollout_stats, to_tensor
from rlkit.update import grpo_update

SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)


def _policy_spans(traj) -> list[list[int]]:
    """The runs of sampled tokens (loss mask 1) of a trajectory, one per turn, in order."""
    spans, cur = [], []
    for tok, m in zip(traj.input_ids, traj.loss_mask):
        if m:
            cur.append(tok)
        elif cur:
            spans.append(cur)
            cur = []
    return spans


def test_multi_turn_trajectory_layout(policy, interactive_env):
    engine = make_engine(policy)
    trajs = rollout(interactive_env, policy, engine, seeds=[100, 101], group_size=2, sampling=SAMPLE, policy_version=7)
    assert len(trajs) == 4 and [t.group for t in trajs] == [0, 0, 1, 1]
    chat = policy.chat
    for t in trajs:
        assert len(t.input_ids) == len(t.loss_mask) == len(t.sampling_logprobs)
        assert t.policy_version == 7
        n_turns = len(t.episode.turns)
        assert 1 <= n_turns <= 3  # the harness budget
        # one image per user turn (interactive mode shows the new maze every turn)
        assert len(t.image_inputs) == n_turns
        assert t.input_ids.count(chat.image_pad_id) == 81 * n_turns
        # policy tokens: never an image token; their logprobs are set, the others are 0
        for tok, m, lp in zip(t.input_ids, t.loss_mask, t.sampling_logprobs):
            if m:
                assert tok not in policy.banned_token_ids and lp <= 0.0
            else:
                assert lp == 0.0
        # each policy span decodes to the recorded action text
        spans = _policy_spans(t)
        assert len(spans) == n_turns
        assert [chat.decode(s) for s in spans] == [turn.action_text for turn in t.episode.turns]
    # groups share the first prompt
    first_user = trajs[0].loss_mask.index(1)
    assert trajs[0].input_ids[:first_user] == trajs[1].input_ids[:first_user]
    stats = rollout_stats(trajs)
    assert stats["env/mean_turns"] == sum(len(t.episode.turns) for t in trajs) / 4


def test_sampling_logprobs_match_training_logprobs(policy, interactive_env):
    engine = make_engine(policy)
    trajs = rollout(interactive_env, policy, engine, seeds=[5], group_size=3, sampling=SAMPLE, policy_version=0)
    with torch.no_grad():
        lp, _ = policy.logprobs(trajs, temperature=1.0)
    mask = to_tensor([t.loss_mask for t in trajs], torch.float32)
    old = to_tensor([t.sampling_logprobs for t in trajs], torch.float32)
    assert float(((lp - old).abs() * mask).max()) <= 1e-4


def _batch(policy, env, seeds=(11, 12), g=4):
    engine = make_engine(policy)
    trajs = rollout(env, policy, engine, seeds=list(seeds), group_size=g, sampling=SAMPLE, policy_version=0)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(trajs))])
    return trajs, adv


def _seq_logprob(policy, trajs):
    with torch.no_grad():
        lp, _ = policy.logprobs(trajs, temperature=1.0)
    mask = to_tensor([t.loss_mask for t in trajs], torch.float32)
    return (lp * mask).sum(1)


def test_grpo_step_moves_logprobs_with_advantage_sign(policy, plan_env):
    trajs, adv = _batch(policy, plan_env)
    before = _seq_logprob(policy, trajs)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    cfg = AlgorithmConfig(micro_batch_size=4, max_grad_norm=100.0)
    metrics = grpo_update(policy, opt, trajs, adv, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0))
    after = _seq_logprob(policy, trajs)
    delta = after - before
    assert bool((delta[adv > 0] > 0).all()), delta
    assert bool((delta[adv < 0] < 0).all()), delta
    assert metrics["policy/optimizer_steps"] == 1.0
    # on-policy first pass: ratio 1 everywhere, nothing clipped, approx_kl 0
    assert metrics["policy/clip_ratio"] == 0.0 and abs(metrics["policy/approx_kl"]) < 1e-6


@pytest.mark.parametrize("reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_micro_batch_accumulation_equals_one_batch(policy, plan_env, reduction):
    trajs, adv = _batch(policy, plan_env)
    grads = []
    for micro in (len(trajs), 1, 3):
        p = copy.deepcopy(policy.model)
        shadow = copy.copy(policy)
        shadow.model = p
        opt = torch.optim.SGD([q for q in p.parameters() if q.requires_grad], lr=0.0)
        cfg = AlgorithmConfig(micro_batch_size=micro, loss_reduction=reduction, max_grad_norm=1e9)
        # lr 0: the step changes nothing; capture the accumulated gradient before zero_grad
        captured = {}
        orig_step = opt.step

        def step(*a, captured=captured, p=p):
            captured["g"] = torch.cat([q.grad.flatten() for q in p.parameters() if q.requires_grad])
            return orig_step(*a)

        opt.step = step
        grpo_update(shadow, opt, trajs, adv, cfg, temperature=1.0, generator=torch.Generator().manual_seed(0))
        grads.append(captured["g"])
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert torch.allclose(grads[0], grads[2], atol=1e-6, rtol=1e-4)


def test_sft_demonstration_encoding(policy, interactive_env, plan_env):
    chat = policy.chat
    for env in (plan_env, interactive_env):
        t = demonstration_trajectory(env, policy, seed=0)
        texts = env.demonstration(0)
        if env.max_turns < len(texts):
            assert t is None
            continue
        assert t is not None and t.episode.success
        policy_ids = [tok for tok, m in zip(t.input_ids, t.loss_mask) if m]
        expected = [tok for text in texts for tok in chat.completion_ids(text)]
        assert policy_ids == expected


def test_demonstration_metrics_exact_on_scripted_logprobs(policy, plan_env):
    """Two plan demonstrations whose first moves differ; scripted logprobs: every demonstrated token
    of demo 0 gets p=0.9, of demo 1 p=0.2 -> loss, accuracy and first-move accuracy are exact."""
    import math

    from envs.visgym.episode import solution_actions
    from rlkit.stages.sft import demonstration_metrics

    seeds = [s for s in range(20) if solution_actions("easy", s)[0] != solution_actions("easy", 0)[0]][:1]
    demos = [demonstration_trajectory(plan_env, policy, seed=s) for s in [0, *seeds]]
    probs = [0.9, 0.2]

    class Scripted:
        def logprobs(self, chunk, temperature=1.0, with_entropy=True):
            t_max = max(len(t.input_ids) for t in chunk)
            out = torch.zeros(len(chunk), t_max)
            for i, t in enumerate(chunk):
                out[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32) * math.log(probs[demos.index(t)])
            return out, None

    n0, n1 = demos[0].num_policy_tokens, demos[1].num_policy_tokens
    m = demonstration_metrics(Scripted(), demos, batch_size=1)
    assert m["loss"] == pytest.approx((-n0 * math.log(0.9) - n1 * math.log(0.2)) / (n0 + n1), rel=1e-6)
    assert m["token_accuracy"] == pytest.approx(n0 / (n0 + n1))
    assert m["first_token_accuracy"] == 0.5
    same = demonstration_metrics(Scripted(), [demos[0]])
    assert math.isnan(same["first_token_accuracy"]) and same["token_accuracy"] == 1.0
    with pytest.raises(ValueError):
        demonstration_metrics(Scripted(), [])


def test_saved_adapter_is_readable_by_other_users(policy, tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        policy.save_adapter(tmp_path / "adapter")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "adapter").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "adapter" / "adapter_model.safetensors").stat().st_mode) == 0o644


def test_max_grad_norm_zero_means_no_clipping(policy, plan_env):
    trajs, adv = _batch(policy, plan_env, seeds=(11,), g=2)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=1e-2)
    metrics = grpo_update(policy, opt, trajs, adv, AlgorithmConfig(micro_batch_size=4, max_grad_norm=0.0),
                          temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert metrics["policy/grad_norm"] > 0
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(policy.trainable_parameters(), before))
    assert moved > 0  # with clip_grad_norm_(max_norm=0) every gradient was scaled to 0 and nothing moved


def _captured_grad(policy, trajs, adv, cfg):
    """The update's accumulated gradient (lr 0: the policy does not move) and its metrics."""
    from tests.test_update import _update_grad

    metrics, grad, _ = _update_grad(policy, trajs, adv, cfg)
    return grad, metrics


def test_overlong_filtering_leaves_length_cut_samples_out_of_the_loss(policy, plan_env):
    # DAPO overlong filtering: a sample cut at max_new_tokens contributes nothing; the others as if it
    # had never been sampled (token_mean: it does not count in the denominator either)
    trajs, adv = _batch(policy, plan_env)
    trajs = [copy.copy(t) for t in trajs]
    for t in trajs:  # the random policy's samples all run to max_new_tokens; call them ended but one
        t.num_truncated_turns = 0
    cut = copy.copy(trajs[1])
    cut.num_truncated_turns = 1
    with_cut = [trajs[0], cut, *trajs[2:]]
    rest = [trajs[0], *trajs[2:]]
    rest_adv = torch.cat([adv[:1], adv[2:]])
    for reduction in ("token_mean", "seq_mean_token_mean"):
        on = AlgorithmConfig(micro_batch_size=len(trajs), max_grad_norm=1e9, loss_reduction=reduction)
        on.overlong_filtering = True
        g_filtered, _ = _captured_grad(policy, with_cut, adv, on)
        g_without, _ = _captured_grad(policy, rest, rest_adv, on)
        assert torch.allclose(g_filtered, g_without, atol=1e-7, rtol=1e-5)
        off = AlgorithmConfig(micro_batch_size=len(trajs), max_grad_norm=1e9, loss_reduction=reduction)
        g_kept, _ = _captured_grad(policy, with_cut, adv, off)
        assert not torch.allclose(g_kept, g_without, atol=1e-6, rtol=1e-3)
    # every sample cut: nothing to train on, the step is skipped
    all_cut = [copy.copy(t) for t in trajs]
    for t in all_cut:
        t.num_truncated_turns = 1
    g, metrics = _captured_grad(policy, all_cut, adv, AlgorithmConfig(overlong_filtering=True))
    assert g is None and metrics == {"policy/skipped": 1.0}


def test_a_recovery_demonstration_learns_every_turn_but_its_mistake(policy):
    """sft.recovery_share's trajectories: the mistake's tokens are in the context (the policy sees what it did and
    the env's answer) with loss mask 0; every other turn's answer is learned, in order."""
    import numpy as np

    from envs.visgym import VisGymMaze

    env = VisGymMaze(variant="small", mode="interactive", parser="tuple", max_turns=17)
    chat = policy.chat
    turns = env.recovery_demonstration(4, np.random.default_rng(0))
    t = demonstration_trajectory(env, policy, seed=4, recovery_rng=np.random.default_rng(0))
    assert t is not None and t.episode.success
    learned = [tok for tok, m in zip(t.input_ids, t.loss_mask) if m]
    assert learned == [tok for text, imitate in turns if imitate for tok in chat.completion_ids(text)]
    mistake = chat.completion_ids(next(text for text, imitate in turns if not imitate))
    starts = [i for i in range(len(t.input_ids)) if t.input_ids[i:i + len(mistake)] == mistake]
    assert any(not any(t.loss_mask[i:i + len(mistake)]) for i in starts)  # in the context, not learned
    assert len(t.image_inputs) == len(turns)  # one picture per turn, the mistake's outcome included
    # a demonstration too long for the turn budget is skipped, as a plain one is
    short = VisGymMaze(variant="small", mode="interactive", parser="tuple", max_turns=len(turns) - 1)
    assert demonstration_trajectory(short, policy, seed=4, recovery_rng=np.random.default_rng(0)) is None


def test_consecutive_turns_draw_independent_tokens(policy, interactive_env):
    """Under a policy whose next-token distribution ignores its context (the final norm zeroed: every logit 0,
    uniform over the vocabulary), turn t and turn t+1 of one episode are independent draws: position k of
    the two completions agrees by chance alone (~1/V). Each engine call reseeds its generator with the
    call's seed, so before rlkit.rollout.turn_seed every later turn repeated the previous turn's draws
    (all positions equal)."""
    with torch.no_grad():
        policy.model.get_submodule("base_model.model.model.language_model.norm").weight.zero_()
    engine = make_engine(policy)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    trajs = rollout(interactive_env, policy, engine, seeds=[100, 101], group_size=2, sampling=sampling,
                    policy_version=0)
    equal = total = 0
    for t in trajs:
        spans = _policy_spans(t)
        assert len(spans) == len(t.episode.turns) == 3  # uniform junk never ends an episode early
        for a, b in zip(spans[1:], spans[2:]):
            equal += sum(x == y for x, y in zip(a, b))
            total += min(len(a), len(b))
    assert total >= 24
    assert equal <= 2, f"{equal} of {total} token positions repeat between consecutive turns"
    # and the draws are still reproducible from the seed
    again = rollout(interactive_env, policy, engine, seeds=[100, 101], group_size=2, sampling=sampling,
                    policy_version=0)
    assert [t.input_ids for t in again] == [t.input_ids for t in trajs]


def test_turn_seed_keeps_turn_zero_and_spreads_later_turns():
    from rlkit.rollout import turn_seed

    assert turn_seed(7, 0) == 7 and turn_seed(None, 3) is None
    later = {turn_seed(s, t) for s in range(50) for t in range(1, 20)}
    assert len(later) == 50 * 19  # no two (seed, turn) pairs share a seed
    assert all(0 <= x < 2**63 for x in later) and not later & set(range(100))  # not a nearby step's seed
    assert turn_seed(-5, 2) == turn_seed(2**64 - 5, 2)
