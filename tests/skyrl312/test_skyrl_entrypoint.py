"""The config backend=skyrl compiles, through SkyRL 0.3.0's own config classes and entry point (CPU, 3.12)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_skyrl_312

pytestmark = pytest.mark.skyrl312
require_skyrl_312()

from skyrl.train.config import SkyRLTrainConfig  # noqa: E402
from skyrl.train.utils import validate_cfg  # noqa: E402

PROBE = Path(__file__).with_name("entrypoint_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def _diff(a, b, path=""):
    """[(key path, a value, b value)] where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [(path, a, b)]


@pytest.mark.parametrize("overrides", [[], ["env=visgym", "env.max_turns=18"], ["algorithm=dr_grpo"],
                                       ["algorithm.kl_coef=0.01", "algorithm.loss_reduction=seq_mean_token_mean"]])
def test_compiled_config_is_a_valid_skyrl_config(skyrl_case, overrides):
    """SkyRLTrainConfig (with its __post_init__) builds from the compiled mapping, SkyRL's validate_cfg
    accepts it, and the printed command's overrides (what the entry point parses) give the same config."""
    case = skyrl_case(overrides)
    from_cli = SkyRLTrainConfig.from_cli_overrides(case.job.overrides())
    assert _diff(dataclasses.asdict(from_cli), dataclasses.asdict(case.cfg)) == []
    validate_cfg(from_cli)  # (it fills in derived fields in place, e.g. megatron_config.mtp_num_layers)
    assert case.cfg.generator.vision_language_generator  # SkyRLVLMGymGenerator, what the generator tests run


@pytest.mark.slow  # 2.5-5.5 minutes here: a Ray cluster and a Ray task importing torch + SkyRL on a loaded core
def test_entry_point_runs_until_it_needs_gpus(skyrl_case, tmp_path):
    """rlkit's entry point on CPU: config, validate_cfg, Ray, the Ray task that registers rlkit-rewarded and
    builds SkyRL's BasePPOExp (tokenizer, both datasets from rlkit's files); it stops at the colocated
    placement group, which asks for GPUs. A 1-GPU layout with one task per step keeps SkyRL's dataset
    filter in-process (it spawns one process per row up to 8) and skips its GPU peer-access probe."""
    case = skyrl_case(["backend.num_nodes=1", "backend.gpus_per_node=1", "backend.num_inference_engines=1",
                       "steps=1", "tasks_per_step=1", "eval.num_tasks=1"])
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("\n".join(case.job.overrides()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", SKYRL_RAY_PG_TIMEOUT_IN_S="10",
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(PROBE), str(overrides)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"probe failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len("PROBE "):])
    assert report["reached"] == ["imports", "config", "validate_cfg", "runtime_env", "ray"], report
    assert report["error"].startswith("RuntimeError: Failed to create placement group with 1 bundles (requiring 1.0 GPUs"), report
    logs = proc.stdout + proc.stderr
    assert "Filtered dataset size: 1" in logs  # BasePPOExp read rlkit's train and eval files
