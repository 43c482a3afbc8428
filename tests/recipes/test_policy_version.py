"""policy_version has one meaning in every executor: the adapter version (updates applied) that sampled."""

from types import SimpleNamespace

from rlkit.engines import LiveEngine
from rlkit.recipes import local
from rlkit.recipes.local import LocalExecutor
from rlkit.recipes.ray import RayExecutor


def test_local_and_ray_executors_record_the_same_version(monkeypatch):
    seen = {}
    monkeypatch.setattr(local, "rollout", lambda *a, policy_version, **k: seen.setdefault("native", policy_version) and [])
    ex = LocalExecutor()
    ex.ctx, ex.policy, ex.engine = SimpleNamespace(env_spec=None), None, LiveEngine(None)
    ex.rollout(3, [5], None, 2)

    ray = RayExecutor.__new__(RayExecutor)
    ray._sample_version = None
    ray.cluster = SimpleNamespace(rollout=lambda seeds, g, sampling, version: (seen.setdefault("native_ray", version), {}))
    ray.rollout(3, [5], None, 2)
    assert seen == {"native": 2, "native_ray": 2}  # step 3 samples with the adapter after 2 updates
    # sampling ahead of an update in flight (backend.one_step_off_policy): the version the recipe names
    got = []
    ray.cluster = SimpleNamespace(rollout=lambda seeds, g, sampling, version: (got.append(version), {}))
    with ray.sample_with(1):
        ray.rollout(3, [5], None, 2)
    ray.rollout(4, [5], None, 2)  # and back to step - 1 after it
    assert got == [1, 3]
