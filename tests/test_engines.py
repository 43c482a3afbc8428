"""rlkit.engines: rollout.engine decided once; both engines answer the same members, and the adapter versions vLLM
samples are published and loaded by VersionedEngine alone (here against the stand-in for vLLM's API,
tests/policy/fake_vllm; vLLM itself: tests/vllm/test_vllm_rollout.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlkit.distributed.reaper import pid_alive
from rlkit.engines import LiveEngine, VersionedEngine, open_engine
from rlkit.policy import TransformersEngine
from rlkit.policy.vllm_engine import VLLM_PYTHON_ENV
from rlkit.sync import list_versions, sync_root

FAKE = Path(__file__).resolve().parent / "policy" / "fake_vllm"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """vLLM's interpreter is a wrapper that runs rlkit's vLLM worker against the stand-in; the calls file it fills."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={FAKE} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(wrapper))
    monkeypatch.setenv("FAKE_VLLM_CALLS", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_VLLM_SCRIPT", json.dumps({"pads": 1, "completions": [[[5], "length", None]]}))
    return tmp_path / "calls.jsonl"


def test_rlkits_engine_samples_the_live_weights_so_versions_are_no_ops(policy, plan_env, tmp_path):
    root = sync_root(tmp_path, "run")
    handle = open_engine("rlkit", policy, plan_env, reuse_kv=True, threads=1, sync_root=root, say=pytest.fail)
    assert isinstance(handle, LiveEngine) and isinstance(handle.engine, TransformersEngine) and handle.engine.reuse_kv
    handle.wait_ready()
    assert handle.publish(3) == handle.load_version(3) == handle.metrics() == {}
    handle.close()
    assert not root.exists()  # nothing published: the engine holds the policy itself


def test_an_unknown_engine_is_refused_naming_the_choices(policy, plan_env):
    with pytest.raises(ValueError, match=r"rollout.engine='sglang' is none of \['rlkit', 'vllm'\]"):
        open_engine("sglang", policy, plan_env, reuse_kv=True, threads=1)


def test_vllms_versions_are_published_resumed_and_loaded_once_each(policy, plan_env, tmp_path, fake_vllm):
    root = sync_root(tmp_path, "run")
    said: list[str] = []
    handle = open_engine("vllm", policy, plan_env, reuse_kv=False, threads=1, sync_root=root,
                         log_path=tmp_path / "vllm_engine.log", say=said.append)
    assert isinstance(handle, VersionedEngine)
    try:
        assert "vLLM starting in process" in said[0] and str(root) in said[0]
        for v in (4, 5, 7):  # an abandoned run's versions
            handle.publish(v)
        assert list_versions(root) == [5, 7]  # keep_versions=2
        assert set(handle.publish(5)) == {"timing/publish"}  # a run resumed at step 5: v7 is the abandoned run's
        assert list_versions(root) == [5]
        first = handle.load_version(5)
        assert first["sync/version"] == 5.0 and first["timing/load"] > 0 and "vLLM ready after" in said[1]
        assert handle.load_version(5)["timing/load"] == 0.0  # live already: not loaded again
        assert set(handle.metrics()) == {"timing/engine_startup"}  # once, with the next rollout
        assert handle.metrics() == {}
        handle.publish(6)
        handle.load_version(6)
    finally:
        handle.close()
    calls = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    assert [(c["op"], c.get("id")) for c in calls if c["op"] != "init"] == [("add_lora", 1), ("add_lora", 2),
                                                                          ("remove_lora", 1)]
    assert not pid_alive(handle.engine.pid)


def test_vllm_without_a_sync_folder_uses_a_temporary_one_removed_at_close(policy, plan_env, fake_vllm):
    handle = open_engine("vllm", policy, plan_env, reuse_kv=True, threads=1)
    root = handle.sync_root
    handle.publish(0)
    assert list_versions(root) == [0]
    handle.close()
    assert not root.exists()
