"""The classes run as Ray actors by backend=native_ray: FSDP2 trainer ranks and rollout workers.

They are plain classes (``ray.remote`` is applied by rlkit.distributed.cluster), so a test can
also run them in-process. Each actor sets torch's intra-op threads to its bundle's cores and loads
its own copy of the policy from the same checkpoint with the same LoRA seed, so every process
starts from identical weights without a broadcast.

TrainerWorker (rank r of W): joins the process group, shards the policy with FSDP2 (W = 1 without
mixed precision: left unsharded, rlkit.distributed.fsdp.SingleRankRoot), owns the (sharded) AdamW
state, runs its part of each GRPO update (rlkit.distributed.update) and, on rank 0,
publishes the gathered adapter as version ``v<step>`` (rlkit.sync).

RolloutWorker: an unsharded policy and its engine (rlkit.engines.open_engine of rollout.engine: rlkit's
TransformersEngine, or vLLM in a child process of the actor); before sampling it loads exactly the version it is
told to (rlkit.sync.AdapterSubscriber: into the policy; then into the engine, which with vLLM takes it under a new
LoRA id) and records that version in every trajectory.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.config import AlgorithmConfig, OptimConfig


@dataclass
class TrainerSpec:
    """What every trainer rank is built from.

    policy: the resolved conf/policy node as a plain dict (with ``_target_``). base_path: the SFT
    warm start checkpoint (or None). algorithm: the GRPO config. optim: AdamW's settings. lr: initial learning rate (the
    driver sends each step's lr). sync_root / keep_versions: where versions are published and how
    many are kept. threads: torch intra-op threads. device_type: "cpu" | "cuda". mixed_precision:
    FSDP2 bf16/fp32 policy (GPU). dist_timeout_s: collective timeout (seconds). deterministic:
    torch.use_deterministic_algorithms. strategy: "fsdp" (FSDP2 shards) | "ddp" (replicated ranks,
    rlkit.distributed.fsdp.ReplicatedRoot); RaySettings.strategy.
    """

    policy: dict[str, Any]
    base_path: str | None
    algorithm: AlgorithmConfig
    lr: float
    sync_root: str
    keep_versions: int
    threads: int
    device_type: str
    mixed_precision: bool
    dist_timeout_s: float
    deterministic: bool = False
    strategy: str = "fsdp"
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class RolloutSpec:
    """What every rollout worker is built from: the resolved env and policy nodes (plain dicts with
    ``_target_``), the SFT base checkpoint, the sync directory and wait (seconds), threads, device, the engine
    (rollout.engine, a key of rlkit.engines.ENGINES: "rlkit" | "vllm") and where a vLLM engine writes its log
    (``vllm_engine_<index>.log``; None: the temp dir)."""

    env: dict[str, Any]
    policy: dict[str, Any]
    base_path: str | None
    sync_root: str
    sync_timeout_s: float
    threads: int
    device_type: str
    deterministic: bool = False
    reuse_kv_cache: bool = True  # rollout.reuse_kv_cache: multi-turn episodes keep their KV cache across turns
    fixed_image_seed: int | None = None  # control=fixed_image: every env shows this training task's first picture
    engine: str = "rlkit"
    log_dir: str | None = None


def configure_process(threads: int, deterministic: bool = False) -> None:
    """Per-actor process setup: torch threads = the bundle's cores, quiet transformers."""
    import transformers

    torch.set_num_threads(max(1, int(threads)))
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if deterministic:
        torch.use_deterministic_algorithms(True)


def load_worker_policy(policy_node: dict[str, Any], base_path: str | None, **overrides: Any) -> Any:
    """Instantiate the policy node (as the native backend does, LoRA on) with ``overrides`` (device, dtype)."""
    from omegaconf import OmegaConf

    from rlkit.plugins import instantiate_plugin

    return instantiate_plugin(OmegaConf.create(policy_node), "policy", base_path=base_path, train_mode="lora", **overrides)


class TrainerWorker:
    """One FSDP2 data-parallel rank (module doc). Call ``master_address`` on rank 0, then ``setup``
    on every rank concurrently; every other method except ``master_address`` is collective (all
    ranks must be called, concurrently, in the same order)."""

    def __init__(self, rank: int, world_size: int, spec: TrainerSpec) -> None:
        configure_process(spec.threads, spec.deterministic)
        self.rank, self.world_size, self.spec = int(rank), int(world_size), spec
        self.policy: Any = None

    def ping(self) -> int:
        """This actor's pid: it is alive and answering (RayCluster.dead_workers)."""
        return os.getpid()

    def master_address(self) -> tuple[str, int]:
        """(node IP, free port) for rank 0's TCP store."""
        from rlkit.distributed.fsdp import free_port, node_ip

        return node_ip(), free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, load and shard the policy, build the optimizer.

        Returns: {"rank", "pid", "threads", "device", "params": [(name, shape)] of the trainable
        parameters in optimizer order (rank 0 only; [] elsewhere), "strategy": "fsdp" (FSDP2 shards) |
        "ddp" (ReplicatedRoot) | "unsharded" (one rank without mixed precision: SingleRankRoot)}.
        """
        from rlkit.distributed.fsdp import (ReplicatedRoot, SingleRankRoot, init_process_group, shard_policy,
                                            trainable_named_parameters)

        spec = self.spec
        mesh = init_process_group(self.rank, self.world_size, master_addr, master_port, spec.device_type,
                                  spec.dist_timeout_s)
        overrides: dict[str, Any] = {"device": spec.device_type}
        if spec.mixed_precision:
            overrides["dtype"] = "float32"  # sharded fp32 master weights; FSDP computes in bf16
        self.policy = load_worker_policy(spec.policy, spec.base_path, **overrides)
        # one rank in its weights' dtype: nothing to shard (FSDP2 would only add copies; SingleRankRoot)
        if self.world_size == 1 and not spec.mixed_precision:
            self.root = SingleRankRoot()
        elif spec.strategy == "ddp":
            self.root = ReplicatedRoot()
        else:
            self.root = shard_policy(self.policy, mesh, spec.mixed_precision)
        named = trainable_named_parameters(self.policy.model)
        self.params = [p for _, p in named]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.lr, betas=tuple(spec.optim.adam_betas),
                                           weight_decay=spec.optim.weight_decay)
        peft_cfg = copy.deepcopy(self.policy.model.peft_config["default"])
        peft_cfg.inference_mode = True
        peft_cfg.base_model_name_or_path = self.policy.checkpoint
        self.adapter_config = peft_cfg.to_dict()
        return {
            "rank": self.rank, "pid": os.getpid(), "threads": torch.get_num_threads(), "device": str(self.policy.device),
            "params": [(n, tuple(p.shape)) for n, p in named] if self.rank == 0 else [],
            "strategy": ("unsharded" if isinstance(self.root, SingleRankRoot)
                         else "ddp" if isinstance(self.root, ReplicatedRoot) else "fsdp"),
        }

    def load_adapter(self, path: str) -> int:
        """Load a saved PEFT adapter directory into the shards (every rank reads the file).

        Returns: tensors loaded. Raises: FileNotFoundError (missing files), ValueError (digest
        mismatch with rlkit_adapter.json, rank / alpha differ from the live adapter, keys or shapes).
        """
        from safetensors.torch import load_file

        from rlkit.distributed.fsdp import load_lora_state
        from rlkit.policy.lora import ADAPTER_CONFIG, ADAPTER_META, ADAPTER_WEIGHTS, read_adapter_info

        path = Path(path)
        info = read_adapter_info(path)
        meta = path / ADAPTER_META
        recorded = json.loads(meta.read_text()).get("sha256") if meta.exists() else None
        if recorded is not None and recorded != info.sha256:
            raise ValueError(f"adapter {path}: {ADAPTER_WEIGHTS} sha256 {info.sha256[:12]} != recorded {recorded[:12]}")
        saved = json.loads((path / ADAPTER_CONFIG).read_text())
        live = self.adapter_config
        for key in ("r", "lora_alpha"):
            if float(saved.get(key)) != float(live.get(key)):
                raise ValueError(f"adapter {path}: {key}={saved.get(key)} but the live adapter has {live.get(key)}")
        return load_lora_state(self.policy.model, load_file(str(path / ADAPTER_WEIGHTS)))

    def set_optimizer_state(self, state: dict[int, dict[str, Any]]) -> None:
        """Shard full per-parameter optimizer state (a single-process AdamW's ``state_dict()["state"]``)."""
        from rlkit.distributed.fsdp import load_optimizer_state

        load_optimizer_state(self.optimizer, self.params, state)

    def optimizer_state(self) -> dict[int, dict[str, Any]] | None:
        """Full optimizer state on rank 0 (None elsewhere), keyed like a single-process AdamW's."""
        from rlkit.distributed.fsdp import gather_optimizer_state

        return gather_optimizer_state(self.optimizer, self.params, self.rank)

    def lora_state(self) -> dict[str, torch.Tensor] | None:
        """The full adapter on rank 0 (PEFT saved layout), None elsewhere."""
        from rlkit.distributed.fsdp import gather_lora_state

        return gather_lora_state(self.policy.model, self.rank)

    def publish(self, version: int) -> dict[str, Any] | None:
        """Gather the adapter and, on rank 0, publish it as ``v<version>`` (rlkit.sync.publish_adapter).

        Returns: on rank 0, asdict(PublishedVersion) plus "gather_s" (seconds); None elsewhere.
        """
        from rlkit.sync import publish_adapter

        t0 = time.perf_counter()
        tensors = self.lora_state()
        gather_s = time.perf_counter() - t0
        if self.rank != 0:
            return None
        pub = publish_adapter(self.spec.sync_root, version, tensors, self.adapter_config,
                              base_model=self.policy.checkpoint, keep_versions=self.spec.keep_versions)
        return {**asdict(pub), "gather_s": gather_s}

    def train(self, payload: Any, lr: float, temperature: float, version: int,
              algorithm: AlgorithmConfig | None = None) -> dict[str, float]:
        """This rank's part of one GRPO update at learning rate ``lr``, then publish ``v<version>``.

        ``algorithm`` is the config the driver planned the update with (None = the spec's).

        Returns: policy/* metrics (identical on every rank) plus timing/update, timing/publish
        (gather + write, seconds), sync/published_version and, on rank 0, sync/published_bytes.
        """
        from rlkit.distributed.update import sharded_grpo_update

        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)
        t0 = time.perf_counter()
        if payload.steps:
            metrics = sharded_grpo_update(self.policy, self.root, self.optimizer, self.params, payload,
                                          algorithm or self.spec.algorithm, temperature)
        else:
            metrics = {"policy/skipped": 1.0}
        t1 = time.perf_counter()
        pub = self.publish(version)
        metrics["timing/update"] = t1 - t0
        metrics["timing/publish"] = time.perf_counter() - t1
        metrics["sync/published_version"] = float(version)
        if pub is not None:
            metrics["sync/published_bytes"] = float(pub["num_bytes"])
        return metrics

    def shutdown(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RolloutWorker:
    """A rollout engine on its own (unsharded) copy of the policy (module doc)."""

    def __init__(self, index: int, spec: RolloutSpec) -> None:
        from omegaconf import OmegaConf

        from rlkit.engines import open_engine
        from rlkit.plugins import instantiate_plugin
        from rlkit.sync import AdapterSubscriber

        configure_process(spec.threads, spec.deterministic)
        self.index, self.spec = int(index), spec
        self.env_spec = instantiate_plugin(OmegaConf.create(spec.env), "env")
        if spec.fixed_image_seed is not None:  # control=fixed_image (rlkit/controls.py), as the driver's
            from rlkit.controls import FixedImageEnvSpec

            self.env_spec = FixedImageEnvSpec(self.env_spec, spec.fixed_image_seed)
        self.policy = load_worker_policy(spec.policy, spec.base_path, device=spec.device_type)
        log = None if spec.log_dir is None else Path(spec.log_dir) / f"vllm_engine_{self.index}.log"
        self.engine = open_engine(spec.engine, self.policy, self.env_spec, reuse_kv=spec.reuse_kv_cache,
                                  threads=spec.threads, sync_root=spec.sync_root, log_path=log)
        self.subscriber = AdapterSubscriber(spec.sync_root, timeout_s=spec.sync_timeout_s)

    def ping(self) -> int:
        """This actor's pid: it is alive and answering (RayCluster.dead_workers)."""
        return os.getpid()

    def ready(self) -> dict[str, Any]:
        """{"index", "pid", "threads", "device"} once the policy is loaded and the engine can sample, plus the engine's
        start-up metrics (vLLM: "timing/engine_startup", seconds from its spawn to ready; rlkit.engines)."""
        info = {"index": self.index, "pid": os.getpid(), "threads": torch.get_num_threads(),
                "device": str(self.policy.device)}
        self.engine.wait_ready()
        return {**info, **self.engine.metrics()}

    def sync(self, version: int) -> dict[str, Any]:
        """Make adapter ``version`` live: in the policy (rlkit.sync.AdapterSubscriber.load), then in the engine
        (EngineHandle.load_version: nothing more for rlkit's engine, which samples the policy; vLLM loads it under a
        new LoRA id, its time added to "load_s"); asdict(LoadedVersion).

        Raises: rlkit.sync.SyncError when it is missing after the wait, torn, mislabelled or older
        than the live version.
        """
        load = asdict(self.subscriber.load(self.policy.model, version))
        load["load_s"] += self.engine.load_version(version, verify=False).get("timing/load", 0.0)  # verified above
        return load

    def rollout(self, seeds: list[int], group_size: int, sampling: Any, version: int) -> tuple[list[Any], dict[str, Any]]:
        """Load ``version``, then rlkit.rollout.rollout on ``seeds`` (G = group_size; groups contiguous,
        group indices local to this call). Returns (trajectories, {"load": LoadedVersion dict,
        "rollout_s": seconds of sampling}, plus the engine's metrics: vLLM's "sync/probe_logprob_diff")."""
        from rlkit.rollout import rollout

        load = self.sync(version)
        t0 = time.perf_counter()
        trajs = rollout(self.env_spec, self.policy, self.engine.engine, list(seeds), group_size, sampling,
                        policy_version=self.subscriber.version)
        return trajs, {"load": load, "rollout_s": time.perf_counter() - t0, **self.engine.metrics()}

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        """rlkit.demonstrations.demonstration_trajectory for each seed (the adapter plays no part), in order; a
        seed whose demonstration does not solve its task is left out."""
        from rlkit.demonstrations import demonstration_trajectories

        return demonstration_trajectories(self.env_spec, self.policy, seeds)

    def evaluate(self, seeds: list[int], sampling: Any, version: int, keep_trajectories: int = 8, pass_k: int = 0,
                 pass_k_sampling: Any = None) -> tuple[dict[str, float], list[dict[str, Any]], list[Any], dict[str, Any]]:
        """Load ``version``, then rlkit.evaluation.evaluate on ``seeds`` (with ``pass_k`` > 0 also eval/pass@k,
        ``pass_k`` samples a task with ``pass_k_sampling``).

        Returns: (metrics, per_task rows, the first ``keep_trajectories`` trajectories, the load dict).
        """
        from rlkit.evaluation import evaluate

        load = self.sync(version)
        metrics, per_task, trajs = evaluate(self.env_spec, self.policy, self.engine.engine, list(seeds), sampling,
                                            policy_version=self.subscriber.version, pass_k=int(pass_k),
                                            pass_k_sampling=pass_k_sampling)
        return metrics, per_task, trajs[:keep_trajectories], load

    def generate(self, prompts: list[Any], sampling: Any, version: int) -> list[list[Any]]:
        """Load ``version``, then ``engine.generate(prompts, sampling)`` (list of n Completions per prompt)."""
        self.sync(version)
        return self.engine.engine.generate(prompts, sampling)

    def shutdown(self) -> None:
        """Close the engine (vLLM: its process; nothing for rlkit's engine)."""
        self.engine.close()
