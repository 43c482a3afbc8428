"""``rollout.engine=vllm``: the native backends' rollouts and greedy evaluations sampled by vLLM's CPU engine.

Both tests drive rlkit where it runs (.venv, transformers 5.8.1), which starts vLLM from .venv-vllm as training does:

- ``tests/vllm/rlkit_vllm_engine.py`` measures the engine (rlkit.policy.vllm_engine.VllmEngine) against rlkit's own on
  one policy with a trained-looking adapter hot-swapped in: greedy evaluations equal, vLLM's sampling logprobs equal
  to the trainer's recomputation (the update's ratio starts at 1), seeds reproducible, stop strings with rlkit's
  semantics, multi-turn conversations equal, and the process gone after ``close``.
- ``train.py experiment=smoke rollout.engine=vllm policy.lora.include_vision=false backend=native`` completes with vLLM
  sampling every rollout (the probe after each adapter version passes and is logged), and its greedy evaluation of the
  final adapter equals rlkit's engine's on the same adapter (``scripts/eval.py``), maze for maze, reply for reply; no
  vLLM process is left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from rlkit.distributed.reaper import (
    pid_alive,  # a zombie (exited, not reaped) counts as gone
)

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="vllm: needs .venv-vllm (bash scripts/test_vllm.sh)")

ROOT = Path(__file__).resolve().parents[2]
RLKIT_PYTHON = Path(os.environ.get("RLKIT_REFERENCE_PYTHON", ROOT / ".venv" / "bin" / "python"))
#: The bound of rlkit.serve.vllm_probe (float32): 200x the measured agreement.
ATOL = 1e-4


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "RLKIT_CACHE_DIR": str(tmp_path / "cache"), "RLKIT_SHARED_DIR": str(tmp_path / "shared")}
    for k in ("VIRTUAL_ENV", "WANDB_API_KEY", "RAY_ADDRESS"):
        env.pop(k, None)
    return env


@pytest.fixture(scope="module")
def engine_check(tmp_path_factory):
    from tests.conftest import TINY_TEST_SIZES

    if not RLKIT_PYTHON.is_file():
        pytest.skip(f"rlkit's .venv is needed ({RLKIT_PYTHON}; bash scripts/setup.sh)")
    out = tmp_path_factory.mktemp("engine_check")
    proc = subprocess.run([str(RLKIT_PYTHON), "-m", "tests.vllm.rlkit_vllm_engine", str(out), "--sizes",
                           json.dumps(TINY_TEST_SIZES)], cwd=ROOT, env=_env(out), capture_output=True, text=True,
                          timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "engine.json").read_text())
    print(f"rollout.engine=vllm engine check: {json.dumps({k: v for k, v in res.items() if k != 'greedy_answers'})}")
    return res


def test_greedy_evaluation_through_vllm_equals_rlkits_engine(engine_check):
    r = engine_check
    assert r["greedy_rows_equal"] == r["greedy_tasks"] == 16  # per-task outcomes, action texts included
    assert r["greedy_tokens_equal"] == 16
    assert r["greedy_max_logprob_diff"] < ATOL
    assert r["probe"] is not None and r["probe"]["max_logprob_diff"] < ATOL  # the check after the adapter load ran


def test_sampled_logprobs_are_the_trainers_and_seeds_reproduce(engine_check):
    r = engine_check
    assert r["sampled_tokens"] > 100
    assert r["sampled_max_logprob_diff"] < ATOL  # the update's old logprobs = its own recomputation: ratio 1
    assert max(r["sampled_distinct_per_group"]) > 1  # G samples of a prompt are not one sample G times
    assert r["same_seed_same_samples"] and r["other_seed_differs"]


def test_stop_strings_and_multi_turn_follow_rlkits_semantics(engine_check):
    r = engine_check
    assert r["stop_hits"] >= r["stop_completions"] // 4 and not r["stop_violations"], r["stop_violations"][:3]
    assert r["multiturn_equal"] == r["multiturn_episodes"] == 6
    assert max(r["multiturn_turns"]) >= 2 and max(r["multiturn_images"]) >= 2  # a later turn re-sent its images
    assert not r["alive_after_close"]


def test_smoke_run_samples_with_vllm_and_its_greedy_eval_equals_rlkits_engine(tmp_path):
    if not RLKIT_PYTHON.is_file():
        pytest.skip(f"rlkit's .venv is needed ({RLKIT_PYTHON}; bash scripts/setup.sh)")
    run = tmp_path / "run"
    env = _env(tmp_path)
    proc = subprocess.run(
        [str(RLKIT_PYTHON), "train.py", "experiment=smoke", "rollout.engine=vllm", "policy.lora.include_vision=false",
         "backend=native", "logger=console", "eval.num_tasks=8", "policy.dtype=float32", f"hydra.run.dir={run}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    said = proc.stdout + proc.stderr
    pid = int(re.search(r"vLLM starting in process (\d+)", said).group(1))
    assert not pid_alive(pid), f"the run left its vLLM process {pid} behind"
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "completed" and result["steps_completed"] == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing/rollout" in r]
    assert len(steps) == 2
    for r in steps:  # every step sampled by vLLM with the version the previous update published, probe passed
        assert r["sync/version"] == r["trainer/step"] - 1 and "timing/load" in r
        assert r["sync/probe_logprob_diff"] < ATOL
    assert "timing/engine_startup" in steps[0]
    assert (run / "vllm_engine.log").stat().st_size > 0

    # rlkit's engine on the same final adapter, the same 8 mazes
    mine = tmp_path / "rlkit_eval.json"
    ev = subprocess.run([str(RLKIT_PYTHON), "scripts/eval.py", str(run), "--num-tasks", "8", "--out", str(mine)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert ev.returncode == 0, ev.stderr[-3000:]
    theirs = json.loads((run / "eval" / "final.json").read_text())
    ours = json.loads(mine.read_text())
    assert len(theirs["tasks"]) == 8 and theirs["tasks"] == ours["tasks"], (theirs["tasks"], ours["tasks"])
    assert theirs["metrics"]["eval/success_rate"] == ours["metrics"]["eval/success_rate"]


def test_probe_runs_in_bf16_and_refuses_other_weights(tmp_path):
    """The probe in bf16 (tests/vllm/rlkit_vllm_probe_dtype.py): vLLM and rlkit with the same adapter agree within
    logprob_atol_for("bfloat16") and part only at near ties; vLLM on the base while rlkit has the adapter is refused."""
    from rlkit.serve.vllm_probe import BF16_LOGPROB_ATOL
    from tests.conftest import TINY_TEST_SIZES

    if not RLKIT_PYTHON.is_file():
        pytest.skip(f"rlkit's .venv is needed ({RLKIT_PYTHON}; bash scripts/setup.sh)")
    proc = subprocess.run([str(RLKIT_PYTHON), "-m", "tests.vllm.rlkit_vllm_probe_dtype", str(tmp_path), "--sizes",
                           json.dumps(TINY_TEST_SIZES), "--dtype", "bfloat16"], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "probe.json").read_text())
    print(f"vLLM probe in bf16: {json.dumps(r)}")
    assert r["probe"] is not None and r["probe"]["max_logprob_diff"] < BF16_LOGPROB_ATOL
    assert r["shared_prefix_max_logprob_diff"] < BF16_LOGPROB_ATOL
    assert r["tokens_equal"] + len(r["partings"]) == r["prompts"] == 16
    assert all(p["rlkit_margin"] <= BF16_LOGPROB_ATOL for p in r["partings"])  # every parting is a near tie
    assert r["refuses_base_for_adapter"], r
