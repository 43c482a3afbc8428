"""Issue 74 on a real (private, 2-CPU) Ray instance with 1 trainer rank + 1 rollout worker (colocated):

- eval.pass_k reaches the rollout workers: RayCluster.evaluate reports eval/pass@k, equal to rlkit.evaluation's
  in this process on the same adapter version and sampling (worker 0 keeps the sampling seed).
- RayCluster.dead_workers: [] at once while every worker answers; the killed one by name after a worker is killed.
"""

from __future__ import annotations

import time

import pytest

from rlkit.config import AlgorithmConfig
from rlkit.distributed.runtime import RaySettings
from rlkit.evaluation import evaluate
from rlkit.plugins import instantiate_plugin
from rlkit.policy import SamplingParams, make_engine
from rlkit.policy.lora import load_adapter_inplace
from rlkit.sync import version_dir
from tests.distributed.conftest import start_cluster

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10, seed=5)
PASS_K = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
SEEDS = [3, 8, 13]


@pytest.fixture(scope="module")
def cluster(ray_local, policy_node, env_node, tmp_path_factory):
    settings = RaySettings(num_workers=1, num_rollout_workers=1, colocate=True, cpus_per_worker=1,
                           sync_timeout_s=30.0, startup_timeout_s=300)
    root = tmp_path_factory.mktemp("shared") / "lora_sync" / "run"
    c = start_cluster(settings, AlgorithmConfig(), 1e-2, policy_node, env_node, root, sync_timeout_s=30.0,
                      keep_versions=2)
    c.publish(0)
    yield c
    c.shutdown()


def test_pass_k_is_evaluated_on_the_rollout_workers_as_in_this_process(cluster, make_policy, env_node):
    from omegaconf import OmegaConf

    metrics, per_task, _ = cluster.evaluate(SEEDS, GREEDY, version=0, pass_k=3, pass_k_sampling=PASS_K)
    assert metrics["eval/num_tasks"] == 3.0 and "eval/pass@3" in metrics
    policy = make_policy()
    load_adapter_inplace(policy.model, version_dir(cluster.sync_root, 0))
    env_spec = instantiate_plugin(OmegaConf.create(env_node), "env")
    local, local_tasks, _ = evaluate(env_spec, policy, make_engine(policy), SEEDS, GREEDY, policy_version=0,
                                     pass_k=3, pass_k_sampling=PASS_K)
    assert metrics["eval/pass@3"] == local["eval/pass@3"]
    assert [t["actions"] for t in per_task] == [t["actions"] for t in local_tasks]


def test_dead_workers_names_the_killed_worker_and_no_live_one(cluster, ray_local):
    t0 = time.monotonic()
    assert cluster.dead_workers(30.0) == []
    assert time.monotonic() - t0 < 10.0  # every worker answered its ping: no need to wait the whole 30 s
    ray_local.kill(cluster.rollouts[0])
    assert cluster.dead_workers(30.0) == ["rollout worker 0"]
