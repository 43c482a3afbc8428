"""Tiny Qwen3-VL build: valid config, deterministic, save/reload round trip, cache, image geometry."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from rlkit.policy.processor import load_processor
from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy, tiny_checkpoint
from rlkit.policy.tokenizer import SPECIAL_TOKENS, build_tiny_tokenizer

from .conftest import TEST_SIZES, maze_image


def _inputs(proc, images):
    msgs = [{"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": "Go."}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return proc(images=images, text=[text], return_tensors="pt")


def test_config_is_consistent_with_tokenizer(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    proc = load_processor(tiny_dir)
    tok = proc.tokenizer
    assert cfg["text_config"]["vocab_size"] == len(tok)
    assert cfg["image_token_id"] == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg["video_token_id"] == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg["vision_start_token_id"] == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg["vision_end_token_id"] == tok.convert_tokens_to_ids("<|vision_end|>")
    assert cfg["vision_config"]["out_hidden_size"] == cfg["text_config"]["hidden_size"]
    rope = cfg["text_config"]["rope_parameters"]
    assert sum(rope["mrope_section"]) == cfg["text_config"]["head_dim"] // 2
    assert all(i < cfg["vision_config"]["depth"] for i in cfg["vision_config"]["deepstack_visual_indexes"])
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"


def test_tokenizer_is_deterministic_and_encodes_any_text():
    a, b = build_tiny_tokenizer(1024), build_tiny_tokenizer(1024)
    assert len(a) == 1024 and a.get_vocab() == b.get_vocab()
    assert [a.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(1024 - len(SPECIAL_TOKENS), 1024))
    for text in ["<answer>('move', 0)</answer>", "right down left up stop", "Ünïcödé ✓ 迷路 \t\n 🙂"]:
        ids = a(text, add_special_tokens=False)["input_ids"]
        assert a.decode(ids) == text
    assert len(a("right down left up stop", add_special_tokens=False)["input_ids"]) == 5  # one token per word


def test_maze_image_gives_one_token_per_cell(tiny_dir):
    proc = load_processor(tiny_dir)
    enc = _inputs(proc, [maze_image(0)])  # 225 x 225 px, 9 x 9 cells
    assert enc["image_grid_thw"].tolist() == [[1, 18, 18]]
    assert int((enc["input_ids"] == proc.image_token_id).sum()) == 81
    assert enc["pixel_values"].shape == (324, 3 * 2 * 4 * 4)
    big = load_processor(tiny_dir, max_pixels=88 * 88)
    enc11 = _inputs(big, [maze_image(0, cells=11)])  # 275 x 275 px, 11 x 11 cells
    assert int((enc11["input_ids"] == big.image_token_id).sum()) == 121


def test_build_is_seeded(tmp_path):
    a = build_tiny_policy(tmp_path / "a", TinyVLSizes(**TEST_SIZES), seed=3)
    b = build_tiny_policy(tmp_path / "b", TinyVLSizes(**TEST_SIZES), seed=3)
    c = build_tiny_policy(tmp_path / "c", TinyVLSizes(**TEST_SIZES), seed=4)
    sa = Qwen3VLForConditionalGeneration.from_pretrained(a).state_dict()
    sb = Qwen3VLForConditionalGeneration.from_pretrained(b).state_dict()
    sc = Qwen3VLForConditionalGeneration.from_pretrained(c).state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_save_reload_identical_logits(tiny_dir, tmp_path):
    proc = load_processor(tiny_dir)
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny_dir).eval()
    model.save_pretrained(tmp_path / "again")
    proc.save_pretrained(tmp_path / "again")
    model2 = Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "again").eval()
    proc2 = load_processor(tmp_path / "again")
    enc = _inputs(proc, [maze_image(1), maze_image(2)])
    enc2 = _inputs(proc2, [maze_image(1), maze_image(2)])
    assert torch.equal(enc["input_ids"], enc2["input_ids"]) and torch.equal(enc["pixel_values"], enc2["pixel_values"])
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, model2(**enc2).logits)


def test_cache_reuses_checkpoint(tmp_path):
    sizes = TinyVLSizes(**TEST_SIZES)
    p1 = tiny_checkpoint(sizes, seed=0, cache_dir=tmp_path)
    stamp = (p1 / "model.safetensors").stat().st_mtime_ns
    p2 = tiny_checkpoint(sizes, seed=0, cache_dir=tmp_path)
    assert p1 == p2 and (p2 / "model.safetensors").stat().st_mtime_ns == stamp
    assert tiny_checkpoint(sizes, seed=1, cache_dir=tmp_path) != p1


@pytest.mark.parametrize(
    "bad",
    [dict(deepstack_indexes=[5]), dict(head_dim=31), dict(text_heads=3, text_kv_heads=2), dict(vision_hidden=30)],
)
def test_invalid_sizes_raise(bad):
    with pytest.raises(ValueError):
        TinyVLSizes(**{**TEST_SIZES, **bad}).validate()


def test_checkpoint_files_name_upstream_classes(tiny_dir):
    proc_cfg = json.loads((tiny_dir / "processor_config.json").read_text())
    assert proc_cfg["processor_class"] == "Qwen3VLProcessor"
    assert json.loads((tiny_dir / "config.json").read_text())["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert load_processor(tiny_dir, min_pixels=64, max_pixels=32 * 32).image_processor.size["longest_edge"] == 1024
