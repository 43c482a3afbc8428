"""LoRA through peft: build, save (standard PEFT format), hot-swap, merge/export.

Adapters are saved exactly as ``PeftModel.save_pretrained`` writes them (adapter_config.json +
adapter_model.safetensors, keys ``base_model.model.<module>.lora_{A,B}.weight``), which is what
``PeftModel.from_pretrained`` and vLLM's ``--lora-modules`` / ``LoRARequest`` read, plus one extra
file, ``rlkit_adapter.json`` (version, sha256 of the weights file), that both ignore. Saves never
expose a partial adapter: the new directory is written beside the target and renamed into place
(when replacing an existing one, the name is absent for the instant between two renames, so
publishers that need a reader-safe swap write each version to its own directory).

"all-linear" targets every ``nn.Linear`` of the *language model* (q/k/v/o and gate/up/down
projections for Qwen3-VL), not the vision tower (unless ``include_vision``) and never ``lm_head``.
PEFT's own "all-linear" would also adapt the vision tower and merger; vLLM serves LoRA on the
language model of Qwen-VL models, so the default stays there. Names are written as plain module
names (e.g. ``["down_proj", ..., "v_proj"]``) so vLLM can match them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_META = "rlkit_adapter.json"


@dataclass
class LoraSettings:
    """LoRA hyperparameters (what conf/policy/*.yaml ``lora:`` holds).

    enabled: False = full fine-tuning (no adapter; every weight trainable).
    rank, alpha: LoRA r and lora_alpha (scale alpha / rank). dropout: lora_dropout (keep 0.0 for RL:
        with dropout the training forward is not the sampling forward).
    target_modules: "all-linear" (language-model linears, see module doc) or a list of module
        names / a regex string, passed to peft as is.
    include_vision: with "all-linear", also adapt the vision tower's linears (never lm_head, never the Conv3d patch
        embedding that shares the leaf name ``proj``: ``excluded_modules``).
    exclude_modules: None, or module names / a regex string peft must leave alone although a target matches them
        (peft's ``LoraConfig.exclude_modules``, passed as is); "all-linear" adds ``excluded_modules`` to them. An
        adapter's saved config records what it excluded, so a model rebuilt from that config (scripts/eval.py)
        gets exactly the adapter's modules.
    """

    enabled: bool = True
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: Any = "all-linear"
    include_vision: bool = False
    exclude_modules: Any = None

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        if self.enabled and self.rank < 1:
            raise ValueError(f"lora.rank={self.rank} must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout={self.dropout} must be in [0, 1)")
        if not (isinstance(self.target_modules, str) or isinstance(self.target_modules, (list, tuple))):
            raise ValueError(f"lora.target_modules must be 'all-linear', a list of names or a regex, got {self.target_modules!r}")
        if self.exclude_modules is not None and not isinstance(self.exclude_modules, (str, list, tuple)):
            raise ValueError(f"lora.exclude_modules must be null, a list of module names or a regex, "
                             f"got {self.exclude_modules!r}")


@dataclass
class AdapterInfo:
    """What an adapter directory holds / what was loaded from it.

    path: adapter directory. version: the version recorded at save (e.g. the training step), or None.
    sha256: digest of adapter_model.safetensors. num_tensors / num_params: LoRA tensors and scalars.
    """

    path: str
    version: int | None
    sha256: str
    num_tensors: int
    num_params: int
    extra: dict = field(default_factory=dict)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model under a PeftModel / DDP wrapper (same object for a plain model)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model.get_base_model()
    if hasattr(model, "module") and isinstance(model.module, nn.Module):
        return unwrap_model(model.module)
    return model


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is wrapped by peft (``peft.PeftModel``: it carries a LoRA adapter)."""

    from peft import PeftModel

    return isinstance(model, PeftModel)


def resolve_target_modules(model: nn.Module, settings: LoraSettings) -> list[str] | str:
    """Turn ``settings.target_modules`` into what peft's ``LoraConfig.target_modules`` takes.

    "all-linear": the sorted leaf names of the ``nn.Linear`` modules under the language model
    (``*.language_model.*``), plus those under the vision tower (``*.visual.*``) if
    ``include_vision``; ``lm_head`` never. If a leaf name also occurs in a part that must stay
    frozen, a full-name regex is returned instead so peft cannot match it there.

    Raises:
        ValueError: the model has no ``language_model`` submodule (not a Qwen-VL-style model).
    """
    if settings.target_modules != "all-linear":
        return list(settings.target_modules) if not isinstance(settings.target_modules, str) else settings.target_modules
    lm_names: dict[str, str] = {}
    vis_names: dict[str, str] = {}
    other_names: dict[str, str] = {}
    for name, mod in unwrap_model(model).named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if ".language_model." in f".{name}" and leaf != "lm_head":
            lm_names.setdefault(leaf, name)
        elif ".visual." in f".{name}":
            vis_names.setdefault(leaf, name)
        else:
            other_names.setdefault(leaf, name)
    if not lm_names:
        raise ValueError("lora.target_modules='all-linear' found no nn.Linear under a 'language_model' module")
    chosen = set(lm_names) | (set(vis_names) if settings.include_vision else set())
    frozen = set(other_names) | (set() if settings.include_vision else set(vis_names))
    if chosen & frozen:
        parts = ["language_model"] + (["visual"] if settings.include_vision else [])
        leaves = "|".join(sorted(re.escape(n) for n in chosen))
        return rf"^(?:.*\.)?(?:{'|'.join(parts)})\..*\.(?:{leaves})$"
    return sorted(chosen)


def excluded_modules(model: nn.Module, targets: list[str] | str) -> list[str]:
    """The modules a target list of leaf names would also reach though they are not ``nn.Linear``: for Qwen3-VL with
    the vision tower's ``proj``, the Conv3d patch embedding ``model.visual.patch_embed.proj``, which vLLM never
    applies LoRA to (an adapter with it cannot be served or sampled by vLLM). Passed to peft as ``exclude_modules``
    (full module names), so "all-linear" means linears only, as peft's own "all-linear" does.

    Returns: the full names, sorted; [] for a string (regex) target or when nothing clashes.
    """
    if isinstance(targets, str):
        return []
    leaves = set(targets)
    return sorted(name for name, mod in unwrap_model(model).named_modules()
                  if name and name.rsplit(".", 1)[-1] in leaves and not isinstance(mod, nn.Linear)
                  and any(True for _ in mod.parameters(recurse=False)))


def apply_lora(model: nn.Module, settings: LoraSettings, seed: int = 0):
    """Wrap ``model`` with a fresh LoRA adapter named "default" (peft ``get_peft_model``).

    LoRA A is initialised from torch's RNG forked and seeded with ``seed`` (B = 0, so the wrapped
    model computes exactly the base model until trained). Only LoRA parameters are trainable.

    Returns: the PeftModel (task_type CAUSAL_LM).
    Raises: ValueError for settings out of range (LoraSettings.validate), and for ``exclude_modules`` given as a
    regex with "all-linear", which must add module names of its own (``excluded_modules``).
    """
    from peft import LoraConfig, get_peft_model

    settings.validate()
    targets = resolve_target_modules(model, settings)
    cfg = LoraConfig(
        r=int(settings.rank),
        lora_alpha=float(settings.alpha),
        lora_dropout=float(settings.dropout),
        target_modules=targets,
        exclude_modules=_exclude_modules(model, settings, targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, cfg)
    return peft_model


def _exclude_modules(model: nn.Module, settings: LoraSettings, targets: list[str] | str) -> list[str] | str | None:
    """peft's ``exclude_modules`` for ``settings``: its own (a regex string as is, names as a list), plus for
    "all-linear" the non-linear modules its leaf names reach (``excluded_modules``); None when there is none."""
    own = settings.exclude_modules
    auto = excluded_modules(model, targets) if settings.target_modules == "all-linear" else []
    if isinstance(own, str):
        if auto:
            raise ValueError(f"lora.exclude_modules={own!r} is a regex, and target_modules=all-linear must also exclude "
                             f"{auto}: give exclude_modules as a list of module names")
        return own
    names = sorted(set(own or ()) | set(auto))
    return names or None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def umask_permissions(directory: Path) -> None:
    """Give ``directory`` and everything under it the modes a plain mkdir/open would have under the
    process umask (tempfile.mkdtemp makes 0700 directories, which other users of a shared filesystem,
    e.g. rollout workers or a server on /shared, could not read)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for p in Path(directory).rglob("*"):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


def _atomic_dir_write(path: Path, write) -> None:
    """Write a directory via ``write(tmp_dir)`` then move it to ``path`` (replacing an old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        write(tmp)
        umask_permissions(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}-{id(tmp)}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_adapter(model, path: str | os.PathLike, version: int | None = None, base_model: str | None = None) -> AdapterInfo:
    """Save the active LoRA adapter of ``model`` in standard PEFT format, atomically.

    Writes adapter_config.json + adapter_model.safetensors (``PeftModel.save_pretrained``) and
    rlkit_adapter.json ({"version", "sha256", "base_model"}). An existing adapter at ``path`` is
    replaced only once the new one is complete.

    Args:
        model: a PeftModel. path: the adapter directory. version: e.g. the training step.
        base_model: recorded in adapter_config.json's base_model_name_or_path (None keeps peft's).

    Returns: AdapterInfo of what was written.
    Raises: TypeError if ``model`` has no LoRA adapter (full fine-tuning: use save_full_model).
    """
    if not is_peft_model(model):
        raise TypeError("save_adapter needs a LoRA (peft) model; with lora.enabled=false save the full model")
    path = Path(path)

    def _write(tmp: Path) -> None:
        if base_model is not None:
            for cfg in model.peft_config.values():
                cfg.base_model_name_or_path = base_model
        model.save_pretrained(str(tmp), safe_serialization=True)
        digest = _file_sha256(tmp / ADAPTER_WEIGHTS)
        meta = {"version": version, "sha256": digest, "base_model": base_model}
        (tmp / ADAPTER_META).write_text(json.dumps(meta, indent=2))

    _atomic_dir_write(path, _write)
    return read_adapter_info(path)


def adapter_payload(model, base_model: str | None = None, adapter_name: str = "default") -> tuple[dict, dict]:
    """The live adapter as rlkit.sync.publish_adapter takes it: ({``base_model.model.<module>.lora_A.weight``: CPU
    tensor}, PEFT's saved layout, what ``save_pretrained`` writes) and its LoraConfig as a dict (inference mode,
    ``base_model_name_or_path`` = ``base_model`` when given), as the Ray trainer ranks publish it.

    Raises: TypeError if ``model`` is not a PeftModel."""
    import copy

    from peft.utils import get_peft_model_state_dict

    if not is_peft_model(model):
        raise TypeError("adapter_payload needs a LoRA (peft) model")
    tensors = {k: v.detach().to("cpu", copy=True) for k, v in
               get_peft_model_state_dict(model, adapter_name=adapter_name).items()}
    cfg = copy.deepcopy(model.peft_config[adapter_name])
    cfg.inference_mode = True
    if base_model is not None:
        cfg.base_model_name_or_path = base_model
    return tensors, cfg.to_dict()


def read_adapter_info(path: str | os.PathLike) -> AdapterInfo:
    """AdapterInfo of an adapter directory (version from rlkit_adapter.json when present).

    Raises: FileNotFoundError naming the missing file.
    """
    from safetensors import safe_open

    path = Path(path)
    weights = path / ADAPTER_WEIGHTS
    for f in (path / ADAPTER_CONFIG, weights):
        if not f.exists():
            raise FileNotFoundError(f"adapter file {f} not found (a PEFT adapter dir has {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    meta = json.loads((path / ADAPTER_META).read_text()) if (path / ADAPTER_META).exists() else {}
    n_tensors = n_params = 0
    with safe_open(str(weights), framework="pt") as f:
        for k in f.keys():
            n_tensors += 1
            shape = f.get_slice(k).get_shape()
            n = 1
            for s in shape:
                n *= int(s)
            n_params += n
    return AdapterInfo(
        path=str(path),
        version=meta.get("version"),
        sha256=_file_sha256(weights),
        num_tensors=n_tensors,
        num_params=n_params,
        extra={k: v for k, v in meta.items() if k not in ("version", "sha256")},
    )


def load_adapter_inplace(model, path: str | os.PathLike, adapter_name: str = "default") -> AdapterInfo:
    """Hot-swap the weights of a saved adapter into a live PeftModel (no rebuild, no re-wrap).

    Loads adapter_model.safetensors onto the device of the model and writes it into the existing
    LoRA tensors with peft's ``set_peft_model_state_dict`` (what ``PeftModel.load_adapter`` does
    after building the layers). Then verifies: rank/alpha/targets match the live adapter, every
    LoRA tensor of the model was overwritten and no key was left over, each loaded tensor equals
    the file's (cast to the parameter dtype), and the file digest matches rlkit_adapter.json if present.

    Returns: AdapterInfo of what is now live.
    Raises:
        TypeError: ``model`` is not a PeftModel.
        FileNotFoundError: missing adapter files.
        ValueError: incompatible adapter (rank, alpha, target modules, tensor keys or shapes) or a
            digest mismatch (a torn or tampered write).
    """
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    if not is_peft_model(model):
        raise TypeError("load_adapter_inplace needs a LoRA (peft) model")
    path = Path(path)
    info = read_adapter_info(path)
    meta_file = path / ADAPTER_META
    expected = json.loads(meta_file.read_text()).get("sha256") if meta_file.exists() else None
    if expected is not None and expected != info.sha256:
        raise ValueError(f"adapter {path}: {ADAPTER_WEIGHTS} sha256 {info.sha256[:12]} != recorded {expected[:12]}")
    new_cfg = json.loads((path / ADAPTER_CONFIG).read_text())
    live = model.peft_config[adapter_name]
    checks = {
        "r": (int(new_cfg.get("r")), int(live.r)),
        "lora_alpha": (float(new_cfg.get("lora_alpha")), float(live.lora_alpha)),
        "target_modules": (_norm_targets(new_cfg.get("target_modules")), _norm_targets(live.target_modules)),
    }
    bad = {k: v for k, v in checks.items() if v[0] != v[1]}
    if bad:
        raise ValueError(f"adapter {path} does not fit the live adapter (file vs live): {bad}; rebuild the policy instead")
    device = next(p.device for p in model.parameters())
    state = load_peft_weights(str(path), device=str(device))
    result = set_peft_model_state_dict(model, state, adapter_name=adapter_name)
    unexpected = [k for k in result.unexpected_keys if "lora_" in k]
    missing = [k for k in result.missing_keys if "lora_" in k and f".{adapter_name}." in k]
    if unexpected or missing:
        raise ValueError(f"adapter {path}: keys not in the model {unexpected[:3]}, model LoRA keys not in the file {missing[:3]}")
    params = dict(model.named_parameters())
    n = 0
    for key, tensor in state.items():
        name = live_key(key, adapter_name)
        p = params.get(name)
        if p is None:
            raise ValueError(f"adapter {path}: loaded key {key} has no live parameter {name}")
        if not torch.equal(p.detach(), tensor.to(device=p.device, dtype=p.dtype)):
            raise ValueError(f"adapter {path}: parameter {name} differs from the file after loading")
        n += 1
    if n != info.num_tensors:
        raise ValueError(f"adapter {path}: verified {n} tensors, file holds {info.num_tensors}")
    return info


def live_key(saved_key: str, adapter_name: str) -> str:
    """``...q_proj.lora_A.weight`` (saved) -> ``...q_proj.lora_A.<adapter>.weight`` (live)."""
    for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"):
        token = f".{part}."
        if token in saved_key:
            head, tail = saved_key.split(token, 1)
            return f"{head}.{part}.{adapter_name}.{tail}"
    return saved_key


def _norm_targets(t) -> Any:
    if t is None or isinstance(t, str):
        return t
    return sorted(t)


def lora_state_dict(model) -> dict[str, torch.Tensor]:
    """The active adapter's tensors as peft saves them (keys without the adapter name), on CPU."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().to("cpu").clone() for k, v in get_peft_model_state_dict(model).items()}


def merged_model(model) -> nn.Module:
    """A plain Hugging Face model with the LoRA delta merged into the base weights (a copy; the
    live ``model`` keeps its adapter). For a non-peft model, the model itself."""
    if not is_peft_model(model):
        return model
    return copy.deepcopy(model).merge_and_unload()


def save_full_model(model, out_dir: str | os.PathLike, processor=None) -> Path:
    """Save a full checkpoint (LoRA merged if any) with ``save_pretrained``, atomically.

    The directory loads like any Hugging Face checkpoint (and as ``policy.path`` of a later run,
    e.g. the SFT stage's output becoming the GRPO base). ``processor`` (tokenizer + image
    processor + chat template) is saved alongside when given.
    """
    out = Path(out_dir)
    full = merged_model(model)

    def _write(tmp: Path) -> None:
        full.save_pretrained(str(tmp), safe_serialization=True)
        if processor is not None:
            processor.save_pretrained(str(tmp))

    _atomic_dir_write(out, _write)
    return out
