"""LoRA: targets, PEFT-format save/load, in-place hot swap, reference policy, merged export."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import Qwen3VLForConditionalGeneration

from rlkit.policy import PromptInput, load_adapter_inplace, read_adapter_info
from rlkit.policy.lora import LoraSettings, excluded_modules, resolve_target_modules, unwrap_model

from .conftest import maze_image, perturb_lora


def _batch(policy):
    tt = policy.chat.user_turn("Which way?", [maze_image(3)], system="Solve it.")
    return PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs))


def _hf_base(path):
    """The base model as transformers loads it, with the attention the CPU policy runs (rlkit.policy.attention)."""
    from rlkit.policy.attention import register

    return Qwen3VLForConditionalGeneration.from_pretrained(path, attn_implementation=register())


def _logits(model, policy, prompt):
    from rlkit.policy.logprobs import sequence_batch

    b = sequence_batch(model, [prompt])
    model.eval()
    with torch.no_grad():
        return model(**b.model_inputs()).logits


def test_all_linear_targets_language_model_only(make_policy):
    policy = make_policy()
    lora_modules = {n.rsplit(".lora_A", 1)[0] for n, _ in policy.model.named_parameters() if ".lora_A." in n}
    assert lora_modules and all(".language_model." in n for n in lora_modules)
    leaves = {n.rsplit(".", 1)[-1] for n in lora_modules}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(not p.requires_grad for n, p in policy.model.named_parameters() if "lora_" not in n)
    with_vision = resolve_target_modules(policy.hf_model, LoraSettings(include_vision=True))
    assert {"qkv", "linear_fc1"} <= set(with_vision) and "lm_head" not in with_vision


def test_vision_lora_adapts_the_towers_linears_and_never_the_conv3d(make_policy):
    """include_vision's leaf ``proj`` (the tower's attention output) is also the Conv3d patch embedding's name; that
    one stays frozen (vLLM never applies LoRA to it), every vision-side linear is adapted."""
    policy = make_policy(lora={"rank": 4, "alpha": 8, "include_vision": True})
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in policy.model.named_parameters() if ".lora_A." in n}
    visual_linears = {n.removesuffix(".base_layer") for n, m in unwrap_model(policy.model).named_modules()
                      if ".visual." in f".{n}" and isinstance(m, torch.nn.Linear) and ".lora_" not in n}
    assert not any("patch_embed" in n for n in adapted)
    assert len(visual_linears) == 12  # 2 blocks x (qkv, proj, fc1, fc2), merger and deepstack merger x (fc1, fc2)
    assert {n.split(".visual.", 1)[1] for n in adapted if ".visual." in n} == {n.split(".visual.", 1)[1] for n in visual_linears}
    assert any(n.endswith("attn.proj") for n in adapted)  # the linear named proj is adapted
    assert excluded_modules(policy.hf_model, ["proj", "qkv"]) == ["model.visual.patch_embed.proj"]
    assert excluded_modules(policy.hf_model, "regex") == []


def test_exclude_modules_keeps_named_modules_frozen_and_adds_to_all_linears_own(make_policy):
    """lora.exclude_modules is peft's: with an explicit target list naming ``proj`` the Conv3d is adapted unless
    excluded; with all-linear the Conv3d is excluded anyway and a named linear joins it."""
    conv = "model.visual.patch_embed.proj"
    listed = make_policy(lora={"rank": 4, "alpha": 8, "target_modules": ["proj", "qkv"]})
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in listed.model.named_parameters() if ".lora_A." in n}
    assert any(n.endswith(conv) for n in adapted)  # a list is peft's as is
    kept = make_policy(lora={"rank": 4, "alpha": 8, "target_modules": ["proj", "qkv"], "exclude_modules": [conv]})
    adapted_kept = {n.rsplit(".lora_A", 1)[0] for n, _ in kept.model.named_parameters() if ".lora_A." in n}
    assert adapted_kept == {n for n in adapted if not n.endswith(conv)}
    block0_qkv = "model.visual.blocks.0.attn.qkv"
    both = make_policy(lora={"rank": 4, "alpha": 8, "include_vision": True, "exclude_modules": [block0_qkv]})
    assert sorted(both.model.peft_config["default"].exclude_modules) == sorted([conv, block0_qkv])
    adapted_both = {n.rsplit(".lora_A", 1)[0] for n, _ in both.model.named_parameters() if ".lora_A." in n}
    assert not any(n.endswith((conv, block0_qkv)) for n in adapted_both)
    assert any(n.endswith("blocks.1.attn.qkv") for n in adapted_both)
    with pytest.raises(ValueError, match="regex"):
        make_policy(lora={"rank": 4, "alpha": 8, "include_vision": True, "exclude_modules": ".*blocks\\.0.*"})
    with pytest.raises(ValueError, match="exclude_modules"):
        LoraSettings(exclude_modules=3).validate()


def test_full_finetuning_has_no_adapter(make_policy):
    policy = make_policy(train_mode="full")
    assert not policy.is_lora and all(p.requires_grad for p in policy.model.parameters())
    with pytest.raises(RuntimeError, match="kl_coef"):
        with policy.reference():
            pass


def test_adapter_roundtrip_into_fresh_base(make_policy, tiny_dir, tmp_path):
    policy = make_policy()
    perturb_lora(policy.model, seed=1)
    info = policy.save_adapter(tmp_path / "adapter", version=7)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert info.version == 7 and info.num_tensors == 2 * 7 * 2  # A and B x 7 linears x 2 layers
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and "lm_head" not in cfg["target_modules"]
    from rlkit.policy.attention import register

    prompt = _batch(policy)
    ours = _logits(policy.model, policy, prompt)
    # bitwise with the attention the CPU policy runs (rlkit_sdpa), within rounding with transformers' sdpa
    for attn, exact in ((register(), True), ("sdpa", False)):
        base = Qwen3VLForConditionalGeneration.from_pretrained(tiny_dir, attn_implementation=attn)
        fresh = _logits(PeftModel.from_pretrained(base, tmp_path / "adapter"), policy, prompt)
        assert torch.equal(ours, fresh) if exact else torch.allclose(ours, fresh, atol=1e-5)


def test_hot_swap_changes_logits_and_matches_fresh_load(make_policy, tiny_dir, tmp_path):
    trainer, engine_side = make_policy(), make_policy()
    prompt = _batch(trainer)
    before = _logits(engine_side.model, engine_side, prompt)
    perturb_lora(trainer.model, seed=2)
    trainer.save_adapter(tmp_path / "v1", version=1)
    info = engine_side.load_adapter(tmp_path / "v1")
    after = _logits(engine_side.model, engine_side, prompt)
    assert info.version == 1 and info.sha256 == read_adapter_info(tmp_path / "v1").sha256
    assert not torch.allclose(before, after)
    assert torch.equal(after, _logits(trainer.model, trainer, prompt))
    fresh = PeftModel.from_pretrained(_hf_base(tiny_dir), tmp_path / "v1")
    assert torch.equal(after, _logits(fresh, trainer, prompt))
    # a second version replaces the first in place
    perturb_lora(trainer.model, seed=3)
    trainer.save_adapter(tmp_path / "v1", version=2)
    assert load_adapter_inplace(engine_side.model, tmp_path / "v1").version == 2
    assert torch.equal(_logits(engine_side.model, engine_side, prompt), _logits(trainer.model, trainer, prompt))


def test_hot_swap_rejects_incompatible_or_torn_adapter(make_policy, tmp_path):
    other = make_policy(lora={"rank": 8, "alpha": 16})
    other.save_adapter(tmp_path / "r8")
    policy = make_policy()
    with pytest.raises(ValueError, match="does not fit"):
        policy.load_adapter(tmp_path / "r8")
    policy.save_adapter(tmp_path / "ok", version=1)
    meta = json.loads((tmp_path / "ok" / "rlkit_adapter.json").read_text())
    meta["sha256"] = "0" * 64
    (tmp_path / "ok" / "rlkit_adapter.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="sha256"):
        policy.load_adapter(tmp_path / "ok")
    with pytest.raises(FileNotFoundError):
        policy.load_adapter(tmp_path / "missing")


def test_reference_is_base_model(make_policy, tiny_dir):
    policy = make_policy()
    perturb_lora(policy.model, seed=4)
    prompt = _batch(policy)
    base = _hf_base(tiny_dir)
    with policy.reference() as ref:
        ref_logits = _logits(ref, policy, prompt)
    assert torch.equal(ref_logits, _logits(base, policy, prompt))
    assert not torch.allclose(_logits(policy.model, policy, prompt), ref_logits)


def test_merged_export_loads_as_new_base(make_policy, tmp_path):
    policy = make_policy()
    perturb_lora(policy.model, seed=5, scale=0.1)
    out = policy.save_pretrained(tmp_path / "merged")
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and not any("lora_" in k or "base_layer" in k for k in keys)
    again = make_policy(base_path=str(out))  # the SFT -> GRPO path: full checkpoint as base, fresh LoRA
    prompt = _batch(policy)
    torch.testing.assert_close(_logits(again.model, again, prompt), _logits(policy.model, policy, prompt), atol=1e-4, rtol=1e-4)
    assert policy.is_lora  # the live policy keeps its adapter
