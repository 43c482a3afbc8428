"""bench/gpu_9x9.py: its overrides compose with the train schema (plan and interactive mode, the gpu and
8b_shapes sizes); it refuses a used output folder and bad arguments; its CPU dry run goes through the probe, the warm
start and GRPO and reports the curves.

The GPU run itself is not tested here (no GPU on the CI machines). The interactive dry run (~6 minutes on one loaded
core: `python -m bench.gpu_9x9 --dry-run --mode interactive --budget-s 420 --threads 1`) has no test of its own.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import rlkit.config  # noqa: F401  registers the schema

from bench.common import GPU_SIZES
from bench.gpu_9x9 import QWEN3_VL_8B_SHAPES, RECIPE, SIZES, common

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dry_run", [False, True])
def test_overrides_compose_with_the_train_schema(dry_run):
    ov = common(dry_run, sft_lr=5e-4, lr=1e-3)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"{k}={v}" for k, v in ov.items()] + ["steps=0"])
    assert cfg.env.variant == "easy" and cfg.grounding.enabled is False  # 9x9, the ungrounded recipe
    assert cfg.sft.lr == 5e-4 and cfg.lr == 1e-3 and cfg.policy.dtype == "bfloat16"
    assert cfg.optim.lr_schedule == "cosine" and cfg.aux_loss.demo_coef == 0.3
    assert cfg.policy.lora.include_vision is True
    if dry_run:
        assert cfg.policy.device == "cpu" and cfg.tasks_per_step == 2
    else:
        assert cfg.policy.device == "cuda" and cfg.tasks_per_step == 16 and cfg.algorithm.shared_prefix is True
        assert all(cfg.policy.tiny[k] == v for k, v in GPU_SIZES.items())
    assert len(RECIPE) == len({a.split("=")[0] for a in RECIPE})


def _compose(ov: dict[str, str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=[f"{k}={v}" for k, v in ov.items()] + ["steps=0"])


@pytest.mark.parametrize("dry_run,sizes", [(False, "gpu"), (False, "8b_shapes"), (True, "8b_shapes")])
def test_interactive_overrides_compose_with_the_train_schema(dry_run, sizes):
    cfg = _compose(common(dry_run, sft_lr=5e-4, lr=1e-3, mode="interactive", sizes=sizes))
    # the multi-turn setting: one move a turn, 18 turns, upstream's tuple parser, 16 new tokens a turn
    assert cfg.env.mode == "interactive" and cfg.env.variant == "easy" and cfg.env.max_turns == 18
    assert cfg.env.parser == "tuple" and cfg.rollout.max_new_tokens == 16
    assert cfg.sft.enabled is True and cfg.sft.num_demos == 0  # a fresh batch of multi-turn demonstrations a step
    # the same GRPO recipe as plan mode
    assert cfg.optim.lr_schedule == "cosine" and cfg.aux_loss.demo_coef == 0.3 and cfg.policy.lora.include_vision
    if dry_run:  # the dry run builds the tiny defaults, whatever --sizes says
        assert cfg.policy.device == "cpu" and cfg.policy.dtype == "auto" and cfg.sampling.max_rounds == 1
        assert cfg.policy.tiny.text_hidden == 192 and cfg.policy.lora.rank == 16
    else:
        assert cfg.policy.device == "cuda" and cfg.tasks_per_step == 16 and cfg.group_size == 8
        assert cfg.sampling.max_rounds == 3 and cfg.policy.dtype == "bfloat16"
        assert all(cfg.policy.tiny[k] == v for k, v in SIZES[sizes].items())
        assert cfg.policy.lora.rank == (32 if sizes == "8b_shapes" else 16)


def test_plan_mode_takes_the_8b_shapes_too():
    cfg = _compose(common(False, sft_lr=5e-4, lr=1e-3, mode="plan", sizes="8b_shapes"))
    assert cfg.env.mode == "plan" and cfg.env.parser == "plan" and cfg.rollout.max_new_tokens == 48
    assert cfg.policy.tiny.text_hidden == 4096 and cfg.policy.lora.alpha == 64


def test_8b_shapes_are_qwen3_vl_8b_widths_and_build_a_valid_config():
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLVisionConfig

    from rlkit.policy.tiny import TinyVLSizes, tiny_config
    from rlkit.policy.tokenizer import build_tiny_tokenizer
    from bench.bench_sync import QWEN3_VL_8B_TEXT

    s = QWEN3_VL_8B_SHAPES
    t = QWEN3_VL_8B_TEXT  # the 8B's text config as the sync benchmark sizes it
    assert (s["text_hidden"], s["text_intermediate"], s["text_heads"], s["text_kv_heads"], s["head_dim"]) == \
        (t["hidden"], t["intermediate"], t["q_heads"], t["kv_heads"], t["head_dim"])
    v = Qwen3VLVisionConfig()  # transformers' vision defaults are the 8B's vision tower (27 blocks of 1152)
    assert (s["vision_hidden"], s["vision_intermediate"], s["vision_heads"]) == \
        (v.hidden_size, v.intermediate_size, v.num_heads)
    assert s["text_layers"] < t["layers"] and s["vision_depth"] < v.depth  # the cut: depth only
    # the policy.tiny keys as train.py would pass them (tiny_vl.yaml's other keys at their defaults)
    tiny = dict(_compose(common(False, sft_lr=5e-4, lr=1e-3, mode="interactive", sizes="8b_shapes")).policy.tiny)
    sizes = TinyVLSizes(**tiny)
    sizes.validate()
    assert sizes.mrope_section() == [24, 20, 20]  # Qwen3-VL-8B's split of head_dim/2 = 64
    cfg = tiny_config(sizes, build_tiny_tokenizer(sizes.vocab_size))
    assert cfg.vision_config.out_hidden_size == cfg.text_config.hidden_size == 4096
    with torch.device("meta"):  # shapes only, no memory
        model = Qwen3VLForConditionalGeneration(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert 480e6 < n < 530e6, n  # ~506M: what the docstring's memory estimate assumes


def test_common_refuses_an_unknown_mode_or_sizes():
    with pytest.raises(ValueError, match="mode 'multi'"):
        common(False, 5e-4, 1e-3, mode="multi")
    with pytest.raises(ValueError, match="sizes '8b'"):
        common(False, 5e-4, 1e-3, sizes="8b")


def test_refuses_a_budget_that_is_not_positive(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_9x9", "--dry-run", "--mode", "interactive",
                           "--budget-s", "0", "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "must be positive" in proc.stdout and not (tmp_path / "o").exists()


def test_refuses_extra_overrides_that_are_not_key_value(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_9x9", "--dry-run", "--out", str(tmp_path / "o"),
                           "--extra", "algorithm.entropy_coef"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not key=value" in proc.stdout and not (tmp_path / "o").exists()


def test_refuses_an_output_folder_in_use(tmp_path):
    (tmp_path / "warm").mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_9x9", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "is not empty" in proc.stdout and "new --out" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm"]


@pytest.mark.slow  # ~2.5 minutes on a loaded 2-core machine
def test_dry_run_reports_the_warm_start_and_grpo_curves(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_9x9", "--dry-run", "--budget-s", "240",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "gpu_9x9: OK"
    s = json.loads((out / "summary.json").read_text())
    assert s["failures"] == [] and s["total_s"] < 240
    assert s["sft_steps"] == s["sft_max_steps"] >= 25 and s["sft_curve"][-1]["step"] == s["sft_steps"]
    assert s["grpo_steps_done"] == s["grpo_steps_planned"] >= 4
    steps = [row["step"] for row in s["grpo_curve"]]
    assert steps[0] == 0 and steps[-1] == s["grpo_steps_done"] and steps == sorted(steps)
    assert all(row["seen"] is not None for row in s["grpo_curve"])  # eval.seen_tasks is on
    for name in ("probe.log", "warm_start.log", "grpo.log", "metrics.jsonl", "result.json", "sft_summary.json"):
        assert (out / name).is_file(), name
