"""Atomic checkpoints: latest always loads, corrupt ones are skipped, errors are clear."""

import errno
import json
import os

import pytest

from rlkit import checkpoint as ckpt


def _writer(payload: bytes):
    def write(d):
        (d / "adapter").mkdir()
        (d / "adapter" / "w.bin").write_bytes(payload)
        (d / "trainer_state.json").write_text(json.dumps({"payload": payload.decode()}))
    return write


def test_save_and_find_latest(tmp_path):
    ckpt.save(tmp_path, 1, _writer(b"one"))
    ckpt.save(tmp_path, 2, _writer(b"two"))
    latest = ckpt.find_latest(tmp_path)
    assert latest.name == "step_000002"
    assert (latest / "adapter" / "w.bin").read_bytes() == b"two"
    assert ckpt.verify(latest) is None
    assert (tmp_path / "latest").read_text().strip() == "step_000002"


def test_corrupt_latest_falls_back(tmp_path):
    ckpt.save(tmp_path, 1, _writer(b"one"))
    ckpt.save(tmp_path, 2, _writer(b"two"))
    (tmp_path / "step_000002" / "adapter" / "w.bin").write_bytes(b"tw0")  # same size, other bytes
    assert "checksum" in ckpt.verify(tmp_path / "step_000002")
    assert ckpt.find_latest(tmp_path).name == "step_000001"


def test_crash_between_every_file_write_keeps_latest_loadable(tmp_path, monkeypatch):
    ckpt.save(tmp_path, 1, _writer(b"one"))
    # Crash after the k-th file write of checkpoint 2, for every k.
    for k in range(1, 4):  # the writer below writes 3 files
        calls = {"n": 0}

        def crashing_write(d, k=k):
            def bump():
                calls["n"] += 1
                if calls["n"] >= k:
                    raise KeyboardInterrupt("simulated crash")
            (d / "adapter").mkdir(exist_ok=True)
            (d / "adapter" / "w.bin").write_bytes(b"two"); bump()
            (d / "trainer_state.json").write_text("{}"); bump()
            (d / "extra.json").write_text("{}"); bump()
        calls["n"] = 0
        with pytest.raises(KeyboardInterrupt):
            ckpt.save(tmp_path, 2, crashing_write)
        latest = ckpt.find_latest(tmp_path)
        assert latest.name == "step_000001"
        assert (latest / "adapter" / "w.bin").read_bytes() == b"one"


def test_crash_after_rename_before_pointer(tmp_path, monkeypatch):
    ckpt.save(tmp_path, 1, _writer(b"one"))
    monkeypatch.setattr(ckpt, "_point_latest", lambda root, name: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(tmp_path, 2, _writer(b"two"))
    monkeypatch.undo()
    # latest still names 1, which is complete; 2 is complete too and newer, but the pointer wins
    assert ckpt.find_latest(tmp_path).name == "step_000001"
    (tmp_path / "latest").unlink()
    assert ckpt.find_latest(tmp_path).name == "step_000002"


def test_pruning_keeps_newest(tmp_path):
    for s in range(1, 5):
        ckpt.save(tmp_path, s, _writer(str(s).encode()), max_to_keep=2)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_"))
    assert names == ["step_000003", "step_000004"]


def test_disk_full_is_clear_and_keeps_previous(tmp_path):
    ckpt.save(tmp_path, 1, _writer(b"one"))

    def full(d):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ckpt.CheckpointError, match=r"no space left on / .*The last complete checkpoint \(step_000001\) is intact"):
        ckpt.save(tmp_path, 2, full)
    assert ckpt.find_latest(tmp_path).name == "step_000001"
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())


def test_not_writable_is_clear(tmp_path):
    def denied(d):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(ckpt.CheckpointError, match="not writable"):
        ckpt.save(tmp_path, 1, denied)
    assert ckpt.find_latest(tmp_path) is None


def test_torch_writer_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """torch.save on a full disk raises a RuntimeError without errno ("unexpected pos ..."); with no free
    space left it is reported as a full disk, naming the file being written."""
    import shutil
    from collections import namedtuple

    ckpt.save(tmp_path, 1, _writer(b"one"))

    def writes_until_full(d):
        (d / "adapter").mkdir()
        (d / "adapter" / "w.bin").write_bytes(b"w")
        os.utime(d / "adapter" / "w.bin", (1, 1))  # written earlier (file times are coarse: ~4 ms)
        (d / "optimizer.pt").write_bytes(b"PK")  # torch's zip writer got this far, then:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 4096))
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint step 2 .*: no space left on .* while writing "
                                                   r"optimizer.pt\. The last complete checkpoint \(step_000001\)"):
        ckpt.save(tmp_path, 2, writes_until_full)
    assert ckpt.find_latest(tmp_path).name == "step_000001"
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="unexpected pos"):  # with free space it is not called a full disk
        ckpt.save(tmp_path, 2, writes_until_full)


def test_a_full_disk_elsewhere_in_the_run_names_the_file(tmp_path):
    from omegaconf import OmegaConf

    from rlkit.run import DiskFullError, _explain_disk_full
    from rlkit.run_folder import write_error

    err = _explain_disk_full(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl")))
    assert isinstance(err, DiskFullError)
    assert f"no space left on {tmp_path} while writing {tmp_path / 'metrics.jsonl'}" in str(err)
    write_error(tmp_path, err)
    assert "no space left on" in (tmp_path / "error.txt").read_text()
