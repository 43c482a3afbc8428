"""scripts/gpu_9x9.py: its overrides compose with the train schema; it refuses a used output folder; its
CPU dry run goes through the probe, the warm start and GRPO and reports the curves.

The GPU run itself is not tested here (no GPU on the CI machines).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import rlkit.config  # noqa: F401  registers the schema

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.gpu_9x9 import RECIPE, common  # noqa: E402
from scripts.gpu_check import GPU_SIZES  # noqa: E402


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


def test_refuses_extra_overrides_that_are_not_key_value(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_9x9.py"), "--dry-run", "--out", str(tmp_path / "o"),
                           "--extra", "algorithm.entropy_coef"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not key=value" in proc.stdout and not (tmp_path / "o").exists()


def test_refuses_an_output_folder_in_use(tmp_path):
    (tmp_path / "warm").mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_9x9.py"), "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "is not empty" in proc.stdout and "new --out" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm"]


@pytest.mark.slow  # ~2.5 minutes on a loaded 2-core machine
def test_dry_run_reports_the_warm_start_and_grpo_curves(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_9x9.py"), "--dry-run", "--budget-s", "240",
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
