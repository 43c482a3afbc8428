"""train.py backend=native_ray experiment=smoke end to end (a local Ray instance of its own), then a
resume that runs one more step: the same result.json / metrics / checkpoints as backend=native."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.distributed.conftest import RAY_ENV

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", RLKIT_CACHE_DIR=str(tmp_path / "cache"),
               RLKIT_SHARED_DIR=str(tmp_path / "shared"), PYTHONPATH=str(ROOT), **RAY_ENV)
    env["RLKIT_RAY_METRICS_LINGER_S"] = "0"  # the job's private Ray instance is not scraped: do not wait for it
    for k in ("WANDB_API_KEY", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"train.py failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc


@pytest.mark.slow  # 46 s on session 8's machine; the replicated and FSDP2 equality tests cover the cluster by default
def test_smoke_run_and_resume_on_ray(tmp_path):
    out = tmp_path / "run"
    # with the demonstration loss: the 2-step warm start solves nothing, so every task gets its demonstration
    # as a fixed-image control: the driver draws the picture, the rollout worker wraps its envs with it
    args = ["backend=native_ray", "experiment=smoke", "logger=console", "aux_loss.demo_coef=0.5", "control=fixed_image",
            "eval.seen_tasks=3", f"hydra.run.dir={out}"]
    proc = _run(args, tmp_path)
    assert "native_ray: 1 trainer rank(s) (unsharded, gloo) + 1 rollout worker(s), colocated" in proc.stdout
    assert "control=fixed_image: every image shown is task" in proc.stdout
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["steps_completed"] == 2 and result["eval_num_tasks"] == 4
    assert result["eval_seen_num_tasks"] == 3 and 0.0 <= result["eval_seen_success_after"] <= 1.0
    assert len(json.loads((out / "eval" / "seen_final.json").read_text())["tasks"]) == 3
    adapter = Path(result["adapter_dir"])
    assert json.loads((adapter / "rlkit_adapter.json").read_text())["version"] == 2
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward/mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        # the rollout of step s samples with the weights step s-1 produced; the update publishes v<s>
        assert m["sync/version"] == m["step"] - 1 and m["sync/published_version"] == m["step"]
        for key in ("timing/rollout", "timing/train", "timing/publish", "timing/load", "timing/sync",
                    "policy/loss", "policy/lr"):
            assert key in m, key
        if m["reward/success_rate"] == 0:  # no sample succeeded: both tasks get their demonstration
            assert m["demo/tasks"] == 2 and m["demo/nll"] > 0
    versions = sorted(p.name for p in (tmp_path / "shared" / "lora_sync").glob("*/v*"))
    assert versions == ["v1", "v2"]  # keep_versions: 2
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    opt = torch.load(out / "checkpoints" / "step_000002" / "optimizer.pt", weights_only=True)["optimizer"]
    assert len(opt["state"]) == len(opt["param_groups"][0]["params"]) > 0  # a single-process AdamW's format

    proc2 = _run(args + ["steps=3"], tmp_path)
    assert "resuming from" in proc2.stdout
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in steps if "reward/mean" in m][-1]
    assert last["step"] == 3 and last["sync/version"] == 2.0
    assert json.loads((out / "result.json").read_text())["steps_completed"] == 3
