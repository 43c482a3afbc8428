"""Fixtures for the distributed tests: a tiny Qwen3-VL checkpoint, a 2-CPU local Ray instance.

Ray: RAY_AUTH_MODE is set explicitly (Ray 2.60 turns on token auth otherwise) and RAY_ADDRESS /
RAY_API_SERVER_ADDRESS are removed, so ``ray.init(address="local")`` starts a private instance and
never joins someone else's cluster; it is shut down when the session's tests are done.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import TINY_TEST_SIZES as SIZES  # noqa: E402,F401
from tests.conftest import TEST_DTYPE

LORA = {"rank": 4, "alpha": 8}
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture(scope="session")
def policy_node(tiny_ckpt):
    """A conf/policy node (plain dict) for the tiny checkpoint, as the backend hands it to workers."""
    return {"_target_": "rlkit.policy.load_policy", "name": "dist_test", "path": str(tiny_ckpt), "device": "cpu",
            "dtype": TEST_DTYPE, "lora": dict(LORA)}


@pytest.fixture(scope="session")
def env_node():
    return {"_target_": "envs.visgym.VisGymMaze", "variant": "easy", "mode": "plan", "parser": "plan", "max_turns": 18}


@pytest.fixture
def make_policy(tiny_ckpt):
    from rlkit.policy import load_policy

    def _make():
        return load_policy(name="dist_test", path=str(tiny_ckpt), device="cpu", dtype=TEST_DTYPE, lora=dict(LORA))

    return _make


def ray_env_clean() -> dict[str, str | None]:
    """Set RAY_ENV, drop RAY_ADDRESS / RAY_API_SERVER_ADDRESS; return the previous values."""
    keys = list(RAY_ENV) + ["RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"]
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update(RAY_ENV)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    return before


def ray_env_restore(before: dict[str, str | None]) -> None:
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def ray_local():
    """A private local Ray instance with 2 logical CPUs (one per bundle); shut down after the module."""
    import ray

    before = ray_env_clean()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    ray_env_restore(before)


def perturb_lora(model, seed: int, scale: float = 0.3) -> None:
    """Random values in every LoRA tensor (a trained-looking adapter: B != 0, so A gets gradients)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


@pytest.fixture
def compose_config():
    """Hydra's compose of conf/train.yaml with overrides (tests/backends' helper)."""
    from tests.backends.conftest import compose_cfg

    return compose_cfg


def start_cluster(settings, algorithm, lr: float, policy_node, env_node, root, sync_timeout_s: float,
                  keep_versions: int):
    """A started RayCluster of the test policy and env on CPU (float32 trainer, 1 thread an actor), its
    adapter versions under ``root`` (also set as ``cluster.sync_root`` for the tests)."""
    from rlkit.distributed.cluster import RayCluster
    from rlkit.distributed.workers import RolloutSpec, TrainerSpec

    common = dict(policy=policy_node, base_path=None, sync_root=str(root), threads=1, device_type="cpu")
    cluster = RayCluster(settings, TrainerSpec(algorithm=algorithm, lr=lr, keep_versions=keep_versions,
                                               mixed_precision=False, dist_timeout_s=120,
                                               strategy=settings.strategy, **common),
                         RolloutSpec(env=env_node, sync_timeout_s=sync_timeout_s, **common))
    cluster.start()
    cluster.sync_root = root
    return cluster


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two {name: tensor} dicts with the same keys."""
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_optimizer_state_matches(cluster, optimizer, tol: float) -> None:
    """The ranks' AdamW state, gathered full, equals a single-process ``optimizer``'s within ``tol``."""
    full = cluster.optimizer_state()
    local_state = optimizer.state_dict()["state"]
    assert sorted(full) == sorted(local_state)
    for i in local_state:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert float((full[i][k] - local_state[i][k]).abs().max()) <= tol, (i, k)
