"""SkyRL 0.3.0's own code against rlkit's env, on CPU, in .venv-skyrl (Python 3.12; scripts/setup_skyrl.sh).

What is real here: SkyRL's ``SkyRLVLMGymGenerator`` (its multi-turn agent loop, token bookkeeping, rewards
and metrics), ``PromptDataset`` (the ``datasets`` library reading rlkit's JSON-lines rows),
``prepare_generator_input``, ``evaluate`` and its eval dumps, ``SkyRLTrainConfig`` and the entry point;
rlkit's compiled config, datasets, ``rlkit-rewarded`` env, env adapter (``rlkit-env``) and reward; the tiny Qwen3-VL
checkpoint's tokenizer, chat template and image processor.

What stands in for vLLM (which cannot run here):
- ``ScriptedClient``: the two calls the VLM generator makes to its inference client. ``render_chat_completion``
  does what vLLM's ``/v1/chat/completions/render`` does (chat template with the generation prompt, images
  expanded into ``<|image_pad|>`` runs by the image processor, per-image tensors as ``features.kwargs_data``);
  ``generate`` returns a scripted action text as vLLM would (text without special tokens, ids ending in the
  end-of-turn token, stop reason ``stop``).
- ``vllm_mm_serde``: vLLM's ``decode_mm_kwargs_item`` (SkyRL's ``decode_mm_kwargs`` imports it to turn the
  render's ``kwargs_data`` back into ``pixel_values`` / ``image_grid_thw``), decoding what the client encoded.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

import torch
from omegaconf import OmegaConf
from PIL import Image

from rlkit.backends.skyrl import SkyRLBackend
from rlkit.backends.skyrl.data import write_datasets
from rlkit.backends.skyrl.schema import validate
from tests.backends.conftest import compose_cfg

MM_SERDE = "vllm.entrypoints.serve.disagg.mm_serde"


def require_skyrl_312() -> None:
    """Skip the calling test module (at import) unless SkyRL's generator imports: Python 3.12 + .venv-skyrl.
    The default suite runs on 3.11, where these modules are reported as skipped."""
    if sys.version_info < (3, 12):
        pytest.skip("skyrl312: needs Python 3.12 and .venv-skyrl (bash scripts/test_skyrl.sh)", allow_module_level=True)
    pytest.importorskip("skyrl.train.generators.skyrl_vlm_generator",
                        reason="skyrl312: SkyRL's generator is not importable here; run bash scripts/test_skyrl.sh")


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The tiny Qwen3-VL checkpoint (random weights; built offline, cached under RLKIT_CACHE_DIR)."""
    from rlkit.policy.tiny import tiny_checkpoint

    return tiny_checkpoint()


@pytest.fixture(scope="session")
def processor(tiny_ckpt):
    from rlkit.policy.processor import load_processor

    return load_processor(tiny_ckpt)


@dataclass
class SkyRLCase:
    """A compiled rlkit experiment as SkyRL sees it: the rlkit job and SkyRL's typed config."""

    job: Any
    cfg: Any  # skyrl.train.config.SkyRLTrainConfig


@pytest.fixture
def skyrl_case(tmp_path, tiny_ckpt, monkeypatch):
    """``make(overrides)``: compose experiment=hyperpod_visgym + overrides with /shared in tmp_path and the tiny
    checkpoint as the policy, compile it (backend=skyrl), write its datasets, build SkyRL's full config."""
    monkeypatch.setenv("WANDB_API_KEY", "not-used")  # SkyRL's validate_cfg asks for it with logger=wandb

    def make(overrides: list[str] = ()) -> SkyRLCase:
        cfg = compose_cfg(["experiment=hyperpod_visgym", f"paths.shared={tmp_path}/shared",
                           f"policy.path={tiny_ckpt}", *overrides])
        settings = {k: v for k, v in OmegaConf.to_container(cfg.backend, resolve=True).items() if k != "_target_"}
        job = SkyRLBackend(**settings).compile(cfg)
        write_datasets(job)
        validated = validate(job.config)
        assert validated.level == "full", "SkyRLTrainConfig did not build in full (its inference backend import)"
        return SkyRLCase(job, validated.typed)

    return make


# ---------------------------------------------------------------------------------------------------------
# vLLM stand-ins


def _encode_tensors(tensors: dict[str, torch.Tensor]) -> str:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


class _MMItem:
    def __init__(self, data: dict[str, torch.Tensor]):
        self._data = data

    def get_data(self) -> dict[str, torch.Tensor]:
        return self._data


def _decode_mm_kwargs_item(b64: str) -> _MMItem:
    return _MMItem(torch.load(io.BytesIO(base64.b64decode(b64)), weights_only=True))


@pytest.fixture
def vllm_mm_serde(monkeypatch):
    """Install the stand-in for vLLM's ``decode_mm_kwargs_item`` (see the module docstring)."""
    parts = MM_SERDE.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType(MM_SERDE)
    module.decode_mm_kwargs_item = _decode_mm_kwargs_item
    monkeypatch.setitem(sys.modules, MM_SERDE, module)
    return module


def _data_url_image(url: str) -> Image.Image:
    header, _, data = url.partition(",")
    assert header.startswith("data:image/"), header
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


#: policy(session_id, turn, conversation) -> the action text of that turn
Policy = Callable[[str, int, list[dict[str, Any]]], str]


@dataclass
class ScriptedClient:
    """The inference client SkyRLVLMGymGenerator talks to (render + generate), scripted (module docstring).

    ``renders`` keeps every rendered conversation with its token ids, ``calls`` every generate request."""

    processor: Any
    policy: Policy
    model_name: str = "tiny"
    renders: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    _by_ids: dict[tuple, list] = field(default_factory=dict)
    _turns: dict[str, int] = field(default_factory=dict)

    def render(self, conversation: list[dict[str, Any]], add_generation_prompt: bool = True) -> dict[str, Any]:
        """vLLM's chat render: token ids with each image expanded, and per-image tensors."""
        images, messages = [], []
        for m in conversation:
            content = m["content"]
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p["type"] == "image_url":
                        images.append(_data_url_image(p["image_url"]["url"]))
                        parts.append({"type": "image"})
                    else:
                        parts.append(p)
                content = parts
            messages.append({"role": m["role"], "content": content})
        text = self.processor.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)
        enc = self.processor(text=[text], images=images or None, return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        features = None
        if images:
            grid = enc["image_grid_thw"]  # [n_images, 3]
            sizes = [int(g.prod()) for g in grid]
            pixels = torch.split(enc["pixel_values"], sizes)  # per image [t*h*w, patch_dim]
            features = {
                "mm_hashes": {"image": [f"img{i}" for i in range(len(images))]},
                "mm_placeholders": {"image": []},
                "kwargs_data": {"image": [_encode_tensors({"pixel_values": pv, "image_grid_thw": g})
                                          for pv, g in zip(pixels, grid)]},
            }
        return {"token_ids": ids, "features": features, "n_images": len(images), "pixel_values": enc.get("pixel_values"),
                "image_grid_thw": enc.get("image_grid_thw")}

    async def render_chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        conversation = json.loads(json.dumps(request_payload["json"]["messages"]))
        out = self.render(conversation)
        self.renders.append({"conversation": conversation, **out})
        self._by_ids[tuple(out["token_ids"])] = conversation
        return {"token_ids": out["token_ids"], "features": out["features"]}

    async def generate(self, engine_input: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        (prompt_ids,) = engine_input["prompt_token_ids"]
        (session,) = engine_input["session_ids"]
        conversation = self._by_ids[tuple(prompt_ids)]  # the conversation SkyRL rendered for this input
        self.calls.append({"session": session, "prompt_ids": list(prompt_ids), "n_prompt": len(prompt_ids),
                           "conversation": conversation, "sampling": engine_input["sampling_params"],
                           "has_mm": engine_input.get("mm_features") is not None})
        turn = self._turns.get(session, 0)
        self._turns[session] = turn + 1
        text = self.policy(session, turn, conversation)
        tok = self.processor.tokenizer
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        logprobs = [-0.5] * len(ids) if engine_input["sampling_params"].get("logprobs") is not None else None
        await asyncio.sleep(0)
        return {"responses": [text], "response_ids": [ids], "stop_reasons": ["stop"],
                "response_logprobs": [logprobs] if logprobs is not None else None}

    def session_calls(self, session: str) -> list[dict[str, Any]]:
        """The generate requests of one trajectory (session id ``<uid>_<repetition>``), in turn order."""
        return [c for c in self.calls if c["session"] == session]

    async def finish_session(self, session_id: str) -> None:
        self.finished.append(session_id)
