"""policy_version has one meaning in every backend: the adapter version (updates applied) that sampled."""

from types import SimpleNamespace

from rlkit.backends import native
from rlkit.backends.native import NativeRun


def test_native_and_native_ray_record_the_same_version(monkeypatch):
    seen = {}
    monkeypatch.setattr(native, "rollout", lambda *a, policy_version, **k: seen.setdefault("native", policy_version) and [])
    stub = SimpleNamespace(env_spec=None, policy=None, engine=None, cfg=SimpleNamespace(group_size=2))
    NativeRun._rollout(stub, 3, [5], None)

    from rlkit.backends.ray_native import RayNativeRun

    cluster = SimpleNamespace(rollout=lambda seeds, g, sampling, version: (seen.setdefault("native_ray", version), {}))
    RayNativeRun._rollout(SimpleNamespace(cluster=cluster, cfg=SimpleNamespace(group_size=2), _sample_version=None), 3, [5], None)
    assert seen == {"native": 2, "native_ray": 2}  # step 3 samples with the adapter after 2 updates
