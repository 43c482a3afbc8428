"""What rlkit hands vLLM: one image pad per image, the tower flag for vision LoRA, no Conv3d LoRA (issue 63)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlkit.serve.models import AdapterSpec
from rlkit.serve.vllm import check_adapter_for_vllm, check_prompt_ids, vllm_command


def _adapter(tmp_path: Path, name: str, modules: list[str]) -> AdapterSpec:
    d = tmp_path / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "base"}))
    t = {}
    for m in modules:
        t[f"base_model.model.{m}.lora_A.weight"] = torch.zeros(4, 8)
        t[f"base_model.model.{m}.lora_B.weight"] = torch.zeros(8, 4)
    save_file(t, str(d / "adapter_model.safetensors"))
    return AdapterSpec(name=name, path=d, source=str(d))


LM = "model.language_model.layers.0.self_attn.q_proj"
VIS = "model.visual.blocks.0.attn.proj"
CONV = "model.visual.patch_embed.proj"


def test_tower_flag_only_with_vision_lora(tmp_path):
    lm_only = vllm_command("base", "b", [_adapter(tmp_path, "a", [LM])], 512, 1)
    with_vis = vllm_command("base", "b", [_adapter(tmp_path, "v", [LM, VIS])], 512, 1)
    assert "--enable-tower-connector-lora" not in lm_only
    assert "--enable-tower-connector-lora" in with_vis
    assert with_vis[with_vis.index("--lora-modules") + 1].startswith("v=")


def test_conv3d_patch_embed_lora_refused(tmp_path):
    a = _adapter(tmp_path, "c", [LM, VIS, CONV])
    with pytest.raises(ValueError, match="patch_embed.*Conv3d"):
        check_adapter_for_vllm(a.path)
    with pytest.raises(ValueError, match="Conv3d"):
        vllm_command("base", "b", [a], 512, 1)


def test_expanded_image_pads_refused():
    pad = 7
    check_prompt_ids([1, 2, pad, 3], pad, 1)  # one pad per image: what vLLM expands itself
    check_prompt_ids([1, 2, 3], pad, 0)
    with pytest.raises(ValueError, match="49 <\\|image_pad\\|> ids for 1 image"):
        check_prompt_ids([1] + [pad] * 49 + [3], pad, 1)
