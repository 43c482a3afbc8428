"""backend.strategy=ddp: 2 replicated trainer ranks (gloo) as Ray actors on CPU, against a single-process run.

Each rank holds the whole policy, runs only its own share of the batch (the shared-prefix forward with
its root prefix, identical samples once) and the ranks sum their gradients in one all-reduce before the
optimizer step (rlkit.distributed.fsdp.ReplicatedRoot). One cluster for the module: trainer rank r on
bundle r, one rollout worker beside rank 0 (colocate=true, half a CPU each).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlkit.algorithms.nll import AuxTerm
from rlkit.config import AlgorithmConfig, OptimConfig
from rlkit.distributed.runtime import RaySettings
from rlkit.policy import SamplingParams, make_engine
from rlkit.policy.lora import lora_state_dict, save_adapter
from rlkit.rollout import rollout
from rlkit.sync import version_dir
from rlkit.update import grpo_update
from tests.distributed.conftest import max_abs_diff as _max_diff
from tests.distributed.conftest import assert_optimizer_state_matches, perturb_lora, start_cluster

OPTIM = OptimConfig()  # the trainer ranks' AdamW settings (TrainerSpec.optim's default)

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
LR = 2e-2
TOL = 1e-5
KEYS = ("policy/loss", "policy/pg_loss", "policy/kl", "policy/entropy", "policy/grad_norm", "policy/approx_kl",
        "policy/clip_ratio", "policy/ratio_max", "policy/distinct_fraction")


@pytest.fixture(scope="module")
def cluster(ray_local, policy_node, env_node, tmp_path_factory):
    settings = RaySettings(num_workers=2, num_rollout_workers=1, colocate=True, cpus_per_worker=1, strategy="ddp",
                           sync_timeout_s=3.0, keep_versions=3, startup_timeout_s=300)
    c = start_cluster(settings, AlgorithmConfig(), LR, policy_node, env_node,
                      tmp_path_factory.mktemp("shared") / "lora_sync" / "run", sync_timeout_s=3.0, keep_versions=3)
    yield c
    c.shutdown()


def _replica_states(cluster) -> list[dict[str, torch.Tensor]]:
    """Every rank's own LoRA tensors (no gather: each replica read where it lives)."""
    import ray

    def own(worker):
        return {n: p.detach().clone() for n, p in worker.policy.model.named_parameters() if p.requires_grad}

    return ray.get([t.__ray_call__.remote(own) for t in cluster.trainers])


def _start(cluster, make_policy, tmp_path, seed: int):
    local = make_policy()
    perturb_lora(local.model, seed=seed)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.set_optimizer_state({})  # a fresh AdamW on every rank, as on this side
    return local


def _assert_close(m_dist: dict, m_local: dict, keys, step) -> None:
    for key in keys:
        assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (step, key, m_dist[key], m_local[key])


def test_two_replicated_ranks_match_single_process(cluster, make_policy, env_node, tmp_path):
    """Two GRPO calls of two optimizer steps each (mini-batches of 4 distinct samples split 2/2, micro-batches
    of 2 sharing their group's prompt, a duplicated sample merged), clipping, KL and entropy on: the loss,
    diagnostics, published adapter and AdamW state equal grpo_update's, and the replicas stay bitwise equal."""
    from envs.visgym import VisGymMaze

    assert cluster.strategy == "ddp" and cluster.sharded is False
    env = VisGymMaze(**{k: v for k, v in env_node.items() if k != "_target_"})
    local = _start(cluster, make_policy, tmp_path, seed=5)
    trajs = rollout(env, local, make_engine(local), [11, 12, 13, 14], 2, SAMPLING, 0)
    trajs[1] = trajs[0]  # two identical samples of group 0: run once with count 2 on both sides
    adv = torch.tensor([0.8, 0.8, 1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    algo = AlgorithmConfig(mini_batch_size=4, micro_batch_size=2, max_grad_norm=0.1, kl_coef=0.05, entropy_coef=0.01,
                           loss_reduction="token_mean", shared_prefix=True)
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, betas=tuple(OPTIM.adam_betas), weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for step in (1, 2):
        m_dist = cluster.update(trajs, adv, algo, 1.0, gen_dist, LR, version=step)
        m_local = grpo_update(local, opt, trajs, adv, algo, temperature=1.0, generator=gen_local)
        _assert_close(m_dist, m_local, KEYS, step)
        assert m_dist["policy/optimizer_steps"] == m_local["policy/optimizer_steps"] == 2.0
        published = load_file(str(version_dir(cluster.sync_root, step) / "adapter_model.safetensors"))
        assert _max_diff(published, lora_state_dict(local.model)) <= TOL, step
        first, second = _replica_states(cluster)
        assert _max_diff(first, second) == 0.0, step  # the same summed gradients, the same optimizer step
    assert m_local["policy/grad_norm"] > algo.max_grad_norm  # clipping was exercised
    assert m_local["policy/distinct_fraction"] < 1.0  # the duplicate was merged
    assert m_dist["policy/shared_prefix_fraction"] == 1.0
    assert_optimizer_state_matches(cluster, opt, TOL)


def test_a_rank_with_an_empty_share_and_demonstrations(cluster, make_policy, env_node, tmp_path):
    """Mini-batches of one sequence leave rank 1 without a sample in every optimizer step (it runs a
    zero-weight filler and contributes zero gradients), and the demo term's 3 demonstrations are
    split 2/1 across the ranks: the update still equals grpo_update's, through 4 optimizer steps."""
    from envs.visgym import VisGymMaze
    from rlkit.demonstrations import demonstration_trajectory

    env = VisGymMaze(**{k: v for k, v in env_node.items() if k != "_target_"})
    local = _start(cluster, make_policy, tmp_path, seed=9)
    demos = cluster.demonstrations([41, 42, 43])
    ref = [demonstration_trajectory(env, local, s) for s in (41, 42, 43)]
    trajs = rollout(env, local, make_engine(local), [44, 45], 2, SAMPLING, 0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    algo = AlgorithmConfig(mini_batch_size=1, micro_batch_size=1, max_grad_norm=0.5, shared_prefix=True)
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
    m_dist = cluster.update(trajs, adv, algo, 1.0, gen_dist, LR, version=20, aux_terms=[AuxTerm("demo", 0.5, demos)])
    m_local = grpo_update(local, opt, trajs, adv, algo, temperature=1.0, generator=gen_local,
                          aux_terms=[AuxTerm("demo", 0.5, ref)])
    _assert_close(m_dist, m_local, ("policy/loss", "policy/grad_norm", "policy/entropy", "demo/nll"), 20)
    assert m_dist["policy/optimizer_steps"] == m_local["policy/optimizer_steps"] == 4.0
    assert _max_diff(cluster.lora_state(), lora_state_dict(local.model)) <= TOL
    first, second = _replica_states(cluster)
    assert _max_diff(first, second) == 0.0
