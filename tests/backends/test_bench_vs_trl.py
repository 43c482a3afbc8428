"""bench/bench_vs_trl.py: rlkit's side of the rlkit-vs-TRL GRPO step benchmark runs and reports sane
timings (default suite); the whole benchmark, TRL included, in --quick mode (slow; needs .venv-trl from
scripts/setup_trl.sh)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
STEP_LINE = re.compile(r"^rlkit/TRL GRPO step time (\d+\.\d+) \(rlkit (\d+\.\d+) s, TRL (\d+\.\d+) s\)$", re.M)
RATIO_LINE = re.compile(r"^generation ratio (\d+\.\d+) \(rlkit (\d+\.\d+) s, TRL (\d+\.\d+) s\); "
                        r"update ratio (\d+\.\d+) \(rlkit (\d+\.\d+) s, TRL (\d+\.\d+) s\)$", re.M)


def _bench(tmp_path: Path, *extra: str, timeout: int) -> tuple[str, dict]:
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "bench.bench_vs_trl", "--quick", "--work-dir", str(tmp_path / "work"),
                           "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _check_rlkit_run(run: dict, steps: int) -> None:
    assert run["side"] == "rlkit" and len(run["steps"]) == steps
    assert run["config"]["env"]["variant"] == "easy"  # the 9x9 task TRL's side gets, not the default 7x7 maze
    for s in run["steps"]:
        assert s["total_s"] > 0 and s["generation_s"] > 0 and s["update_s"] > 0
        assert s["generation_s"] + s["update_s"] == pytest.approx(s["total_s"], rel=1e-6)
        # generation = rollout + reward + advantages: the last is a few tensor ops
        assert s["rollout_s"] + s["reward_s"] <= s["generation_s"] + 0.02
        assert s["generation_s"] - s["rollout_s"] - s["reward_s"] < 0.1 * s["total_s"] + 0.02
        assert s["prompt_tokens"] == 159  # issue 15's prompt: system + 49 image tokens + text
        assert 1 <= s["completion_tokens_mean"] <= 8 and s["threads"] == 1
    assert run["trainable_params"] == 311_296  # LoRA r16 on the 4 decoder layers' 7 linears
    assert run["update_flops"] > 1e9 and run["matmul_peak_flops"] > 1e9


@pytest.mark.slow  # 14 s of the 15-minute default suite for a benchmark's orchestration; run with -m slow
def test_rlkit_side_quick(tmp_path):
    """The orchestrator with rlkit's side only: 2 steps (1 counted) of the --quick workload in fp32."""
    stdout, doc = _bench(tmp_path, "--no-trl", "--dtypes", "fp32", "--steps", "2", "--skip", "1", timeout=240)
    (run,) = doc["runs"]["fp32"]["rlkit"]
    _check_rlkit_run(run, 2)
    s = doc["summary"]["fp32"]
    assert s["rlkit"]["total_s"] == pytest.approx(run["steps"][1]["total_s"])
    assert 0 < s["rlkit_update_fraction_of_peak"] < 1.5
    assert "rlkit GRPO step time" in stdout and "TRL not run" in stdout
    assert re.search(r"rlkit update \d+\.\d GFLOP in \d+\.\d\d s = .* of the fp32 matmul peak", stdout)


@pytest.mark.slow  # ~1 minute: both sides, both dtypes, 3 steps each
@pytest.mark.skipif(not TRL_PYTHON.is_file(), reason=".venv-trl missing: build it with `bash scripts/setup_trl.sh`")
def test_whole_bench_quick(tmp_path):
    stdout, doc = _bench(tmp_path, timeout=900)
    assert len(STEP_LINE.findall(stdout)) == 2 and len(RATIO_LINE.findall(stdout)) == 2
    for dtype in ("fp32", "bf16"):
        _check_rlkit_run(doc["runs"][dtype]["rlkit"][0], 3)
        (trl,) = doc["runs"][dtype]["trl"]
        assert len(trl["steps"]) == 3
        for s in trl["steps"]:
            assert s["total_s"] > 0 and s["generation_s"] > 0 and s["update_s"] > 0
            assert s["prompt_tokens"] == 159 and s["rows"] == 8
        # the same LoRA (targets, rank) and the dtype asked for on both sides
        assert trl["trainable_params"] == doc["runs"][dtype]["rlkit"][0]["trainable_params"]
        assert trl["model_dtype"] == ("torch.bfloat16" if dtype == "bf16" else "torch.float32")
        assert trl["accelerate_mixed_precision"] == ("bf16" if dtype == "bf16" else "no")
        assert trl["grpo_config"]["beta"] == 0.0 and trl["grpo_config"]["num_iterations"] == 1
        s = doc["summary"][dtype]
        assert s["ratio_step"] == pytest.approx(s["rlkit"]["total_s"] / s["trl"]["total_s"])
