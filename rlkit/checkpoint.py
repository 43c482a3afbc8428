"""Atomic checkpoints with a verified ``latest`` pointer.

Layout under ``<output_dir>/checkpoints/``::

    step_000010/            a complete checkpoint (visible only once complete)
        adapter/            the LoRA adapter in plain PEFT format (adapter_config.json +
                            adapter_model.safetensors), or model.safetensors for full weights
        optimizer.pt        optimizer + LR scheduler state (torch.save, loaded with weights_only=True)
        rng.safetensors     torch CPU RNG state
        trainer_state.json  step, task sampler position, python/numpy RNG states, logger run id
        config.yaml         the resolved config the run used
        manifest.json       sha256 + size of every file above (written last inside the temp dir)
    latest                  text file naming the newest complete checkpoint (moved atomically)

Write protocol: everything goes to ``.tmp-step_000010-<pid>/``, every file is fsynced, the manifest
is written and fsynced, the directory is renamed to ``step_000010`` and the parent fsynced, then
``latest`` is replaced through a temp file + ``os.replace``. A crash at any point leaves either the
previous checkpoint as ``latest`` or the new one complete. ``find_latest`` verifies the manifest
(existence, size, sha256) and falls back to the newest complete checkpoint with a warning.
Follows the temp-file + fsync + rename recipe of POSIX atomic replacement (rename(2)).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LATEST = "latest"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the path and the fix."""


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes a rename inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Hash every file under ``directory`` (recursively) into manifest.json; fsync all of it."""
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            _fsync_file(p)
            files[str(p.relative_to(directory))] = {"sha256": _sha256(p), "size": p.stat().st_size}
    manifest = {"files": files, **(extra or {})}
    mpath = directory / MANIFEST
    mpath.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    _fsync_file(mpath)
    for sub in {p.parent for p in directory.rglob("*")} | {directory}:
        fsync_path(sub)
    return manifest


def verify(directory: Path) -> str | None:
    """Check a checkpoint directory against its manifest. Returns None if complete, else why not."""
    mpath = directory / MANIFEST
    if not mpath.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, OSError) as e:
        return f"unreadable manifest.json ({e})"
    for rel, meta in manifest.get("files", {}).items():
        p = directory / rel
        if not p.is_file():
            return f"missing file {rel}"
        if p.stat().st_size != meta["size"]:
            return f"{rel} has {p.stat().st_size} bytes, manifest says {meta['size']}"
        if _sha256(p) != meta["sha256"]:
            return f"{rel} checksum mismatch"
    return None


def save(root: Path, step: int, write_contents: Callable[[Path], None], max_to_keep: int = 0) -> Path:
    """Write checkpoint ``step`` atomically under ``root`` and point ``latest`` at it.

    Args:
        root: the checkpoints folder (created if needed).
        step: the number of completed training steps this checkpoint holds.
        write_contents: writes every file of the checkpoint into the directory it is given.
        max_to_keep: keep at most this many complete checkpoints (0 = all); older ones are removed
            only after the new one is complete and ``latest`` points at it.

    Returns: the final checkpoint directory.

    Raises:
        CheckpointError: the disk is full ("no space left on <mount> while writing <file>") or the
            folder is not writable; the previous checkpoint and ``latest`` are left untouched and
            the temp directory is removed. Other errors of ``write_contents`` propagate unchanged.
    """
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write_contents(tmp)
        write_manifest(tmp, {"step": step})
        if final.exists():  # a stale copy of the same step (e.g. a resumed run re-saving): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(root)
        _point_latest(root, final.name)
    except Exception as e:
        # torch.save reports a full disk as a RuntimeError without errno ("unexpected pos ..."), so a
        # failed write with (almost) no free space left counts as a full disk too; measured before
        # the partial checkpoint is removed
        full = no_space(e, root)
        what = _newest_file(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if not (full or isinstance(e, OSError)):
            raise
        latest = find_latest(root)
        kept = f"The last complete checkpoint ({latest.name}) is intact" if latest else "No earlier checkpoint exists"
        if full:
            reason = f"no space left on {_mount_point(root)} while writing {what or 'its files'}"
        else:
            why = {errno.EACCES: "the folder is not writable", errno.EROFS: "the filesystem is read-only"}
            reason = f"{why.get(e.errno, str(e))} (writing {what or 'its files'})"
        raise CheckpointError(
            f"could not write checkpoint step {step} under {root}: {reason}. {kept}; free space (or lower "
            f"trainer.max_ckpts_to_keep) or point paths at a writable folder, and resume with "
            f"trainer.resume_mode=latest."
        ) from e
    if max_to_keep > 0:
        prune(root, max_to_keep)
    return final


#: A failed write with less free space than this (bytes) on its filesystem counts as a full disk.
LOW_SPACE_BYTES = 1 << 20


def no_space(err: BaseException, path: Path) -> bool:
    """True when ``err`` (or an exception it was raised from) is ENOSPC / EDQUOT, or when the
    filesystem of ``path`` has less than LOW_SPACE_BYTES available (torch's writer drops the errno)."""
    e: BaseException | None = err
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(path).free < LOW_SPACE_BYTES
    except OSError:
        return False


def _newest_file(folder: Path) -> str | None:
    """The most recently written file under ``folder`` (relative), i.e. the one a write failed on."""
    try:
        files = [p for p in folder.rglob("*") if p.is_file()]
        return max(files, key=lambda p: p.stat().st_mtime_ns).relative_to(folder).as_posix() if files else None
    except OSError:
        return None


def _mount_point(path: Path) -> str:
    p = Path(path).resolve()
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)


def _point_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.tmp-{os.getpid()}"
    tmp.write_text(name + "\n")
    _fsync_file(tmp)
    os.replace(tmp, root / LATEST)
    fsync_path(root)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete (manifest-verified) checkpoints under ``root``, oldest first; warns on broken ones."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)):
        problem = verify(d)
        if problem is None:
            out.append(d)
        else:
            log.warning("skipping incomplete or corrupt checkpoint %s: %s", d, problem)
    return out


def find_latest(root: Path) -> Path | None:
    """The checkpoint to resume from: the one ``latest`` names if it verifies, else the newest
    complete one (with a warning), else None."""
    root = Path(root)
    pointer = root / LATEST
    if pointer.is_file():
        cand = root / pointer.read_text().strip()
        problem = verify(cand) if cand.is_dir() else "it does not exist"
        if problem is None:
            return cand
        log.warning("latest points at %s, which is unusable (%s); falling back", cand, problem)
    complete = complete_checkpoints(root)
    return complete[-1] if complete else None


def prune(root: Path, max_to_keep: int) -> None:
    """Remove all but the newest ``max_to_keep`` complete checkpoints and any stale temp dirs."""
    root = Path(root)
    for tmp in root.glob(".tmp-*"):
        if tmp.is_dir() and not tmp.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(tmp, ignore_errors=True)
    complete = complete_checkpoints(root)
    latest = find_latest(root)
    for d in complete[:-max_to_keep]:
        if latest is not None and d.resolve() == latest.resolve():
            continue
        shutil.rmtree(d, ignore_errors=True)
