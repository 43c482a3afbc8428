"""rlkit.sync: atomic versioned publish, exact-version load, refusal of torn / stale / missing versions."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest
import torch

from rlkit.policy.lora import lora_state_dict
from rlkit.sync import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MANIFEST,
    AdapterSubscriber,
    SyncError,
    list_versions,
    prune_versions,
    publish_adapter,
    remove_versions_after,
    run_key_for,
    sync_root,
    verify_version,
    version_dir,
)
from tests.distributed.conftest import perturb_lora


def _adapter_config(policy) -> dict:
    cfg = policy.model.peft_config["default"]
    return cfg.to_dict()


def _publish(policy, root, version, keep=5):
    return publish_adapter(root, version, lora_state_dict(policy.model), _adapter_config(policy),
                           base_model=policy.checkpoint, keep_versions=keep)


def test_publish_layout_and_exact_load(make_policy, tiny_ckpt, tmp_path):
    trainer, engine_side = make_policy(), make_policy()
    perturb_lora(trainer.model, seed=1)
    root = sync_root(tmp_path / "shared", run_key_for(tmp_path / "job"))
    assert root == tmp_path / "shared" / "lora_sync" / run_key_for(tmp_path / "job")
    pub = _publish(trainer, root, 1)
    d = version_dir(root, 1)
    assert pub.path == str(d) and list_versions(root) == [1]
    assert sorted(p.name for p in d.iterdir()) == sorted([ADAPTER_CONFIG, ADAPTER_WEIGHTS, MANIFEST, "rlkit_adapter.json"])
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    manifest = verify_version(root, 1)
    assert manifest["version"] == 1 and manifest["weights_sha256"] == pub.weights_sha256
    assert pub.num_params == sum(v.numel() for v in lora_state_dict(trainer.model).values())
    # the version is a plain PEFT adapter: PeftModel.from_pretrained reads it
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(str(tiny_ckpt))
    peft_loaded = PeftModel.from_pretrained(base, str(d))
    ref = lora_state_dict(trainer.model)
    assert all(torch.equal(ref[k], v) for k, v in lora_state_dict(peft_loaded).items())

    sub = AdapterSubscriber(root, timeout_s=1.0)
    loaded = sub.load(engine_side.model, 1)
    assert loaded.version == 1 and not loaded.skipped and loaded.weights_sha256 == pub.weights_sha256
    got = lora_state_dict(engine_side.model)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert sub.load(engine_side.model, 1).skipped  # already live: nothing read
    # newer versions load; going back is refused
    perturb_lora(trainer.model, seed=2)
    _publish(trainer, root, 2)
    assert sub.load(engine_side.model, 2).version == 2
    with pytest.raises(SyncError, match="older than the live version 2"):
        sub.load(engine_side.model, 1)


def test_torn_versions_are_refused(make_policy, tmp_path):
    policy = make_policy()
    root = tmp_path / "sync"
    for v in (1, 2, 3, 4):
        _publish(policy, root, v)
    # same size, different bytes: checksum mismatch
    w = version_dir(root, 1) / ADAPTER_WEIGHTS
    blob = bytearray(w.read_bytes())
    blob[-1] ^= 0xFF
    w.write_bytes(bytes(blob))
    # a missing file, a missing manifest, a manifest naming another version (a copied / stale dir)
    (version_dir(root, 2) / ADAPTER_CONFIG).unlink()
    (version_dir(root, 3) / MANIFEST).unlink()
    shutil.copytree(version_dir(root, 4), version_dir(root, 5))
    cases = {1: "checksum mismatch", 2: f"file {ADAPTER_CONFIG} is missing", 3: "no manifest.json",
             5: "manifest says version 4"}
    for version, why in cases.items():
        sub = AdapterSubscriber(root, timeout_s=0.5)
        with pytest.raises(SyncError, match=why):
            sub.load(policy.model, version)
        assert sub.version is None  # nothing became live


def test_missing_version_waits_then_refuses_and_late_publish_is_picked_up(make_policy, tmp_path):
    policy = make_policy()
    root = tmp_path / "sync"
    _publish(policy, root, 0)
    sub = AdapterSubscriber(root, timeout_s=0.3, poll_s=0.02)
    t0 = time.monotonic()
    with pytest.raises(SyncError, match=r"version 1 is missing .* newest version there is v0, older than expected"):
        sub.load(policy.model, 1)
    assert time.monotonic() - t0 >= 0.3
    # a version published while the engine waits is loaded as soon as it is complete
    trainer = make_policy()
    perturb_lora(trainer.model, seed=3)
    timer = threading.Timer(0.3, lambda: _publish(trainer, root, 1))
    timer.start()
    sub = AdapterSubscriber(root, timeout_s=10.0, poll_s=0.02)
    loaded = sub.load(policy.model, 1)
    timer.join()
    assert loaded.version == 1 and loaded.wait_s >= 0.2


def test_prune_and_republish(make_policy, tmp_path):
    policy = make_policy()
    root = tmp_path / "sync"
    for v in range(5):
        _publish(policy, root, v, keep=2)
    assert list_versions(root) == [3, 4]
    (root / ".tmp-v9-1-deadbeef").mkdir()  # a crashed publisher's leftover (another pid)
    assert prune_versions(root, 1) == [3] and not (root / ".tmp-v9-1-deadbeef").exists()
    # a resumed run removes versions of the abandoned future and re-publishes over an existing one
    _publish(policy, root, 7, keep=5)
    assert remove_versions_after(root, 4) == [7] and list_versions(root) == [4]
    perturb_lora(policy.model, seed=4)
    pub = _publish(policy, root, 4, keep=5)
    assert json.loads((version_dir(root, 4) / MANIFEST).read_text())["weights_sha256"] == pub.weights_sha256
    with pytest.raises(ValueError, match="keep_versions"):
        _publish(policy, root, 8, keep=0)
