"""Versioned LoRA adapter sync through a shared directory: the trainer publishes, rollout engines load.

Step 6 of a GRPO step (docs/architecture.md): after its optimizer step(s) the trainer (rank 0) publishes the
adapter as version ``v<step>``; before sampling, every rollout engine loads exactly the version it
is told to, or refuses to sample.

Layout (``root`` = ``<paths.shared>/lora_sync/<run key>``, see ``sync_root``)::

    v3/                          a complete version (visible only once complete)
        adapter_config.json      plain PEFT adapter (what PeftModel.from_pretrained / vLLM read)
        adapter_model.safetensors
        rlkit_adapter.json       {"version", "sha256", "base_model"} (checked by rlkit.policy.load_adapter_inplace)
        manifest.json            {"version", "weights_sha256", "files": {name: {"sha256", "size"}}, ...}
    .tmp-v4-<pid>-<rand>/        a version being written (never read)

Publish protocol (``publish_adapter``): serialize the tensors to safetensors bytes in memory and
hash them (one pass), write every file into a fresh temp dir beside the versions, fsync each file,
write ``manifest.json`` last and fsync it and the dir, ``rename(2)`` the temp dir to ``v<step>``
(an existing ``v<step>``, left by an abandoned run, is moved aside first), fsync ``root``, then prune
all but the newest ``keep_versions`` versions. A reader therefore sees either no ``v<step>`` or a
complete one; a crash leaves only a ``.tmp-*`` dir, removed by the next prune. This is the POSIX
temp-file + fsync + rename recipe that rlkit.checkpoint also follows.

Load protocol (``AdapterSubscriber.load``): wait (polling, up to ``timeout_s``) for ``v<expected>``
to appear; verify its manifest (the version it names, every file's size and sha256); hot-swap it
into the live PeftModel with rlkit.policy's ``load_adapter_inplace`` (which re-checks the weights'
sha256 against rlkit_adapter.json and that every LoRA tensor was overwritten); check that the loaded
digest is the manifest's. Refusals raise ``SyncError`` with the reason: the version is missing
after the wait (with the newest version present, e.g. an older one: the trainer did not publish),
torn (a file missing, a size or checksum mismatch, no manifest), mislabelled (the manifest names
another version), or older than what the engine already holds (weights never go backwards).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from rlkit.checkpoint import fsync_path

SYNC_DIRNAME = "lora_sync"
MANIFEST = "manifest.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_META = "rlkit_adapter.json"
_VERSION_RE = re.compile(r"^v(\d+)$")


class SyncError(RuntimeError):
    """An adapter version could not be published or must not be loaded; the message says which
    version, where, why, and what to check."""


@dataclass
class PublishedVersion:
    """What ``publish_adapter`` wrote.

    version: the step. path: the version directory. weights_sha256: digest of adapter_model.safetensors.
    num_bytes: size of that file (bytes). num_tensors / num_params: LoRA tensors and scalars.
    seconds: wall time of the publish (serialize + write + fsync + rename + prune), seconds.
    """

    version: int
    path: str
    weights_sha256: str
    num_bytes: int
    num_tensors: int
    num_params: int
    seconds: float


@dataclass
class LoadedVersion:
    """What ``AdapterSubscriber.load`` did.

    version: the version now live in the engine. path: its directory. weights_sha256: its digest.
    wait_s: time spent waiting for it to appear (seconds). load_s: verify + hot-swap time (seconds).
    skipped: True when that version was already live (nothing was read).
    """

    version: int
    path: str
    weights_sha256: str
    wait_s: float
    load_s: float
    skipped: bool = False


def sync_root(shared_dir: str | os.PathLike, run_key: str) -> Path:
    """``<shared_dir>/lora_sync/<run_key>``: one run's versions (runs of a sweep share ``shared_dir``)."""
    if not run_key or "/" in run_key or run_key.startswith("."):
        raise ValueError(f"run_key={run_key!r} must be a plain directory name")
    return Path(shared_dir) / SYNC_DIRNAME / run_key


def run_key_for(output_dir: str | os.PathLike) -> str:
    """A stable key for a job's sync directory: 16 hex digits of sha256(absolute output dir).

    The same job folder (a resumed run) gets the same key; two jobs of a sweep get different ones.
    """
    return hashlib.sha256(str(Path(output_dir).resolve()).encode()).hexdigest()[:16]


def version_dir(root: str | os.PathLike, version: int) -> Path:
    return Path(root) / f"v{int(version)}"


def list_versions(root: str | os.PathLike) -> list[int]:
    """Versions whose directory exists under ``root`` (complete or not: see ``verify_version``), ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _VERSION_RE.match(p.name)
        if m and p.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def publish_adapter(
    root: str | os.PathLike,
    version: int,
    tensors: Mapping[str, torch.Tensor],
    adapter_config: Mapping[str, Any],
    base_model: str | None = None,
    keep_versions: int = 2,
) -> PublishedVersion:
    """Publish ``tensors`` as adapter version ``version`` under ``root``, atomically (module doc).

    Args:
        root: the run's sync directory (created if needed).
        version: the training step that produced the weights (>= 0).
        tensors: the full (unsharded) adapter in PEFT's saved layout: keys like
            ``base_model.model.<module>.lora_A.weight`` (no adapter name), CPU tensors.
        adapter_config: the PEFT LoraConfig as a dict (``PeftConfig.to_dict()``; sets become lists).
        base_model: recorded in adapter_config.json (``base_model_name_or_path``) and rlkit_adapter.json.
        keep_versions: complete versions kept after this one is in place (>= 1); older ones removed.

    Returns: PublishedVersion.

    Raises:
        ValueError: version < 0, keep_versions < 1, or no tensors.
        SyncError: the write failed (disk full, read-only, permissions); nothing partial is left
            visible as ``v<version>``.
    """
    from safetensors.torch import save as st_save

    if version < 0:
        raise ValueError(f"adapter version must be >= 0, got {version}")
    if keep_versions < 1:
        raise ValueError(f"keep_versions={keep_versions} must be >= 1 (the version just published)")
    if not tensors:
        raise ValueError("publish_adapter got no tensors (is the policy a LoRA model?)")
    t0 = time.perf_counter()
    root = Path(root)
    final = version_dir(root, version)
    tmp = root / f".tmp-v{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        blob = st_save(cpu, metadata={"format": "pt"})
        digest = hashlib.sha256(blob).hexdigest()
        _write_synced(tmp / ADAPTER_WEIGHTS, blob)
        cfg = dict(adapter_config)
        if base_model is not None:
            cfg["base_model_name_or_path"] = base_model
        small = {
            ADAPTER_CONFIG: json.dumps(cfg, indent=2, sort_keys=True, default=_json_default).encode(),
            ADAPTER_META: json.dumps({"version": int(version), "sha256": digest, "base_model": base_model}, indent=2).encode(),
        }
        files = {ADAPTER_WEIGHTS: {"sha256": digest, "size": len(blob)}}
        for name, data in small.items():
            _write_synced(tmp / name, data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        manifest = {
            "version": int(version),
            "weights_sha256": digest,
            "files": files,
            "num_tensors": len(cpu),
            "num_params": int(sum(v.numel() for v in cpu.values())),
            "created_unix": time.time(),
        }
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        fsync_path(tmp)
        if final.exists():  # left by an abandoned run of this job (e.g. before a resume): replace it
            stale = root / f".tmp-stale-v{version}-{uuid.uuid4().hex[:8]}"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, final)
        fsync_path(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SyncError(
            f"could not publish adapter version {version} under {root}: {e}. Check that paths.shared "
            f"({root.parent.parent}) is writable and has space."
        ) from e
    prune_versions(root, keep_versions)
    return PublishedVersion(version=int(version), path=str(final), weights_sha256=digest, num_bytes=len(blob),
                            num_tensors=manifest["num_tensors"], num_params=manifest["num_params"],
                            seconds=time.perf_counter() - t0)


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if all(isinstance(x, str) for x in o) else list(o)
    if hasattr(o, "value"):  # enums (peft's TaskType / PeftType are str enums)
        return o.value
    raise TypeError(f"not JSON-serialisable in adapter_config: {type(o).__name__}")


def prune_versions(root: str | os.PathLike, keep_versions: int) -> list[int]:
    """Remove all but the newest ``keep_versions`` versions and temp dirs of other processes.

    Returns: the versions removed. Readers that already opened a removed version's files keep
    reading them (POSIX unlink semantics); a reader that looks for it afterwards gets a clear
    "missing" SyncError, never a partial adapter.
    """
    root = Path(root)
    versions = list_versions(root)
    removed = versions[:-keep_versions] if keep_versions > 0 else versions
    for v in removed:
        shutil.rmtree(version_dir(root, v), ignore_errors=True)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-") and f"-{os.getpid()}-" not in p.name:
                shutil.rmtree(p, ignore_errors=True)
    return removed


def remove_versions_after(root: str | os.PathLike, version: int) -> list[int]:
    """Remove versions newer than ``version`` (left by an abandoned run this one resumes before).

    Returns: the versions removed.
    """
    removed = [v for v in list_versions(root) if v > version]
    for v in removed:
        shutil.rmtree(version_dir(root, v), ignore_errors=True)
    return removed


def verify_version(root: str | os.PathLike, version: int) -> dict[str, Any]:
    """Check ``v<version>`` against its manifest; return the manifest.

    Raises:
        SyncError: the directory or manifest is missing or unreadable, the manifest names another
            version, or a file is missing or differs in size or sha256 (a torn or tampered version).
    """
    d = version_dir(root, version)
    if not d.is_dir():
        raise SyncError(f"adapter version {version} is missing: {d} does not exist")
    mpath = d / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise SyncError(f"adapter version {version} at {d} is torn: no {MANIFEST} (the write did not finish)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise SyncError(f"adapter version {version} at {d} is torn: unreadable {MANIFEST} ({e})") from e
    if manifest.get("version") != version:
        raise SyncError(
            f"adapter version {version} at {d} is stale or mislabelled: its manifest says version "
            f"{manifest.get('version')}; refusing to sample with it"
        )
    for name, meta in manifest.get("files", {}).items():
        p = d / name
        if not p.is_file():
            raise SyncError(f"adapter version {version} at {d} is torn: file {name} is missing")
        size = p.stat().st_size
        if size != meta["size"]:
            raise SyncError(f"adapter version {version} at {d} is torn: {name} has {size} bytes, manifest says {meta['size']}")
        if _sha256_file(p) != meta["sha256"]:
            raise SyncError(f"adapter version {version} at {d} is torn: {name} checksum mismatch with its manifest")
    if ADAPTER_WEIGHTS not in manifest.get("files", {}) or manifest.get("weights_sha256") != manifest["files"][ADAPTER_WEIGHTS]["sha256"]:
        raise SyncError(f"adapter version {version} at {d} is torn: the manifest does not list {ADAPTER_WEIGHTS} with its checksum")
    return manifest


def _wait_exists(root: Path, version: int, timeout_s: float, poll_s: float) -> None:
    """Poll until ``v<version>`` exists; SyncError naming what is there instead after ``timeout_s``."""
    deadline = time.monotonic() + max(float(timeout_s), 0.0)
    d = version_dir(root, version)
    while not d.is_dir():
        if time.monotonic() >= deadline:
            present = list_versions(root)
            newest = present[-1] if present else None
            if newest is None:
                what = "no version has been published there"
            elif newest < version:
                what = f"the newest version there is v{newest}, older than expected (the trainer has not published step {version})"
            else:
                what = f"versions present: {', '.join(f'v{v}' for v in present)} (v{version} was pruned or never written)"
            raise SyncError(
                f"adapter version {version} is missing under {root} after waiting {timeout_s:.1f}s: {what}. "
                f"Refusing to sample with other weights. Check the trainer's log; raise "
                f"backend.sync_timeout_s if publishing is slow on this filesystem."
            )
        time.sleep(poll_s)


class AdapterSubscriber:
    """The rollout side of the sync: loads exactly the expected version into a live PeftModel.

    Args:
        root: the run's sync directory. timeout_s: how long ``load`` waits for a version to appear
            (seconds). poll_s: polling interval (seconds).

    Attributes: version (the version live in the model; None before the first load), sha256.
    """

    def __init__(self, root: str | os.PathLike, timeout_s: float = 300.0, poll_s: float = 0.05) -> None:
        self.root = Path(root)
        self.timeout_s = float(timeout_s)
        self.poll_s = float(poll_s)
        self.version: int | None = None
        self.sha256: str | None = None

    def load(self, model: Any, version: int) -> LoadedVersion:
        """Make ``version`` the live adapter of ``model`` (a PeftModel), or raise.

        A version already live is not read again. Otherwise: wait for it, verify the manifest,
        ``load_adapter_inplace``, and compare the loaded digest with the manifest's.

        Raises:
            SyncError: missing after ``timeout_s``, torn, mislabelled, older than the live version,
                or the file changed between verification and loading.
            ValueError / TypeError: from load_adapter_inplace (adapter does not fit the model).
        """
        from rlkit.policy.lora import load_adapter_inplace

        if self.version is not None and version < self.version:
            raise SyncError(
                f"asked to load adapter version {version}, older than the live version {self.version}: "
                f"refusing to go back to stale weights ({self.root})"
            )
        path = version_dir(self.root, version)
        if self.version == version:
            return LoadedVersion(version, str(path), self.sha256 or "", 0.0, 0.0, skipped=True)
        t0 = time.perf_counter()
        _wait_exists(self.root, version, self.timeout_s, self.poll_s)
        t1 = time.perf_counter()
        manifest = verify_version(self.root, version)
        info = load_adapter_inplace(model, path)
        if info.sha256 != manifest["weights_sha256"]:
            raise SyncError(
                f"adapter version {version} at {path} changed while loading (sha256 {info.sha256[:12]} != "
                f"manifest {manifest['weights_sha256'][:12]}): torn; refusing to sample"
            )
        if info.version != version:
            raise SyncError(f"adapter version {version} at {path}: {ADAPTER_META} says version {info.version}")
        self.version, self.sha256 = version, info.sha256
        return LoadedVersion(version, str(path), info.sha256, wait_s=t1 - t0, load_s=time.perf_counter() - t1)
