"""What the server hosts: one base policy with several LoRA adapters loaded side by side.

Adapters are found from what a run writes (docs/running.md, "What a run writes"):

    <adapter dir>                 a PEFT adapter (adapter_config.json + adapter_model.safetensors)
    <run dir>                     its final ``adapter/``; while the run has none yet, the adapter of
                                  its latest complete checkpoint
    <run dir>/latest, <run dir>/checkpoints[/latest]   the latest complete checkpoint's ``adapter/``
    <run dir>/checkpoints/step_000040                    that checkpoint's ``adapter/``

("latest" is resolved with rlkit.checkpoint.find_latest, which verifies the checkpoint's manifest.)

The base model is the one the adapters were trained on: ``adapter_config.json`` records it
(``base_model_name_or_path``, the SFT warm-start checkpoint or the hub id). An explicit base that
differs from the recorded one is refused unless allowed, because an adapter on the wrong base
answers without error and wrongly.

Several adapters, one model: every adapter is loaded into one ``peft.PeftModel`` under its own
name (``PeftModel.load_adapter``), and a request selects its adapter with ``set_adapter`` (or
``disable_adapter`` for the base) right before generating. ``ModelHost.generate`` must only be called
from one thread at a time (the server runs it on a single model worker thread), which makes the
select-then-generate pair atomic; swapping weights in place would need the same serialisation
and costs a copy per switch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlkit.policy.lora import live_key

log = logging.getLogger(__name__)

#: Served model names: what the ``model`` field of a request may hold.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}\Z")


class AdapterError(ValueError):
    """An adapter could not be found, resolved or loaded; the message names it and the fix."""


@dataclass
class AdapterSpec:
    """An adapter to serve: its served ``name``, the resolved adapter directory ``path``, what the
    user gave (``source``) and the run directory it belongs to, if any (``run_dir``, holding .hydra/)."""

    name: str
    path: Path
    source: str
    run_dir: Path | None = None

    def config(self) -> dict[str, Any]:
        """adapter_config.json as a dict."""
        return json.loads((self.path / "adapter_config.json").read_text())

    def recorded_base(self) -> str | None:
        """``base_model_name_or_path`` of adapter_config.json (None when empty)."""
        return self.config().get("base_model_name_or_path") or None

    def rank(self) -> int:
        """LoRA rank r of the adapter."""
        return int(self.config().get("r", 0))


def _is_adapter_dir(p: Path) -> bool:
    return (p / "adapter_config.json").is_file()


def _latest_adapter(ckpt_root: Path, source: str) -> Path:
    from rlkit.checkpoint import find_latest

    ck = find_latest(ckpt_root)
    if ck is None:
        raise AdapterError(f"adapter {source!r}: {ckpt_root} holds no complete checkpoint (none verifies against its "
                           "manifest); point at an adapter directory or a run with a finished checkpoint")
    if not _is_adapter_dir(ck / "adapter"):
        raise AdapterError(f"adapter {source!r}: latest checkpoint {ck} has no adapter/ (a full fine-tuning run?); "
                           "serve its model with --base instead")
    return ck / "adapter"


def _run_dir_of(p: Path) -> Path | None:
    for d in (p, *p.parents):
        if (d / ".hydra").is_dir():
            return d
        if d.parent == d:
            break
    return None


def resolve_adapter_dir(source: str | os.PathLike) -> tuple[Path, Path | None]:
    """Resolve what the user named (see the module doc) to (adapter directory, run directory or None).

    Raises: AdapterError naming the path and what was expected there.
    """
    src = str(source)
    p = Path(os.path.expanduser(src))
    if p.name == "latest" and not p.is_dir():
        parent = p.parent
        root = parent / "checkpoints" if (parent / "checkpoints").is_dir() else parent
        path = _latest_adapter(root, src)
    elif _is_adapter_dir(p):
        path = p
    elif _is_adapter_dir(p / "adapter"):
        path = p / "adapter"
    elif (p / "checkpoints").is_dir():
        path = _latest_adapter(p / "checkpoints", src)
    elif p.is_dir() and ((p / "latest").is_file() or any(c.name.startswith("step_") for c in p.iterdir())):
        path = _latest_adapter(p, src)
    elif not p.exists():
        raise AdapterError(f"adapter {src!r}: no such file or directory")
    else:
        raise AdapterError(
            f"adapter {src!r}: not an adapter directory (adapter_config.json + adapter_model.safetensors), a run "
            "directory (with adapter/ or checkpoints/) or a checkpoints directory"
        )
    if not (path / "adapter_model.safetensors").is_file():
        raise AdapterError(f"adapter {src!r}: {path} has no adapter_model.safetensors")
    return path.resolve(), _run_dir_of(path.resolve())


def _default_name(source: str, path: Path, run_dir: Path | None) -> str:
    if run_dir is not None:
        name = run_dir.name
    else:
        name = path.name if path.name != "adapter" else path.parent.name
    name = re.sub(r"[^A-Za-z0-9._:/+-]", "-", name).strip("-") or "adapter"
    return name if name[0].isalnum() else f"a{name}"


def parse_adapter_arg(arg: str) -> AdapterSpec:
    """``NAME=PATH`` or ``PATH`` (name: the run directory's name, else the adapter directory's).

    Raises: AdapterError for an invalid name or an unresolvable path.
    """
    name = None
    if "=" in arg and not Path(os.path.expanduser(arg)).exists():
        name, arg = arg.split("=", 1)
        if not NAME_RE.match(name):
            raise AdapterError(f"adapter name {name!r}: use letters, digits and . _ : / + - (at most 128 characters)")
    path, run_dir = resolve_adapter_dir(arg)
    return AdapterSpec(name or _default_name(arg, path, run_dir), path, arg, run_dir)


def _norm_base(b: str) -> str:
    p = Path(os.path.expanduser(b))
    return str(p.resolve()) if p.exists() else b


def resolve_base(base: str | None, adapters: Sequence[AdapterSpec], allow_mismatch: bool = False,
                 must_exist: bool = True) -> str | None:
    """The base checkpoint to load: ``base`` if given, else the one the adapters recorded.

    Returns: a local path or hub id; None when neither is known (the policy config decides: its
    ``path`` or the tiny build).
    Raises: AdapterError when the adapters recorded different bases (and no ``base`` is given), when
    ``base`` differs from an adapter's recorded base and ``allow_mismatch`` is false, or when the
    recorded base is a local path that does not exist here (only with ``must_exist``: a command
    printed for another machine may name its paths).
    """
    recorded = {a.name: a.recorded_base() for a in adapters}
    if base is None:
        distinct = sorted({_norm_base(b) for b in recorded.values() if b})
        if len(distinct) > 1:
            raise AdapterError(f"the adapters were trained on different base models {recorded}; serve them from "
                               "separate servers, or pass --base (with --allow-base-mismatch) if they share weights")
        if not distinct:
            return None
        chosen = distinct[0]
        looks_local = os.path.isabs(chosen) or chosen.startswith(".") or chosen.count("/") != 1
        if must_exist and looks_local and not Path(chosen).exists():
            names = [n for n, b in recorded.items() if b]
            raise AdapterError(f"adapter(s) {names} were trained on base {chosen}, which does not exist on this "
                               "machine; pass --base <a copy of that checkpoint>")
        return chosen
    wanted = _norm_base(base)
    bad = {n: b for n, b in recorded.items() if b and _norm_base(b) != wanted}
    if bad and not allow_mismatch:
        raise AdapterError(f"--base {base} differs from the base the adapters were trained on {bad}; an adapter on "
                           "another base gives wrong answers. Drop --base to use the recorded one, or pass "
                           "--allow-base-mismatch if the weights are the same (e.g. a moved copy)")
    return base



@dataclass
class ServedAdapter:
    """An adapter loaded into the host's PeftModel under ``internal`` (peft's adapter name)."""

    spec: AdapterSpec
    internal: str
    info: Any  # rlkit.policy.lora.AdapterInfo


@dataclass
class ModelHost:
    """A loaded policy with its adapters, ready to generate.

    policy: rlkit Policy (its ``model`` is a PeftModel when adapters are loaded). base_name: the
    served name of the base (adapter disabled). adapters: served name -> ServedAdapter.
    max_model_len: prompt + completion limit (tokens). created: load time (unix seconds).
    """

    policy: Any
    base_name: str
    adapters: dict[str, ServedAdapter]
    max_model_len: int
    created: int
    engine: Any = None

    def __post_init__(self) -> None:
        from rlkit.policy import TransformersEngine

        if self.engine is None:
            self.engine = TransformersEngine(self.policy)

    @property
    def names(self) -> list[str]:
        """Served model names: the base first, then the adapters in load order."""
        return [self.base_name, *self.adapters]

    def fingerprint(self, name: str) -> str:
        """``system_fingerprint`` of a model: "base" or "<name>@<sha256[:12] of the adapter weights>"."""
        if name == self.base_name:
            return "base"
        return f"{name}@{self.adapters[name].info.sha256[:12]}"

    def model_card(self, name: str) -> dict[str, Any]:
        """One entry of ``GET /v1/models`` (OpenAI model object + vLLM's root/parent/max_model_len)."""
        if name == self.base_name:
            root, parent = self.policy.checkpoint, None
        else:
            root, parent = str(self.adapters[name].spec.path), self.base_name
        return {"id": name, "object": "model", "created": self.created, "owned_by": "rlkit", "root": root,
                "parent": parent, "max_model_len": self.max_model_len}

    @contextlib.contextmanager
    def _active(self, name: str):
        model = self.policy.model
        if name == self.base_name:
            if self.adapters:
                with model.disable_adapter():
                    yield
            else:
                yield
        else:
            model.set_adapter(self.adapters[name].internal)
            yield

    def generate(self, name: str, prompt_ids: list[int], image_inputs: list, sampling, on_token=None) -> list:
        """Sample ``sampling.n`` completions of one prompt with model ``name`` (base or an adapter).

        on_token: None, or ``on_token(sample_index, token_id, logprob)`` called on this thread as each token is
            sampled (rlkit.policy.TransformersEngine.generate's callback, for the one prompt; with
            ``sampling.top_logprobs`` > 0 a fourth argument, the step's rlkit.policy.TopLogprobs); an exception it
            raises ends the call.
        Not thread-safe: call from one thread at a time (see the module doc).
        Returns: list of rlkit.policy.Completion (with ``top_logprobs`` when ``sampling.top_logprobs`` > 0).
        Raises: KeyError for an unknown name.
        """
        from rlkit.policy import PromptInput
        from rlkit.policy.chat import concat_images

        if name != self.base_name and name not in self.adapters:
            raise KeyError(name)
        prompt = PromptInput(input_ids=list(prompt_ids), **concat_images(image_inputs))
        with self._active(name):
            if on_token is None:
                return self.engine.generate([prompt], sampling)[0]
            return self.engine.generate([prompt], sampling,
                                        on_token=lambda i, k, t, lp, *top: on_token(k, t, lp, *top))[0]


def _restore_file_values(model, spec: AdapterSpec, internal: str) -> None:
    """Give every live LoRA tensor of ``internal`` the file's values, in the dtype the tensor is kept in.

    PEFT (0.18) builds a second adapter's LoRA layers in the base model's dtype, copies the file into them and only
    then up-casts them to float32 (``autocast_adapter_dtype``): on a bfloat16 base a float32 adapter loaded second
    is served rounded to bfloat16, while the first one (``PeftModel.from_pretrained``) is exact. The LoRA forward
    computes in the LoRA weights' dtype, so this copy makes every adapter serve the values it was trained to, in
    whichever order it was loaded. Tensors that match no live parameter are left to ``_verify_loaded`` to refuse.
    """
    import torch
    from peft.utils import load_peft_weights

    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, tensor in load_peft_weights(str(spec.path), device="cpu").items():
            p = params.get(live_key(key, internal))
            if p is not None and p.shape == tensor.shape:
                p.copy_(tensor.to(device=p.device, dtype=p.dtype))


def _verify_loaded(model, spec: AdapterSpec, internal: str):
    """Check that every tensor of the adapter file is live under ``internal`` and equal to the file in the dtype the
    live tensor computes in (a float32 file on a bfloat16 LoRA layer is compared rounded to bfloat16, and the
    reverse exactly). Raises AdapterError naming the tensor."""
    import torch
    from peft.utils import load_peft_weights

    from rlkit.policy.lora import ADAPTER_META, read_adapter_info

    info = read_adapter_info(spec.path)
    meta = spec.path / ADAPTER_META
    expected = json.loads(meta.read_text()).get("sha256") if meta.is_file() else None
    if expected is not None and expected != info.sha256:
        raise AdapterError(f"adapter {spec.name} ({spec.path}): weights sha256 {info.sha256[:12]} != recorded "
                           f"{expected[:12]} (a torn or modified file)")
    params = dict(model.named_parameters())
    state = load_peft_weights(str(spec.path), device="cpu")
    for key, tensor in state.items():
        p = params.get(live_key(key, internal))
        if p is None:
            raise AdapterError(f"adapter {spec.name} ({spec.path}): tensor {key} matches no module of the base model; "
                               "was it trained on another base?")
        if not torch.equal(p.detach().cpu(), tensor.to(p.dtype)):
            raise AdapterError(f"adapter {spec.name}: tensor {key} differs from the file after loading")
    live = sum(1 for n in params if f".{internal}." in n and "lora_" in n)
    if live != len(state):
        raise AdapterError(f"adapter {spec.name}: {live} live LoRA tensors, the file has {len(state)}")
    return info


def load_host(
    policy_cfg: Mapping[str, Any],
    adapters: Sequence[AdapterSpec] = (),
    base: str | None = None,
    base_name: str = "base",
    max_model_len: int | None = None,
    allow_base_mismatch: bool = False,
) -> ModelHost:
    """Load the base policy and the adapters into one ModelHost.

    Args:
        policy_cfg: keyword arguments of rlkit.policy.load_policy (a conf/policy/*.yaml node, resolved):
            dtype, device, attention, image pixel bounds, and the model when no base is known.
        adapters: AdapterSpecs (``parse_adapter_arg``); served under their names.
        base: checkpoint directory or hub id (None: recorded by the adapters, else the policy config).
        base_name: served name of the base model (adapter disabled).
        max_model_len: prompt + completion tokens (None: the model's max_position_embeddings).
        allow_base_mismatch: see ``resolve_base``.

    Raises:
        AdapterError: bad names (duplicates, the base's name), base mismatch, or an adapter that does
            not load onto the base (every file tensor must land on a live LoRA parameter, equal to it).
        rlkit.policy.PolicyLoadError / ValueError: the base cannot be loaded (see load_policy).
    """
    import time

    from peft import PeftModel

    from rlkit.policy import Policy, load_policy

    names = [a.name for a in adapters]
    if not NAME_RE.match(base_name):
        raise AdapterError(f"base name {base_name!r}: use letters, digits and . _ : / + -")
    dupes = sorted({n for n in names if names.count(n) > 1} | ({base_name} & set(names)))
    if dupes:
        raise AdapterError(f"served model names must be unique, {dupes} repeat (the base is {base_name!r}); "
                           "name adapters explicitly with NAME=PATH")
    chosen = resolve_base(base, adapters, allow_mismatch=allow_base_mismatch)
    cfg = dict(policy_cfg)
    cfg.pop("_target_", None)
    policy = load_policy(**cfg, base_path=chosen, train_mode="full")
    model = policy.model
    model.requires_grad_(False)
    model.eval()
    served: dict[str, ServedAdapter] = {}
    if adapters:
        for i, spec in enumerate(adapters):
            internal = f"adapter{i}"
            try:
                if i == 0:
                    model = PeftModel.from_pretrained(model, str(spec.path), adapter_name=internal, is_trainable=False)
                else:
                    model.load_adapter(str(spec.path), adapter_name=internal, is_trainable=False)
            except (ValueError, RuntimeError, KeyError, OSError) as e:
                raise AdapterError(f"adapter {spec.name} ({spec.path}) does not load onto base {policy.checkpoint}: "
                                   f"{type(e).__name__}: {e}") from e
            _restore_file_values(model, spec, internal)
            served[spec.name] = ServedAdapter(spec, internal, _verify_loaded(model, spec, internal))
        model.requires_grad_(False)
        model.eval()
        policy = Policy(policy.config, model, policy.processor, checkpoint=policy.checkpoint)
    text_cfg = getattr(policy.hf_model.config, "text_config", policy.hf_model.config)
    model_len = int(getattr(text_cfg, "max_position_embeddings", 0) or 0) or 32768
    if max_model_len is not None:
        if max_model_len > model_len:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={model_len}")
        model_len = int(max_model_len)
    host = ModelHost(policy=policy, base_name=base_name, adapters=served, max_model_len=model_len,
                     created=int(time.time()))
    log.info("serving %s (base %s) and adapters %s", base_name, policy.checkpoint,
             {n: str(a.spec.path) for n, a in served.items()})
    return host
