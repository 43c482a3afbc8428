"""rollout.history_images reaches rlkit.rollout.rollout from every native executor: the local executor's rollouts
and evaluations, and the Ray rollout workers' (plain classes, driven here without Ray); SkyRL refuses it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import rlkit.evaluation
import rlkit.recipes.local
import rlkit.rollout
from rlkit.distributed.workers import RolloutSpec, RolloutWorker
from rlkit.recipes.executor import ExecutorContext
from rlkit.recipes.local import LocalExecutor


class _Recorder:
    def __init__(self):
        self.windows = []

    def __call__(self, env_spec, policy, engine, seeds, group_size, sampling, policy_version, history_images=None):
        self.windows.append(history_images)
        return []


def test_local_executor_passes_the_window_to_rollouts_and_evaluations(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(rlkit.recipes.local, "rollout", rec)
    monkeypatch.setattr(rlkit.evaluation, "rollout", rec)
    ex = LocalExecutor()
    ex.ctx = SimpleNamespace(env_spec=None, history_images=2)
    ex.policy = None  # ctx has no rollout_engine: rlkit's engine
    ex.rollout(1, [5], None, 2)
    ex.evaluate([5], None, 0)
    assert rec.windows == [2, 2]
    assert "history_images" in ExecutorContext.__dataclass_fields__


def test_ray_rollout_worker_passes_the_window(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(rlkit.rollout, "rollout", rec)
    monkeypatch.setattr(rlkit.evaluation, "rollout", rec)
    w = object.__new__(RolloutWorker)  # no policy load: only the call path is under test
    w.spec = RolloutSpec(env={}, policy={}, base_path=None, sync_root="", sync_timeout_s=1.0, threads=1,
                         device_type="cpu", history_images=3)
    w.env_spec = w.policy = w.engine = None
    w.subscriber = SimpleNamespace(version=0)
    w.sync = lambda version: {}
    w.rollout([5], 2, None, 0)
    w.evaluate([5], None, 0)
    assert rec.windows == [3, 3]


def test_skyrl_refuses_the_window():
    from omegaconf import OmegaConf

    from rlkit.backends.skyrl.backend import SkyRLBackend
    from rlkit.errors import ConfigError

    job = SimpleNamespace(config={"trainer": {"logger": "console", "ckpt_path": "/nonexistent", "resume_mode": "latest"}})
    cfg = OmegaConf.create({"rollout": {"history_images": 1}, "trainer": {"overwrite": False}})
    with pytest.raises(ConfigError, match="rollout.history_images=1"):
        SkyRLBackend._preflight(None, job, cfg)
