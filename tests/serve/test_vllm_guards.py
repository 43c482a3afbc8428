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


def _serve_script():
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("rlkit_script_serve_vllm", root / "scripts" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serve_engine_vllm_command_and_refusals(tmp_path, capsys):
    """--engine vllm launches the CPU build's server module with the tower flag for vision LoRA, in the dtype
    rlkit's policy takes on this CPU; it refuses a patch-embedding adapter (naming the fix), rlkit-only limits,
    and a missing .venv-vllm, all before anything starts (exit 2)."""
    import sys

    from rlkit.hardware import resolve_dtype_here

    serve = _serve_script()
    vis = _adapter(tmp_path, "v", [LM, VIS])
    conv = _adapter(tmp_path, "c", [LM, VIS, CONV])
    py = ["--vllm-python", sys.executable]
    assert serve.main(["--adapter", f"v={vis.path}", "--engine", "vllm", *py, "--print-vllm", "--port", "8011"]) == 0
    argv = " ".join(ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")).replace("\\", " ")
    assert f"{sys.executable} -m vllm.entrypoints.openai.api_server --model base " in " ".join(argv.split())
    for flag in ("--enable-tower-connector-lora", "--logprobs-mode processed_logprobs", "--port 8011",
                 f"--dtype {resolve_dtype_here('auto', 'cpu')[0]}", "--lora-modules v="):
        assert flag in " ".join(argv.split()), flag

    base = tmp_path / "base_ckpt"
    base.mkdir()
    rc = serve.main(["--adapter", str(conv.path), "--engine", "vllm", *py, "--base", str(base), "--allow-base-mismatch"])
    err = capsys.readouterr().err
    assert rc == 2 and "patch_embed" in err and "policy.lora.target_modules=all-linear" in err
    assert serve.main(["--adapter", str(vis.path), "--engine", "vllm", *py, "--max-n", "2"]) == 2
    assert "--max-n" in capsys.readouterr().err
    assert serve.main(["--adapter", str(vis.path), "--engine", "vllm", "--vllm-python", str(tmp_path / "nope"),
                       "--base", str(base), "--allow-base-mismatch"]) == 2
    assert "bash scripts/setup_vllm.sh" in capsys.readouterr().err


def test_probe_comparison_names_what_differs():
    from rlkit.serve.vllm_probe import (
        ProbeAnswer,
        ProbeMismatch,
        compare_probe,
        logprob_atol_for,
    )

    ref = ProbeAnswer(prompt_ids=[1, 2, 3], token_ids=[5, 6, 7], logprobs=[-0.5, -1.0, -2.0])
    same = ProbeAnswer(prompt_ids=[1, 2, 3], token_ids=[5, 6, 7], logprobs=[-0.5, -1.0 + 2e-5, -2.0])
    assert compare_probe("m", ref, same, logprob_atol_for("float32")) == pytest.approx(2e-5)
    with pytest.raises(ProbeMismatch, match="prompt has 4 token ids.*position 2"):
        compare_probe("m", ref, ProbeAnswer([1, 2, 9, 9], [5, 6, 7], None), None)
    with pytest.raises(ProbeMismatch, match="greedy tokens differ from rlkit's at position 1"):
        compare_probe("m", ref, ProbeAnswer([1, 2, 3], [5, 8, 7], None), None)
    moved = ProbeAnswer([1, 2, 3], [5, 6, 7], [-0.5, -1.0, -2.04])
    with pytest.raises(ProbeMismatch, match="logprobs differ by up to 0.04"):
        compare_probe("m", ref, moved, logprob_atol_for("float32"))
    assert compare_probe("m", ref, moved, None) == 0.0  # tokens only
    assert compare_probe("m", ref, moved, logprob_atol_for("bfloat16")) == pytest.approx(0.04)  # within bf16's


def test_bf16_probe_accepts_a_near_tie_and_refuses_a_real_difference():
    from rlkit.serve.vllm_probe import (
        ProbeAnswer,
        ProbeMismatch,
        compare_probe,
        logprob_atol_for,
        near_ties_allowed,
    )

    atol = logprob_atol_for("bfloat16")
    assert atol > logprob_atol_for("float32") and near_ties_allowed("bfloat16") and not near_ties_allowed("float32")
    ref = ProbeAnswer([1, 2], [5, 6, 7], [-0.10, -0.70, -0.30])
    # vLLM picks 8 at position 1 where rlkit's top two are nearly tied (rlkit scores 8 at -0.71), then goes on
    tie = ProbeAnswer([1, 2], [5, 8, 9], [-0.11, -0.69, -0.50])
    scored = {(5, 8, 9): [-0.10, -0.71, -0.52]}
    calls = []

    def rescore(tokens):
        calls.append(tuple(tokens))
        return scored[tuple(tokens)]

    assert compare_probe("m", ref, tie, atol, allow_near_ties=True, rescore=rescore) == pytest.approx(0.02)
    assert calls == [(5, 8, 9)]
    # without rescoring, positions after the tie are not compared
    assert compare_probe("m", ref, tie, atol, allow_near_ties=True) == pytest.approx(0.01)
    # float32 never accepts a parting
    with pytest.raises(ProbeMismatch, match="position 1"):
        compare_probe("m", ref, tie, logprob_atol_for("float32"), allow_near_ties=False, rescore=rescore)
    # not a tie: rlkit gives vLLM's pick far less than its own top choice
    with pytest.raises(ProbeMismatch, match="position 1"):
        compare_probe("m", ref, tie, atol, allow_near_ties=True, rescore=lambda t: [-0.10, -3.0, -0.52])
    # not a tie: vLLM's own top logprob is far from rlkit's (another model)
    far = ProbeAnswer([1, 2], [5, 8, 9], [-0.10, -2.5, -0.50])
    with pytest.raises(ProbeMismatch, match="position 1"):
        compare_probe("m", ref, far, atol, allow_near_ties=True, rescore=rescore)
    # after the tie, vLLM's logprobs must be rlkit's for the same tokens
    with pytest.raises(ProbeMismatch, match="token 2"):
        compare_probe("m", ref, tie, atol, allow_near_ties=True, rescore=lambda t: [-0.10, -0.71, -0.9])
