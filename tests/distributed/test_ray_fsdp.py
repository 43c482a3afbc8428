"""2 FSDP2 trainer ranks (gloo) + 2 rollout workers as Ray actors on CPU, against a single-process run.

One cluster for the module (start-up is most of the cost): trainer rank r and rollout worker r share
bundle r of a 2-bundle placement group (colocate=true, half a CPU each).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlkit.algorithms.nll import AuxTerm
from rlkit.config import AlgorithmConfig, OptimConfig
from rlkit.distributed.cluster import RayCluster
from rlkit.distributed.runtime import RaySettings
from rlkit.policy import PromptInput, SamplingParams, make_engine
from rlkit.policy.lora import lora_state_dict, load_adapter_inplace, save_adapter
from rlkit.rollout import rollout
from rlkit.sync import SyncError, version_dir
from rlkit.update import grpo_update
from tests.distributed.conftest import max_abs_diff as _max_diff
from tests.distributed.conftest import assert_optimizer_state_matches, perturb_lora, start_cluster

OPTIM = OptimConfig()  # the trainer ranks' AdamW settings (TrainerSpec.optim's default)

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
# mini-batches of 3 over 6 sequences split 2/1 across the ranks, micro-batches of 1: rank 1 runs a
# filler micro-batch; clipping, the KL term (reference = adapter off) and the entropy bonus all active.
# shared_prefix off: the 2 ranks run the full-sequence forward (rlkit.distributed.update), and AdamW's
# normalisation turns the float32 rounding differences of another forward into ~1e-5 weight differences;
# shared-prefix == full forward is tested in tests/core/test_shared_prefix_update.py.
ALGO = AlgorithmConfig(mini_batch_size=3, micro_batch_size=1, max_grad_norm=0.1, kl_coef=0.05, entropy_coef=0.01,
                       loss_reduction="token_mean", shared_prefix=False)
LR = 2e-2
TOL = 1e-5


@pytest.fixture(scope="module")
def cluster(ray_local, policy_node, env_node, tmp_path_factory):
    settings = RaySettings(num_workers=2, num_rollout_workers=2, colocate=True, cpus_per_worker=1,
                           sync_timeout_s=3.0, keep_versions=3, startup_timeout_s=300)
    c = start_cluster(settings, ALGO, LR, policy_node, env_node, tmp_path_factory.mktemp("shared") / "lora_sync" / "run",
                      sync_timeout_s=3.0, keep_versions=3)
    yield c
    c.shutdown()


def _prompt(policy) -> PromptInput:
    from tests.policy.conftest import maze_image

    tt = policy.chat.user_turn("Which way to the goal?", [maze_image(7)], system="You are in a maze.", first=True)
    return PromptInput(input_ids=tt.input_ids, **policy.chat.concat_images(tt.image_inputs))


def test_two_ranks_and_two_rollout_workers_match_single_process(cluster, make_policy, env_node, tmp_path):
    from envs.visgym import VisGymMaze

    env = VisGymMaze(**{k: v for k, v in env_node.items() if k != "_target_"})
    assert cluster.sharded is True  # 2 ranks: FSDP2
    # both sides start from the same non-trivial adapter (resume path: load a saved adapter into the shards)
    local = make_policy()
    perturb_lora(local.model, seed=5)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.publish(0)
    assert _max_diff(cluster.lora_state(), lora_state_dict(local.model)) == 0.0
    greedy_probe = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    before = cluster.generate([_prompt(local)], greedy_probe, version=0)[0][0]

    # rollout on 2 workers: chunks [11, 12] and [13], gathered in order, groups contiguous, version recorded
    seeds, g = [11, 12, 13], 2
    trajs, info = cluster.rollout(seeds, g, SAMPLING, version=0)
    assert [t.group for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert [t.episode.seed for t in trajs] == [11, 11, 12, 12, 13, 13]
    assert all(t.policy_version == 0 for t in trajs) and info["sync/version"] == 0.0
    engine = make_engine(local)
    ref = rollout(env, local, engine, [11, 12], g, SAMPLING, 0)
    ref += rollout(env, local, engine, [13], g, RayCluster.worker_sampling(SAMPLING, 1), 0)
    assert [t.input_ids for t in trajs] == [t.input_ids for t in ref]
    assert [t.sampling_logprobs for t in trajs] == [t.sampling_logprobs for t in ref]

    # 2 GRPO steps on the same fixed trajectories: 2 FSDP ranks vs grpo_update in this process
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, betas=tuple(OPTIM.adam_betas), weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for step in (1, 2):
        m_dist = cluster.update(trajs, adv, ALGO, 1.0, gen_dist, LR, version=step)
        m_local = grpo_update(local, opt, trajs, adv, ALGO, temperature=1.0, generator=gen_local)
        for key in ("policy/loss", "policy/pg_loss", "policy/kl", "policy/entropy", "policy/grad_norm",
                    "policy/approx_kl", "policy/clip_ratio", "policy/ratio_max"):
            assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (step, key, m_dist[key], m_local[key])
        assert m_dist["policy/optimizer_steps"] == m_local["policy/optimizer_steps"] == 2.0
        assert m_dist["sync/published_version"] == step
        # the published version holds exactly the weights this step produced
        published = load_file(str(version_dir(cluster.sync_root, step) / "adapter_model.safetensors"))
        assert _max_diff(published, lora_state_dict(local.model)) <= TOL, step
    assert m_local["policy/grad_norm"] > ALGO.max_grad_norm  # clipping was exercised
    assert gen_dist.get_state().equal(gen_local.get_state())  # the shuffle stream advanced identically
    assert _max_diff(cluster.lora_state(), lora_state_dict(local.model)) <= TOL
    # sharded AdamW state, gathered, equals the single-process optimizer's
    assert_optimizer_state_matches(cluster, opt, TOL)

    # the adapter reaches the engine: logprobs change after the sync and equal a fresh model's with v2
    after = cluster.generate([_prompt(local)], greedy_probe, version=2)[0][0]
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
    fresh = make_policy()
    load_adapter_inplace(fresh.model, version_dir(cluster.sync_root, 2))
    expect = make_engine(fresh).generate([_prompt(fresh)], greedy_probe)[0][0]
    assert after.token_ids == expect.token_ids
    assert max(abs(a - b) for a, b in zip(after.logprobs, expect.logprobs)) <= TOL
    # trajectories sampled now record the step whose update produced the weights
    trajs2, info2 = cluster.rollout([21, 22], 2, SAMPLING, version=2)
    assert all(t.policy_version == 2 for t in trajs2) and info2["sync/version"] == 2.0

    # a version older than the live one is refused; a version never published is refused after the wait
    with pytest.raises(SyncError, match="older than the live version"):
        cluster.rollout([21], 2, SAMPLING, version=1)
    with pytest.raises(SyncError, match="missing"):
        cluster.sync(3)


@pytest.mark.parametrize("reduction", ["seq_mean_token_mean", "seq_mean_token_sum"])
def test_sequence_reductions_and_epochs_match_single_process(cluster, make_policy, env_node, tmp_path, reduction):
    """Sequence-level reductions (weights by global sequence counts), 2 epochs, whole-batch
    mini-batches, micro-batches of 2, a zero-variance group filtered out."""
    from envs.visgym import VisGymMaze

    env = VisGymMaze(**{k: v for k, v in env_node.items() if k != "_target_"})
    algo = AlgorithmConfig(update_epochs=2, mini_batch_size=None, micro_batch_size=2, max_grad_norm=0.2,
                           loss_reduction=reduction, filter_zero_variance_groups=True, shared_prefix=False)
    local = make_policy()
    perturb_lora(local.model, seed=8)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.set_optimizer_state({})  # a fresh AdamW on every rank, as on this side
    trajs = rollout(env, local, make_engine(local), [31, 32, 33, 34], 2, SAMPLING, 0)
    adv = torch.tensor([0.7, -0.7, 0.0, 0.0, 1.0, -1.0, -0.3, 0.3])  # the second group carries no signal
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    m_dist = cluster.update(trajs, adv, algo, 1.0, gen_dist, LR, version=10)
    m_local = grpo_update(local, opt, trajs, adv, algo, temperature=1.0, generator=gen_local)
    for key in ("policy/loss", "policy/grad_norm", "policy/entropy", "policy/approx_kl"):
        assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (key, m_dist[key], m_local[key])
    assert m_dist["policy/optimizer_steps"] == 2.0
    assert _max_diff(cluster.lora_state(), lora_state_dict(local.model)) <= TOL


def test_demo_loss_on_two_ranks_matches_single_process(cluster, make_policy, env_node, tmp_path, monkeypatch):
    """aux_loss.demo_coef on native_ray: the rollout workers encode the demonstrations exactly as this
    process does, and the 2-rank update with them (3 demonstrations split 2/1, two optimizer steps, the
    term in the first) equals grpo_update's; with no group kept it steps on the demonstrations alone."""
    import rlkit.algorithms.nll
    from envs.visgym import VisGymMaze
    from rlkit.demonstrations import demonstration_trajectory

    # the single-process side runs the full-sequence forward too (the 2 ranks cannot share the prefix)
    monkeypatch.setattr(rlkit.algorithms.nll, "batch_shares_prefix", lambda policy: False)
    env = VisGymMaze(**{k: v for k, v in env_node.items() if k != "_target_"})
    local = make_policy()
    perturb_lora(local.model, seed=9)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.set_optimizer_state({})
    demos = cluster.demonstrations([41, 42, 43])
    ref = [demonstration_trajectory(env, local, s) for s in (41, 42, 43)]
    assert len(demos) == 3 and [d.input_ids for d in demos] == [d.input_ids for d in ref]
    assert [d.loss_mask for d in demos] == [d.loss_mask for d in ref]

    algo = AlgorithmConfig(mini_batch_size=2, micro_batch_size=1, max_grad_norm=0.5,
                           filter_zero_variance_groups=True, shared_prefix=False)
    trajs = rollout(env, local, make_engine(local), [44, 45], 2, SAMPLING, 0)
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
    for step, adv in ((1, torch.tensor([1.0, -1.0, 0.5, -0.5])), (2, torch.zeros(4))):
        m_dist = cluster.update(trajs, adv, algo, 1.0, gen_dist, LR, version=20 + step,
                                aux_terms=[AuxTerm("demo", 0.5, demos)])
        m_local = grpo_update(local, opt, trajs, adv, algo, temperature=1.0, generator=gen_local,
                              aux_terms=[AuxTerm("demo", 0.5, ref)])
        for key in ("demo/nll", "policy/grad_norm", "policy/optimizer_steps"):
            assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (step, key, m_dist[key], m_local[key])
        assert _max_diff(cluster.lora_state(), lora_state_dict(local.model)) <= TOL, step
    assert m_local["policy/optimizer_steps"] == 1.0 and "policy/pg_loss" not in m_local  # step 2: demonstrations alone
    assert m_dist["demo/nll"] > 0


@pytest.mark.parametrize("mode", ["plan", "interactive"])
def test_shared_prefix_update_on_two_ranks_matches_single_process(cluster, make_policy, tmp_path, mode):
    """algorithm.shared_prefix over 2 FSDP ranks: every micro-batch runs one prefix + one suffix forward
    on every rank (a pair, two rows of different groups, a row alone), or the full forward everywhere
    when the ranks' forwards would carry images differently (interactive: later-turn images in the
    suffix of a pair but not of a row alone); the update equals grpo_update's in one process."""
    from envs.visgym import VisGymMaze

    env = VisGymMaze(variant="easy", mode=mode, parser="plan" if mode == "plan" else "tuple",
                     max_turns=18 if mode == "plan" else 2)
    local = make_policy()
    perturb_lora(local.model, seed=12)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.set_optimizer_state({})
    trajs = rollout(env, local, make_engine(local), [51, 52, 53], 2, SAMPLING, 0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.8, -0.8])
    # ordered by group and split 3/3: rank 0 runs [51, 51] and [52], rank 1 [52, 53] and [53]
    algo = AlgorithmConfig(micro_batch_size=2, max_grad_norm=1e9, kl_coef=0.05, shared_prefix=True)
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, weight_decay=OPTIM.weight_decay)
    m_dist = cluster.update(trajs, adv, algo, 1.0, torch.Generator().manual_seed(1), LR, version=30)
    m_local = grpo_update(local, opt, trajs, adv, algo, temperature=1.0, generator=torch.Generator().manual_seed(1))
    for key in ("policy/loss", "policy/pg_loss", "policy/kl", "policy/grad_norm", "policy/entropy", "policy/approx_kl"):
        assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (key, m_dist[key], m_local[key])
    if mode == "plan":
        assert m_dist["policy/shared_prefix_fraction"] == 1.0
    else:
        assert all(len(t.image_inputs) == 2 for t in trajs)  # every episode ran both turns
        assert m_dist["policy/shared_prefix_fraction"] == 0.5  # the first micro-batches disagree, the second share
