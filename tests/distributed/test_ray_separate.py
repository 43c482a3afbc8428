"""colocate=false: 1 trainer rank and 1 rollout worker on bundles of their own (2 x 1 CPU)."""

from __future__ import annotations

import torch

from rlkit.config import AlgorithmConfig
from rlkit.distributed.cluster import RayCluster
from rlkit.distributed.runtime import RaySettings
from rlkit.distributed.workers import RolloutSpec, TrainerSpec
from rlkit.policy import SamplingParams


def test_separate_bundles_roll_out_train_and_sync(ray_local, policy_node, env_node, tmp_path):
    from ray.util import placement_group_table

    settings = RaySettings(num_workers=1, num_rollout_workers=1, colocate=False, cpus_per_worker=1, sync_timeout_s=5.0)
    assert settings.bundles() == [{"CPU": 1.0}, {"CPU": 1.0}] and settings.actor_resources()["num_cpus"] == 1.0
    common = dict(policy=policy_node, base_path=None, sync_root=str(tmp_path / "sync"), threads=1, device_type="cpu")
    algo = AlgorithmConfig(micro_batch_size=2)
    cluster = RayCluster(settings, TrainerSpec(algorithm=algo, lr=1e-2, keep_versions=2, mixed_precision=False,
                                               dist_timeout_s=120, **common),
                         RolloutSpec(env=env_node, sync_timeout_s=5.0, **common))
    cluster.start()
    try:
        table = placement_group_table(cluster.pg)
        assert len(table["bundles"]) == 2 and table["state"] == "CREATED"
        cluster.publish(0)
        trajs, info = cluster.rollout([41, 42], 2, SamplingParams(max_new_tokens=8, seed=1), version=0)
        assert len(trajs) == 4 and info["sync/version"] == 0.0
        m = cluster.update(trajs, torch.tensor([1.0, -1.0, 1.0, -1.0]), algo, 1.0, torch.Generator(), 1e-2, version=1)
        assert m["sync/published_version"] == 1.0 and m["policy/optimizer_steps"] == 1.0
        assert [r["version"] for r in cluster.sync(1)] == [1]
    finally:
        cluster.shutdown()
