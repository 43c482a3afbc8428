"""The rollout engine of ``rollout.engine``, chosen once, and the adapter versions it samples with.

``open_engine(kind, policy, env_spec, ...)`` is the one place the engine kind is decided (``ENGINES``). The local
executor (rlkit.recipes.local) and every Ray rollout worker (rlkit.distributed.workers) hold what it returns and call
the same members whatever the kind (``EngineHandle``): ``engine`` is the RolloutEngine rollouts and evaluations
sample with; ``publish(v)`` makes the policy's live adapter version ``v<v>`` for the engine; ``load_version(v)`` makes
``v<v>`` the weights the engine samples; ``wait_ready``, ``metrics`` and ``close`` do the rest.

- ``rlkit`` (``LiveEngine``): rlkit.policy.engine.TransformersEngine in this process, sampling the policy's own live
  weights, so there is nothing to publish, wait for or load: every member but ``engine`` is a no-op. (On Ray the
  rollout worker's rlkit.sync.AdapterSubscriber loads each version into its policy, which this engine samples.)
- ``vllm`` (``VersionedEngine``): rlkit.policy.vllm_engine.VllmEngine, vLLM in a process of its own, which samples
  only what it is given: each version is published to the sync folder (rlkit.sync, ``v<step>``; the versions an
  abandoned run left after it removed first) and loaded into vLLM under a new LoRA id before it samples.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from rlkit.policy import make_engine
from rlkit.policy.lora import adapter_payload
from rlkit.sync import publish_adapter, remove_versions_after, verify_version, version_dir


class EngineHandle(Protocol):
    """A rollout engine with the adapter versions it samples (module doc). Metrics use the run's names."""

    engine: Any  # rlkit.policy.engine.RolloutEngine: generate (and generate_cached with reuse_kv)

    def wait_ready(self) -> None:
        """Block until the engine can sample."""
        ...

    def publish(self, version: int) -> dict[str, float]:
        """Make the policy's live adapter version ``v<version>`` for the engine; the publish's metrics."""
        ...

    def load_version(self, version: int, verify: bool = True) -> dict[str, float]:
        """Make ``v<version>`` the weights the engine samples; the load's metrics."""
        ...

    def metrics(self) -> dict[str, float]:
        """The engine's own metrics to log with a rollout."""
        ...

    def close(self) -> None:
        """Stop what the engine started. Idempotent."""
        ...


class LiveEngine:
    """``rollout.engine=rlkit``: ``engine`` samples the policy's live weights in this process (module doc)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def wait_ready(self) -> None:
        """Ready from the start."""

    def publish(self, version: int) -> dict[str, float]:
        """Nothing to publish (the engine samples the live weights): {}."""
        return {}

    def load_version(self, version: int, verify: bool = True) -> dict[str, float]:
        """Nothing to load (the engine samples the live weights): {}."""
        return {}

    def metrics(self) -> dict[str, float]:
        """None: {}."""
        return {}

    def close(self) -> None:
        """Nothing runs outside this process."""


class VersionedEngine:
    """``rollout.engine=vllm``: ``engine`` samples the adapter versions loaded into it (module doc).

    ``sync_root``: where versions are published and read (None: a temporary folder, removed by ``close``);
    ``keep_versions``: the versions ``publish`` keeps; ``say``: where progress lines go (None: nowhere).
    """

    def __init__(self, policy: Any, env_spec: Any, *, reuse_kv: bool, threads: int, sync_root: str | Path | None = None,
                 log_path: str | Path | None = None, say: Callable[[str], None] | None = None,
                 keep_versions: int = 2) -> None:
        from rlkit.policy.vllm_engine import VllmEngine, max_images_for

        self.policy = policy
        self.keep_versions = int(keep_versions)
        self._say = say or (lambda line: None)
        self._tmp_root = None if sync_root is not None else Path(tempfile.mkdtemp(prefix="rlkit-sync-"))
        self.sync_root = Path(sync_root) if sync_root is not None else self._tmp_root
        self.engine = VllmEngine(policy, max_images=max_images_for(env_spec), prefix_caching=reuse_kv,
                                 threads=threads, log_path=log_path)
        self.version: int | None = None  # the version loaded into vLLM
        self._pending: dict[str, float] = {}  # timing/engine_startup, logged with the next rollout
        self._say(f"rollout.engine=vllm: vLLM starting in process {self.engine.pid} (log {self.engine.log_path}); "
                  f"adapter versions under {self.sync_root}")

    def wait_ready(self) -> None:
        """Block until vLLM has started (the first call; ``metrics`` then reports timing/engine_startup, seconds
        from its spawn to ready)."""
        if self.engine.startup_s is None:
            self._pending["timing/engine_startup"] = self.engine.wait_ready()
            self._say(f"rollout.engine=vllm: vLLM ready after {self.engine.startup_s:.0f} s "
                      f"({', '.join(f'{k} {v}' for k, v in self.engine.versions.items())})")

    def publish(self, version: int) -> dict[str, float]:
        """Publish the policy's live adapter as ``v<version>`` (rlkit.sync.publish_adapter), the versions after it (an
        abandoned run's, before a resume) removed first; {"timing/publish": seconds}.

        Raises: rlkit.sync.SyncError when the folder cannot be written."""
        remove_versions_after(self.sync_root, version)
        tensors, config = adapter_payload(self.policy.model, self.policy.checkpoint)
        pub = publish_adapter(self.sync_root, version, tensors, config, base_model=self.policy.checkpoint,
                              keep_versions=self.keep_versions)
        return {"timing/publish": pub.seconds}

    def load_version(self, version: int, verify: bool = True) -> dict[str, float]:
        """Make ``v<version>`` vLLM's adapter (checked against its manifest first unless ``verify`` is False: the
        caller just did), after waiting for vLLM on its first use. Returns {"timing/load": seconds (0 when it was
        loaded already), "sync/version": version}.

        Raises: rlkit.sync.SyncError (missing or torn version); rlkit.policy.vllm_engine.VllmEngineError."""
        self.wait_ready()
        out = {"timing/load": 0.0}
        if self.version != version:
            t0 = time.perf_counter()
            if verify:
                verify_version(self.sync_root, version)
            self.engine.load_adapter(version_dir(self.sync_root, version))
            self.version = version
            out["timing/load"] = time.perf_counter() - t0
        out["sync/version"] = float(version)
        return out

    def metrics(self) -> dict[str, float]:
        """timing/engine_startup once after vLLM started, and sync/probe_logprob_diff, the largest logprob difference
        of the last probe (rlkit.policy.vllm_engine) when one ran."""
        out, self._pending = self._pending, {}
        probe = self.engine.last_probe
        if probe:
            out["sync/probe_logprob_diff"] = float(probe["max_logprob_diff"])
        return out

    def close(self) -> None:
        """Stop vLLM's process and remove a temporary sync folder."""
        self.engine.close()
        if self._tmp_root is not None:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            self._tmp_root = None


def _live(policy: Any, env_spec: Any, *, reuse_kv: bool, **_: Any) -> LiveEngine:
    """rlkit.policy.make_engine on ``policy``; the other settings are an engine process's."""
    return LiveEngine(make_engine(policy, reuse_kv=reuse_kv))


#: rollout.engine's choices and what opens each (policy, env_spec, **open_engine's keywords).
ENGINES: dict[str, Callable[..., EngineHandle]] = {"rlkit": _live, "vllm": VersionedEngine}


def open_engine(kind: str, policy: Any, env_spec: Any, *, reuse_kv: bool, threads: int,
                sync_root: str | Path | None = None, log_path: str | Path | None = None,
                say: Callable[[str], None] | None = None) -> EngineHandle:
    """The engine ``kind`` (rollout.engine) for ``policy`` (a LoRA policy) and ``env_spec``'s conversations.

    ``reuse_kv``: rollout.reuse_kv_cache (vLLM: its prefix caching); ``threads``: torch threads of an engine in a
    process of its own; ``sync_root``, ``say``: VersionedEngine's; ``log_path``: where an engine in a process of its
    own writes its log (None: a temporary file).

    Raises: ValueError for an unknown ``kind``; what the engine raises at its start.
    """
    if kind not in ENGINES:
        raise ValueError(f"rollout.engine={kind!r} is none of {sorted(ENGINES)}")
    return ENGINES[kind](policy, env_spec, reuse_kv=reuse_kv, threads=threads, sync_root=sync_root,
                         log_path=log_path, say=say)
