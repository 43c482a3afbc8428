"""The Policy object and its loader: one code path for the tiny model and Qwen3-VL-2B/8B.

``load_policy(**conf/policy/<name>.yaml)`` -> Policy:
  1. resolve the checkpoint: ``path`` (local dir or Hub id) or, when ``path`` is null, the tiny
     model built from ``tiny`` sizes into the cache (rlkit.policy.tiny.tiny_checkpoint);
  2. load the config first and fail early, with the model name and the fix, when the checkpoint is
     not reachable (offline, no HF cache) or too large for a CPU-only machine;
  3. load the processor (tokenizer + PIL image processor + chat template; rlkit.policy.processor)
     and the model (``AutoModelForImageTextToText``; dtype, device, attention implementation);
  4. wrap with LoRA (rlkit.policy.lora) unless ``lora.enabled`` is false (full fine-tuning).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from rlkit.hardware import DTYPES, resolve_dtype, resolve_dtype_here, this_cpu_has_native_bf16
from rlkit.policy.chat import ChatFormat
from rlkit.policy.lora import (
    AdapterInfo,
    LoraSettings,
    apply_lora,
    is_peft_model,
    load_adapter_inplace,
    save_adapter,
    save_full_model,
    unwrap_model,
)
from rlkit.policy.processor import load_processor
from rlkit.policy.tiny import TinyVLSizes, tiny_checkpoint

log = logging.getLogger(__name__)

#: Checkpoints with more parameters than this are refused on a CPU-only machine (an 8B model in
#: fp32 needs ~32 GB and minutes per token there); the tiny policy is the CPU path.
MAX_CPU_PARAMS = 1_000_000_000

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLoadError(RuntimeError):
    """The policy checkpoint could not be loaded; the message names the model and the fix."""


@dataclass
class PolicyConfig:
    """Everything conf/policy/<name>.yaml holds (besides ``_target_``).

    name: label for logs ("tiny_vl", "qwen3_vl_8b").
    path: local checkpoint dir or Hugging Face model id; null = build the tiny model from ``tiny``.
    tiny: TinyVLSizes of the tiny model (only with path null).
    dtype: "auto" | "float32" | "bfloat16" | "float16". auto: bfloat16 on CUDA and on a CPU with native bf16
        matmuls (x86 avx512_bf16/amx_bf16, aarch64 bf16), float32 on other CPUs (rlkit.hardware). A train.py
        run resolves it once, before any build (rlkit.run.resolve_policy_dtype); a config that reaches
        load_policy with "auto" (scripts, tests) resolves it here, the same way.
    device: "auto" (cuda if available else cpu) | "cpu" | "cuda" | "cuda:N".
    attn_implementation: "sdpa" | "eager" | "flash_attention_2" (needs the flash-attn package). On CPU,
        "sdpa" runs the language model's small causal attention calls (decode steps, short prompts and
        completions, at most 256 x 256 scores a head) as a plain matmul-softmax-matmul
        (rlkit.policy.attention), which is faster there than the CPU flash kernel; the rest is sdpa.
    seed: seed of the tiny build and of the LoRA init.
    lora: LoraSettings (enabled false = full fine-tuning).
    image_min_pixels / image_max_pixels: override the image processor's resize bounds (pixels);
        null keeps the checkpoint's.
    gradient_checkpointing: recompute activations in backward (large models).
    cache_dir: where the tiny build is cached (null: $RLKIT_CACHE_DIR/tiny_vl or ~/.cache/rlkit/tiny_vl).
    """

    name: str = "tiny_vl"
    path: str | None = None
    tiny: TinyVLSizes | None = None
    dtype: str = "auto"
    device: str = "auto"
    attn_implementation: str = "sdpa"
    seed: int = 0
    lora: LoraSettings = field(default_factory=LoraSettings)
    image_min_pixels: int | None = None
    image_max_pixels: int | None = None
    gradient_checkpointing: bool = False
    cache_dir: str | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "PolicyConfig":
        """Build from a plain mapping (nested ``lora`` / ``tiny`` mappings), rejecting unknown keys.

        Raises: ValueError naming unknown keys (top level, ``lora.*`` or ``tiny.*``) or bad values.
        """
        values = dict(values)
        values.pop("_target_", None)
        _check_keys("policy", values, cls)
        if isinstance(values.get("lora"), Mapping):
            _check_keys("policy.lora", values["lora"], LoraSettings)
            lora = dict(values["lora"])
            if not isinstance(lora.get("target_modules", "all-linear"), str):
                lora["target_modules"] = list(lora["target_modules"])
            values["lora"] = LoraSettings(**lora)
        if isinstance(values.get("tiny"), Mapping):
            _check_keys("policy.tiny", values["tiny"], TinyVLSizes)
            tiny = dict(values["tiny"])
            if "deepstack_indexes" in tiny:
                tiny["deepstack_indexes"] = list(tiny["deepstack_indexes"])
            values["tiny"] = TinyVLSizes(**tiny)
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError naming the field for an invalid value."""
        if self.dtype not in DTYPES:
            resolve_dtype(self.dtype, "cpu")  # raises, naming the allowed values
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"policy.device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        if self.attn_implementation not in ("sdpa", "eager", "flash_attention_2"):
            raise ValueError(f"policy.attn_implementation={self.attn_implementation!r}: expected sdpa, eager or flash_attention_2")
        if self.path is None and self.tiny is None:
            raise ValueError("policy.path is null and policy.tiny is missing: set one (a checkpoint, or tiny sizes)")
        if self.path is not None and self.tiny is not None:
            raise ValueError("policy.path and policy.tiny are both set: tiny sizes apply only to a built tiny model")
        self.lora.validate()
        if self.tiny is not None:
            self.tiny.validate()

    def resolve_device(self) -> torch.device:
        """"auto" -> cuda if torch sees a GPU, else cpu."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        """"auto" -> bfloat16 on CUDA and on a CPU with native bf16 matmuls, float32 on other CPUs
        (rlkit.hardware.resolve_dtype_here). bfloat16 on a CPU without native bf16 matmuls is allowed but
        logged as slow: there it is emulated (about 10x slower than float32 on an AVX2-only CPU), while a CPU
        with avx512_bf16 runs the tiny policy's warm-start step 1.6x faster than float32
        (bench/bench_sft.py; docs/speed.md)."""
        name, _ = resolve_dtype_here(self.dtype, device.type)
        if self.dtype == "bfloat16" and device.type == "cpu" and not this_cpu_has_native_bf16():
            log.warning("policy.dtype=bfloat16 on a CPU without native bf16 matmuls (no avx512_bf16/AMX): "
                        "it runs, emulated and slower than float32; set policy.dtype=auto (float32 here) or "
                        "policy.dtype=float32 on this machine")
        return _DTYPES[name]


def _check_keys(where: str, values: Mapping[str, Any], cls) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; known: {sorted(known)}")


class Policy:
    """A vision-language policy: model (+ LoRA), tokenizer, processor and token-level chat format.

    Attributes:
        config: the PolicyConfig. model: the trainable module (a PeftModel with LoRA, else the HF
        model). hf_model: the underlying Hugging Face model. tokenizer, processor (image-only
        Qwen3VLProcessor), chat (ChatFormat). device, dtype. checkpoint: resolved checkpoint path/id.
        banned_token_ids: ids never sampled (pass them to compute_logprobs).
        vocab_size: rows of the output layer (>= len(tokenizer)).
    """

    def __init__(self, config: PolicyConfig, model: nn.Module, processor, checkpoint: str) -> None:
        self.config = config
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.chat = ChatFormat(processor.tokenizer, processor.image_processor)
        self.chat.check_template(processor.chat_template)
        self.checkpoint = checkpoint
        self.vocab_size = int(unwrap_model(model).get_output_embeddings().weight.shape[0])
        self.banned_token_ids = self.chat.banned_token_ids(self.vocab_size)
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype

    @property
    def hf_model(self) -> nn.Module:
        return unwrap_model(self.model)

    @property
    def is_lora(self) -> bool:
        return is_peft_model(self.model)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters with requires_grad (LoRA tensors, or all weights when full fine-tuning)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def num_parameters(self) -> dict[str, int]:
        """{"vision", "text", "total", "trainable"} parameter counts (text includes lm_head)."""
        vis = txt = 0
        for name, p in self.hf_model.named_parameters():
            if "lora_" in name:
                continue
            if ".visual." in f".{name}":
                vis += p.numel()
            else:
                txt += p.numel()
        return {"vision": vis, "text": txt, "total": vis + txt, "trainable": sum(p.numel() for p in self.trainable_parameters())}

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """Context in which ``self.model`` computes the reference policy (LoRA adapter disabled).

        Yields the model. Raises RuntimeError with full fine-tuning (there is no frozen base to
        fall back to; use a KL coefficient of 0, or LoRA).
        """
        if not self.is_lora:
            raise RuntimeError(
                f"policy {self.config.name}: the reference policy is the base model with the LoRA adapter "
                "disabled, but lora.enabled=false (full fine-tuning); set algorithm.kl_coef=0 or enable LoRA"
            )
        with self.model.disable_adapter():
            yield self.model

    def compute_logprobs(self, batch, temperature: float = 1.0, with_entropy: bool = True,
                         shared_prefix: bool = False, uniform_forwards: bool = False):
        """rlkit.policy.logprobs.compute_logprobs with this policy's model and banned ids; with
        ``shared_prefix``, compute_logprobs_shared_prefix (each group's common prefix runs once;
        ``batch`` must then be a list of sequences; ``uniform_forwards``: see there)."""
        from rlkit.policy.logprobs import compute_logprobs
        from rlkit.policy.shared_prefix import compute_logprobs_shared_prefix

        if shared_prefix:
            return compute_logprobs_shared_prefix(self.model, batch, temperature, self.banned_token_ids,
                                                  with_entropy=with_entropy, uniform_forwards=uniform_forwards)
        return compute_logprobs(self.model, batch, temperature, self.banned_token_ids, with_entropy=with_entropy)

    def logprobs(self, sequences, temperature: float = 1.0, with_entropy: bool = True, shared_prefix: bool = False,
                 uniform_forwards: bool = False):
        """Alias of compute_logprobs (sequences: Trajectories, PromptInputs or a SequenceBatch)."""
        return self.compute_logprobs(sequences, temperature, with_entropy=with_entropy, shared_prefix=shared_prefix,
                                     uniform_forwards=uniform_forwards)

    def save_adapter(self, path: str | os.PathLike, version: int | None = None) -> AdapterInfo:
        """Save the LoRA adapter (standard PEFT format, atomic); see rlkit.policy.lora.save_adapter."""
        return save_adapter(self.model, path, version=version, base_model=self.checkpoint)

    def load_adapter(self, path: str | os.PathLike) -> AdapterInfo:
        """Hot-swap a saved adapter into the live model; see rlkit.policy.lora.load_adapter_inplace."""
        return load_adapter_inplace(self.model, path)

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Save a full checkpoint (LoRA merged) + processor; loadable as ``policy.path`` later."""
        return save_full_model(self.model, out_dir, processor=self.processor)


def _check_hub_reachable(name: str, repo_id: str) -> None:
    """Fail at once, not after huggingface_hub's ~30 s of retries, when a hub id is neither in the
    local HF cache nor reachable: the hub's host name does not resolve (no network / no DNS).

    Raises: PolicyLoadError (the same message as any other hub failure) in that case.
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE:
        return  # transformers reads the cache without network calls and fails fast itself
    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return
    except Exception:  # noqa: BLE001 - a malformed repo id: let from_pretrained report it
        return
    host = urlparse(constants.ENDPOINT).hostname
    if not host:
        return
    try:
        socket.getaddrinfo(host, 443)
    except OSError as err:
        raise _hub_error(name, repo_id, OSError(f"{repo_id} is not in the HF cache and {host} does not "
                                                f"resolve ({err})")) from None


def _hub_error(name: str, ident: str, err: Exception) -> PolicyLoadError:
    return PolicyLoadError(
        f"policy {name}: cannot load checkpoint {ident!r} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
        f"Fix: set policy.path to a local checkpoint directory (e.g. a downloaded {ident} or a VisGym SFT "
        f"checkpoint), or pre-download it into the Hugging Face cache (HF_HOME) on a machine with network "
        f"(`hf download {ident}`) and run with HF_HUB_OFFLINE=1. Models of this size also need a "
        f"CUDA GPU; on a CPU machine use policy=tiny_vl."
    )


def _estimate_params(cfg) -> int:
    """Rough parameter count from a Qwen-VL config (text decoder + embeddings + vision tower)."""
    t = getattr(cfg, "text_config", cfg)
    h, n_layers, inter, vocab = t.hidden_size, t.num_hidden_layers, t.intermediate_size, t.vocab_size
    head_dim = getattr(t, "head_dim", None) or h // t.num_attention_heads
    attn = h * head_dim * (2 * t.num_attention_heads + 2 * t.num_key_value_heads)
    text = n_layers * (attn + 3 * h * inter) + 2 * vocab * h
    v = getattr(cfg, "vision_config", None)
    vision = 0 if v is None else v.depth * (4 * v.hidden_size**2 + 2 * v.hidden_size * v.intermediate_size)
    return int(text + vision)


def load_policy(
    name: str = "tiny_vl",
    path: str | None = None,
    tiny: Mapping[str, Any] | TinyVLSizes | None = None,
    dtype: str = "auto",
    device: str = "auto",
    attn_implementation: str = "sdpa",
    seed: int = 0,
    lora: Mapping[str, Any] | LoraSettings | None = None,
    image_min_pixels: int | None = None,
    image_max_pixels: int | None = None,
    gradient_checkpointing: bool = False,
    cache_dir: str | None = None,
    base_path: str | None = None,
    train_mode: str | None = None,
) -> Policy:
    """Load (or build) a policy; the ``_target_`` of conf/policy/*.yaml.

    Keyword arguments are the PolicyConfig fields (see there); nested ``tiny`` / ``lora`` may be
    mappings (Hydra DictConfig) and unknown nested keys raise. The same function loads the tiny
    model, a local checkpoint directory and Qwen/Qwen3-VL-2B/8B-Instruct.

    Two run-time arguments (passed by the training code, not written in the YAML):
        base_path: a full checkpoint to start from instead of ``path`` / ``tiny`` (e.g. the SFT
            warm start's output); None keeps the config's.
        train_mode: "lora" (adapter on, ``lora.enabled`` forced true) or "full" (full fine-tuning,
            no adapter); None keeps ``lora.enabled``.

    Returns: Policy on the resolved device, in train mode.

    Raises:
        ValueError: invalid or unknown config values (naming the key).
        PolicyLoadError: checkpoint not reachable (offline / not cached / wrong path), or a model
            over MAX_CPU_PARAMS on a machine without CUDA; the message names the model and the fix.
    """
    values = dict(
        name=name, path=path, tiny=tiny, dtype=dtype, device=device, attn_implementation=attn_implementation,
        seed=seed, lora=lora if lora is not None else LoraSettings(), image_min_pixels=image_min_pixels,
        image_max_pixels=image_max_pixels, gradient_checkpointing=gradient_checkpointing, cache_dir=cache_dir,
    )
    if isinstance(values["lora"], LoraSettings):
        values["lora"] = asdict(values["lora"])
    if isinstance(values["tiny"], TinyVLSizes):
        values["tiny"] = asdict(values["tiny"])
    if base_path is not None:
        values["path"], values["tiny"] = str(base_path), None
    if train_mode is not None:
        if train_mode not in ("lora", "full"):
            raise ValueError(f"train_mode={train_mode!r}: expected 'lora' or 'full'")
        values["lora"] = {**dict(values["lora"]), "enabled": train_mode == "lora"}
    config = PolicyConfig.from_dict(values)
    return load_policy_from_config(config)


def load_policy_from_config(config: PolicyConfig) -> Policy:
    """load_policy for an already-built PolicyConfig (same behaviour and errors)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config.validate()
    device = config.resolve_device()
    dtype = config.resolve_dtype(device)
    if config.path is None:
        ckpt = str(tiny_checkpoint(config.tiny, seed=config.seed, cache_dir=config.cache_dir))
    else:
        ckpt = os.path.expanduser(config.path)
        looks_local = os.path.isabs(ckpt) or ckpt.startswith(".") or ckpt.count("/") != 1
        if looks_local and not os.path.isdir(ckpt):
            raise PolicyLoadError(
                f"policy {config.name}: checkpoint directory {ckpt!r} does not exist. Fix: point policy.path at a "
                "directory saved with save_pretrained (config.json, weights, tokenizer, preprocessor_config.json)."
            )
        if not looks_local:
            _check_hub_reachable(config.name, ckpt)
    try:
        hf_config = AutoConfig.from_pretrained(ckpt)
    except Exception as err:  # OSError offline / 404, ValueError bad repo id, hub errors
        raise _hub_error(config.name, ckpt, err) from err
    if device.type == "cpu" and _estimate_params(hf_config) > MAX_CPU_PARAMS:
        raise PolicyLoadError(
            f"policy {config.name}: {ckpt} has ~{_estimate_params(hf_config) / 1e9:.1f}B parameters and no CUDA GPU "
            "is available (device resolved to cpu). Fix: run on a GPU machine (policy.device=cuda), or use "
            "policy=tiny_vl on CPU."
        )
    try:
        processor = load_processor(ckpt, min_pixels=config.image_min_pixels, max_pixels=config.image_max_pixels)
        model = AutoModelForImageTextToText.from_pretrained(
            ckpt,
            dtype=dtype,
            attn_implementation=config.attn_implementation,
            device_map={"": str(device)} if device.type == "cuda" else None,
        )
    except OSError as err:
        raise _hub_error(config.name, ckpt, err) from err
    model.to(device)
    if device.type == "cpu" and config.attn_implementation == "sdpa":
        # small causal attention calls skip the CPU flash kernel, slow for short query blocks; the rest is sdpa
        from rlkit.policy.attention import register

        model.set_attn_implementation(register())
    if not hasattr(model, "model") or not hasattr(model.model, "get_rope_index"):
        raise PolicyLoadError(f"policy {config.name}: {ckpt} is a {type(model).__name__}, not a Qwen-VL model")
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.lora.enabled:
            model.enable_input_require_grads()
    if config.lora.enabled:
        model = apply_lora(model, config.lora, seed=config.seed)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    model.train()
    policy = Policy(config, model, processor, checkpoint=ckpt)
    # a frozen vision tower encodes each image once per weight version (exact; bypassed while it trains)
    from rlkit.policy.vision_cache import install_vision_cache

    policy.vision_cache = install_vision_cache(model)
    return policy
