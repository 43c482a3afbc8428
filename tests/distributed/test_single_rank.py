"""One trainer rank on its own bundle + one rollout worker on another (colocate=false, the layout of
backend.one_step_off_policy on this CPU): the rank keeps its policy unsharded (SingleRankRoot), and its
updates, published versions and optimizer state still equal a single-process run's; the rollout worker
samples while an update is in flight (start_update / finish_update)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlkit.config import AlgorithmConfig, OptimConfig
from rlkit.distributed.runtime import RaySettings
from rlkit.policy import SamplingParams
from rlkit.policy.lora import lora_state_dict, save_adapter
from rlkit.sync import version_dir
from rlkit.update import grpo_update
from tests.distributed.conftest import max_abs_diff as _max_diff
from tests.distributed.conftest import perturb_lora, start_cluster

OPTIM = OptimConfig()  # the trainer ranks' AdamW settings (TrainerSpec.optim's default)

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
# several optimizer steps a call, micro-batches of 2, clipping, the KL term and the entropy bonus active
ALGO = AlgorithmConfig(mini_batch_size=3, micro_batch_size=2, max_grad_norm=0.1, kl_coef=0.05, entropy_coef=0.01,
                       loss_reduction="token_mean")
LR = 2e-2
TOL = 1e-5


@pytest.fixture(scope="module")
def cluster(ray_local, policy_node, env_node, tmp_path_factory):
    settings = RaySettings(num_workers=1, num_rollout_workers=1, colocate=False, cpus_per_worker=1,
                           sync_timeout_s=30.0, keep_versions=2, startup_timeout_s=300, one_step_off_policy=True)
    c = start_cluster(settings, ALGO, LR, policy_node, env_node, tmp_path_factory.mktemp("shared") / "lora_sync" / "run",
                      sync_timeout_s=30.0, keep_versions=2)
    yield c
    c.shutdown()


def test_one_unsharded_rank_matches_single_process_while_the_rollout_worker_samples(cluster, make_policy, tmp_path):
    assert cluster.sharded is False  # fsdp.SingleRankRoot: no FSDP2 over one rank
    local = make_policy()
    perturb_lora(local.model, seed=7)
    save_adapter(local.model, tmp_path / "init", version=0)
    cluster.load_adapter(tmp_path / "init")
    cluster.publish(0)
    trajs, _ = cluster.rollout([31, 32], 3, SAMPLING, version=0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    opt = torch.optim.AdamW(local.trainable_parameters(), lr=LR, betas=tuple(OPTIM.adam_betas), weight_decay=OPTIM.weight_decay)
    gen_dist, gen_local = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for step in (1, 2):
        pending = cluster.start_update(trajs, adv, ALGO, 1.0, gen_dist, LR, version=step)
        # one step off policy: the next batch is sampled with the version before the one being made
        ahead, info = cluster.rollout([40 + step], 3, SAMPLING, version=step - 1)
        assert info["sync/version"] == step - 1 and all(t.policy_version == step - 1 for t in ahead)
        m_dist = cluster.finish_update(pending)
        m_local = grpo_update(local, opt, trajs, adv, ALGO, temperature=1.0, generator=gen_local)
        for key in ("policy/loss", "policy/kl", "policy/entropy", "policy/grad_norm", "policy/clip_ratio"):
            assert abs(m_dist[key] - m_local[key]) <= TOL * max(1.0, abs(m_local[key])), (step, key, m_dist[key], m_local[key])
        assert m_dist["policy/optimizer_steps"] == m_local["policy/optimizer_steps"] == 2.0
        published = load_file(str(version_dir(cluster.sync_root, step) / "adapter_model.safetensors"))
        assert _max_diff(published, lora_state_dict(local.model)) <= TOL, step
    assert m_local["policy/grad_norm"] > ALGO.max_grad_norm  # clipping was exercised
    full, local_state = cluster.optimizer_state(), opt.state_dict()["state"]
    assert sorted(full) == sorted(local_state)
    for i in local_state:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert float((full[i][k] - local_state[i][k]).abs().max()) <= TOL, (i, k)
    assert sorted(p.name for p in cluster.sync_root.iterdir() if p.name.startswith("v")) == ["v1", "v2"]
