"""FSDP2 for the trainer ranks: process group, ``fully_shard`` of a Qwen-VL LoRA policy, and moving
full (unsharded) LoRA / optimizer state between rank 0 and the shards.

Follows PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) documentation: call it bottom-up,
one group per transformer block, then on the root; parameters become DTensors sharded on dim 0
(``Shard(0)``, torch.chunk semantics), gathered before each block's forward and freed after it
(``reshard_after_forward``), gradients reduce-scattered after each block's backward; an optimizer
built on the sharded parameters holds sharded state. Mixed precision on GPU:
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` over float32 sharded (master)
parameters.

Groups: each decoder layer of the language model, each vision block, then the root, which is the
PeftModel itself and not the Hugging Face model under it, because peft's tuner calls the HF
model's ``forward`` method directly (no ``__call__``, so module hooks placed on the HF model would
never fire). The root's group holds the embeddings, final norm, lm_head, the vision patch embedding
and mergers.

Gradient reduction: every FSDP group is set to a plain SUM (``set_gradient_divide_factor(1.0)`` +
``set_force_sum_reduction_for_comms(True)``) instead of FSDP's default average. Each rank weights
its micro-batch losses by global token / sequence counts (rlkit.distributed.update), so the summed
shard gradient is the single-rank gradient of the whole mini-batch, with no multiply-by-world-size
/ divide-by-world-size round trip (on CPU the result is bitwise equal to a single-process run in
tests/distributed).

Gathering uses ``DTensor.full_tensor()`` on the LoRA parameters only (all ranks call it in the
same order), never a full model state dict: the frozen base weights (16 GB for an 8B model) are not
moved. FSDP1's rank0-only offloaded state dict is avoided: it deadlocks on CPU.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlkit.policy.lora import live_key

#: Where Qwen-VL keeps its decoder layers and vision blocks, relative to the Hugging Face model.
DECODER_LAYER_PATHS = ("model.language_model.layers", "language_model.layers", "model.layers")
VISION_BLOCK_PATHS = ("model.visual.blocks", "visual.blocks")


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, device_type: str,
                       timeout_s: float) -> Any:
    """Join the trainers' process group (gloo on CPU, NCCL on GPU) and build the 1-D device mesh.

    Args: rank in [0, world_size); master_addr/master_port: rank 0's TCP store; device_type "cpu" |
    "cuda"; timeout_s: collective timeout (seconds).

    Returns: the DeviceMesh of shape (world_size,).

    Raises: RuntimeError from torch.distributed when rank 0's store cannot be reached in time.
    """
    from torch.distributed.device_mesh import init_device_mesh

    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return init_device_mesh(device_type, (world_size,))


def _submodule(root: nn.Module, dotted: str) -> nn.Module | None:
    mod: Any = root
    for part in dotted.split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def _find(hf_model: nn.Module, paths: tuple[str, ...]) -> nn.ModuleList | None:
    for path in paths:
        mod = _submodule(hf_model, path)
        if isinstance(mod, nn.ModuleList):
            return mod
    return None


def shard_policy(policy: Any, mesh: Any, mixed_precision: bool) -> nn.Module:
    """Apply FSDP2 to ``policy.model`` in place (module doc); return the root FSDP module.

    Args:
        policy: a rlkit.policy.Policy whose model is a PeftModel (LoRA), identical on every rank
            (same checkpoint, same LoRA seed): each rank keeps its own shard, nothing is broadcast.
        mesh: the 1-D DeviceMesh of the trainer ranks.
        mixed_precision: bf16 compute with fp32 gradient reduction (GPU only; the sharded
            parameters should then be float32).

    Raises: TypeError when the model has no decoder layers where Qwen-VL keeps them.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    hf = policy.hf_model
    layers = _find(hf, DECODER_LAYER_PATHS)
    if layers is None:
        raise TypeError(f"{type(hf).__name__} has no decoder layers at {DECODER_LAYER_PATHS}: cannot shard it per layer")
    blocks = _find(hf, VISION_BLOCK_PATHS)
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    for block in blocks if blocks is not None else []:
        fully_shard(block, **kwargs)
    root = fully_shard(policy.model, **kwargs)
    for mod in root.modules():
        if isinstance(mod, FSDPModule):
            mod.set_gradient_divide_factor(1.0)
            mod.set_force_sum_reduction_for_comms(True)
    return root


class SingleRankRoot:
    """What a one-rank trainer uses in place of the FSDP root when it computes in the weights' own dtype
    (no mixed precision): the policy stays unsharded. FSDP2 over one rank only adds the per-block
    all-gather copies and hooks; with nothing to reduce, gradient sync has nothing to switch.
    The update's other collectives (metric all-reduces) run as on any world size."""

    #: the update's forwards need not match across ranks (there are no other ranks)
    collective_forwards = False

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """No-op: one rank's gradients are already the full gradients."""

    def reduce_gradients(self, params: list[nn.Parameter]) -> None:
        """No-op (one rank)."""


class ReplicatedRoot:
    """What the trainer ranks use in place of the FSDP root under ``backend.strategy=ddp``: data parallel
    with replicated parameters, as PyTorch's DistributedDataParallel with gradient accumulation under
    ``no_sync``: every rank holds the whole policy (frozen base and LoRA adapter), runs the forwards and
    backwards of its own share of the batch, and before the optimizer step the trainable parameters'
    gradients are summed over the ranks in one coalesced all-reduce (``reduce_gradients``). Each rank
    then takes the same optimizer step on the same gradients, so the replicas stay identical (bitwise:
    an all-reduce hands every rank the same sums).

    Unlike FSDP2, nothing is gathered in the forward, so the ranks need not run the same forwards:
    ``collective_forwards`` is False (no filler micro-batches, no uniform prefix/suffix forwards, and
    the shared-prefix forward's root prefix stays on). Worth it when the whole policy fits one device,
    as a LoRA-tuned model whose adapter is small: one all-reduce of the adapter's gradients a step
    against FSDP2's all-gather of every block's parameters in every forward and backward.
    """

    collective_forwards = False

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """No-op: the gradients are summed once, in ``reduce_gradients``."""

    def reduce_gradients(self, params: list[nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks (collective: all ranks call, with the same
        ``params`` in the same order). A parameter without a gradient on a rank (it ran no backward)
        counts as zeros there; afterwards every parameter has the summed gradient. One all-reduce per
        dtype over the flattened gradients."""
        import torch.distributed as dist

        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in group:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)
                offset += n


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def trainable_named_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every parameter with requires_grad, in ``named_parameters`` order
    (the optimizer's parameter order, identical on every rank and in a single-process run)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def gather_lora_state(model: nn.Module, rank: int, adapter_name: str = "default") -> dict[str, torch.Tensor] | None:
    """The full LoRA adapter, gathered on rank 0, in PEFT's saved layout (collective: all ranks call).

    Returns: on rank 0, {``base_model.model.<module>.lora_A.weight``: full CPU tensor} exactly as
    ``PeftModel.save_pretrained`` would write it (peft's get_peft_model_state_dict removes the
    adapter name); None on other ranks.
    """
    from peft.utils import get_peft_model_state_dict

    full: dict[str, torch.Tensor] = {}
    for name, p in trainable_named_parameters(model):
        t = _full(p.detach())
        if rank == 0:
            full[name] = t.to("cpu", copy=True)
    if rank != 0:
        return None
    return get_peft_model_state_dict(model, state_dict=full, adapter_name=adapter_name)



def load_lora_state(model: nn.Module, tensors: dict[str, torch.Tensor], adapter_name: str = "default") -> int:
    """Write a full adapter (PEFT saved layout, as read from adapter_model.safetensors) into the
    sharded LoRA parameters; every rank passes the same tensors and keeps its own shard (no
    communication: ``distribute_tensor(..., src_data_rank=None)``).

    Returns: the number of tensors loaded.
    Raises: ValueError when a key has no LoRA parameter, a shape differs, or a LoRA parameter of
    the model is not in ``tensors``.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    live = dict(trainable_named_parameters(model))
    seen = set()
    with torch.no_grad():
        for key, full in tensors.items():
            name = live_key(key, adapter_name)
            p = live.get(name)
            if p is None:
                raise ValueError(f"adapter tensor {key} has no trainable parameter {name} in the model")
            if tuple(full.shape) != tuple(p.shape):
                raise ValueError(f"adapter tensor {key} has shape {tuple(full.shape)}, the model's {name} is {tuple(p.shape)}")
            src = full.to(device=p.device, dtype=p.dtype)
            if isinstance(p, DTensor):
                shard = distribute_tensor(src, p.device_mesh, p.placements, src_data_rank=None)
                p.to_local().copy_(shard.to_local())
            else:
                p.copy_(src)
            seen.add(name)
    missing = sorted(set(live) - seen)
    if missing:
        raise ValueError(f"the adapter has no tensor for {len(missing)} LoRA parameter(s), e.g. {missing[:3]}")
    return len(seen)


def gather_optimizer_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], rank: int) -> dict[int, dict[str, torch.Tensor]] | None:
    """Full optimizer state on rank 0, keyed by parameter index (collective: all ranks call).

    Returns: on rank 0 {i: {"step": tensor, "exp_avg": full CPU tensor, ...}} for every parameter
    ``params[i]`` that has state: the ``state`` part of ``optimizer.state_dict()`` of a
    single-process optimizer over the same parameters; None on other ranks.
    """
    out: dict[int, dict[str, torch.Tensor]] = {}
    for i, p in enumerate(params):
        st = optimizer.state.get(p)
        if not st:
            continue
        entry = {}
        for k in sorted(st):
            v = st[k]
            v = _full(v) if torch.is_tensor(v) else v
            if rank == 0:
                entry[k] = v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
        if rank == 0:
            out[i] = entry
    return out if rank == 0 else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], state: dict[int, dict[str, Any]]) -> None:
    """Load full per-parameter optimizer state (``gather_optimizer_state``'s / a single-process
    ``optimizer.state_dict()["state"]``) into an optimizer over sharded parameters; every rank
    passes the same state and keeps its shard. Hyperparameters (param_groups) are left as they are.

    Raises: ValueError when an index is out of range or a tensor's shape fits no parameter.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    sharded: dict[int, dict[str, Any]] = {}
    for i, entry in state.items():
        i = int(i)
        if not 0 <= i < len(params):
            raise ValueError(f"optimizer state for parameter {i}, but the optimizer has {len(params)}")
        p = params[i]
        new = {}
        for k, v in entry.items():
            if torch.is_tensor(v) and v.dim() > 0:
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"optimizer state {k} of parameter {i} has shape {tuple(v.shape)}, the parameter {tuple(p.shape)}")
                v = v.to(device=p.device, dtype=p.dtype)
                if isinstance(p, DTensor):
                    v = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)
            new[k] = v
        sharded[i] = new
    groups = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": sharded, "param_groups": groups})


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over (DTensor) gradients; returns the total norm before
    clipping (the same float on every rank; the norm of the full, reduced gradient)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(_full(norm))


def free_port() -> int:
    """A TCP port free on this host right now (for rank 0's store)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    """This node's IP as Ray sees it (what other ranks connect to), or 127.0.0.1 outside Ray."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")
