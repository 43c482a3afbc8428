"""bench/gpu_check.sh: its GPU plan composes and its sizes build; its CPU dry run passes end to end.

The GPU run itself is not tested here (no GPU on the CI machines); the dry run executes the same
phases (train, SIGKILL, resume, adapter sync, summary) tiny on CPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import rlkit.config  # noqa: F401  registers the schema

from bench.common import GPU_SIZES
from bench.gpu_check import peak_for, plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dry_run", [False, True])
def test_plan_composes_with_the_train_schema(dry_run):
    p = plan(dry_run)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=p["overrides"])
    assert cfg.policy.device == p["device"] and cfg.policy.dtype == p["dtype"]
    assert cfg.algorithm.shared_prefix is True and cfg.policy.attn_implementation == "sdpa"
    assert cfg.steps >= 3 and cfg.trainer.ckpt_interval == 1 and cfg.trainer.max_ckpts_to_keep == 0
    for k, v in p["tiny"].items():
        assert cfg.policy.tiny[k] == v


def test_gpu_sizes_are_a_valid_tiny_qwen3_vl():
    from omegaconf import OmegaConf

    from rlkit.policy.tiny import TinyVLSizes

    tiny = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "policy" / "tiny_vl.yaml").tiny)
    TinyVLSizes(**{**tiny, **GPU_SIZES}).validate()


def test_peak_table_and_override(monkeypatch):
    monkeypatch.delenv("RLKIT_PEAK_TFLOPS", raising=False)
    assert peak_for("NVIDIA H200")[0] == 989.5e12
    assert peak_for("NVIDIA H100 80GB HBM3")[0] == 989.5e12
    assert peak_for("NVIDIA H100 PCIe")[0] == 756e12
    assert peak_for("NVIDIA H200 NVL")[0] == 835.5e12
    assert peak_for("Some Future GPU")[0] is None
    monkeypatch.setenv("RLKIT_PEAK_TFLOPS", "100")
    assert peak_for("NVIDIA H200") == (100e12, "RLKIT_PEAK_TFLOPS")


@pytest.mark.slow  # ~75 s on a loaded 2-core machine
def test_dry_run_passes_and_reports_sane_numbers(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("RLKIT_CRASH_AT", None)
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "gpu_check: OK"
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["ok"] and s["failures"] == []
    assert s["steps_completed"] == s["steps"] == 3
    assert s["resumed_from_step"] == 1 and s["steps_logged"] == [1, 2, 3]
    assert s["checkpoint_adapter_unchanged"] and s["adapter_changed_after_resume"] and s["metrics_kept_before_resume"]
    assert s["sync_verified"] and s["sync_bytes"] > 0
    for k in ("generate_tokens_per_s", "update_tokens_per_s", "update_processed_tokens_per_s", "sync_publish_ms",
              "sync_load_ms", "peak_flops", "step_s"):
        assert s[k] > 0, k
    assert 0 < s["update_mfu"] < 1.5 and 0 < s["generate_mfu"] < 1.5  # of a measured (noisy) CPU peak
    assert s["update_processed_tokens_per_s"] < s["update_tokens_per_s"]  # the shared prefix runs once per group
    assert s["wall_s"] < 480
    for phase in ("train", "resume", "measure"):
        assert (tmp_path / f"{phase}.log").is_file()


def test_without_cuda_it_stops_at_once_and_says_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--out", str(tmp_path)], cwd=ROOT,
                          env=dict(os.environ, PYTHON=sys.executable, DEVICE=""), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "sees no CUDA device" in proc.stdout and "--dry-run" in proc.stdout
    assert not (tmp_path / "run").exists()
