"""bench/bench_headline.py on finished run folders (--reuse): the curve, the target step, the controls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_run(run_dir: Path, curve: list[tuple[int, float, float]], seen: list[float] | None = None) -> None:
    """A finished train.py folder: result.json and metrics.jsonl with (step, wall s, eval success) rows
    (and eval_seen/success_rate per row when ``seen`` is given, as eval.seen_tasks logs it)."""
    run_dir.mkdir(parents=True)
    lines = []
    for i, (step, wall, success) in enumerate(curve):
        if step:
            lines.append({"step": step, "trainer/wall_time_s": wall, "reward/mean": 0.5})
        lines.append({"step": step, "eval/success_rate": success, **({"eval_seen/success_rate": seen[i]} if seen else {})})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(ln) for ln in lines) + "\n")
    result = {"status": "completed", "eval_success_before": curve[0][2], "eval_success_after": curve[-1][2],
              "steps_completed": curve[-1][0], "wall_time_s": curve[-1][1]}
    (run_dir / "result.json").write_text(json.dumps(result))


def test_reused_runs_give_the_headline_lines_and_controls_only_where_asked(tmp_path):
    out = tmp_path / "bench"
    _fake_run(out / "seed0", [(0, 0.0, 0.453), (30, 60.0, 0.9), (60, 120.0, 0.96875)])
    _fake_run(out / "seed0_fixed_image", [(0, 0.0, 0.016), (30, 61.0, 0.031), (60, 119.0, 0.016)])
    _fake_run(out / "seed1", [(0, 0.0, 0.453), (30, 58.0, 0.953), (60, 117.0, 0.94)], seen=[0.578, 0.97, 0.99])
    proc = subprocess.run([sys.executable, "-m", "bench.bench_headline", "--reuse", "--seeds", "0", "1",
                           "--control-seeds", "0", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "headline: warm start 45.3% -> 96.9% after 60 steps in 120 s (seed 0; reused)" in proc.stdout
    assert "control fixed_image: warm start 1.6% -> 1.6% after 60 steps (seed 0)" in proc.stdout
    assert "headline: warm start 45.3% -> 94.0% after 60 steps in 117 s (seed 1; reused)" in proc.stdout
    report = json.loads((out / "headline.json").read_text())
    seed0, seed1 = report["runs"]
    assert seed0["reached_target_at"] == {"step": 60, "success": 0.96875, "wall_time_s": 120.0}
    assert seed1["reached_target_at"] == {"step": 30, "success": 0.953, "wall_time_s": 58.0, "seen": 0.97}  # first, not last
    assert [r["success"] for r in seed0["control"]["curve"]] == [0.016, 0.031, 0.016]
    assert seed1["control"] is None and not (out / "seed1_fixed_image").exists()  # not trained: not asked for
    # eval.seen_tasks: the trained-on column beside the held-out one, only for the run that logged it
    assert [r.get("seen") for r in seed1["curve"]] == [0.578, 0.97, 0.99]
    assert all("seen" not in r for r in seed0["curve"])
    assert "    30       58    95.3%      97.0%" in proc.stdout


def test_every_line_names_the_machine_and_the_dtype(tmp_path):
    """A run folder records the CPU that trained it (bench_machine.json) and its resolved dtype
    (.hydra/config.yaml, as train.py rewrites it); a folder from before says so instead of guessing."""
    out = tmp_path / "bench"
    _fake_run(out / "seed0", [(0, 0.0, 0.25), (30, 60.0, 0.844)])
    (out / "seed0" / ".hydra").mkdir()
    (out / "seed0" / ".hydra" / "config.yaml").write_text("policy:\n  dtype: float32\n")
    (out / "seed0" / "bench_machine.json").write_text(json.dumps(
        {"cpu": "AMD EPYC 7B13", "arch": "x86_64", "flags": ["avx2"], "native_bf16": False}))
    _fake_run(out / "seed1", [(0, 0.0, 0.3), (30, 60.0, 0.9)])
    result = json.loads((out / "seed1" / "result.json").read_text())
    (out / "seed1" / "result.json").write_text(json.dumps({**result, "policy_dtype": "bfloat16"}))
    proc = subprocess.run([sys.executable, "-m", "bench.bench_headline", "--reuse", "--seeds", "0", "1",
                           "--control", "none", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tag0 = "[AMD EPYC 7B13; avx2; no native bf16; float32]"
    assert f"headline: warm start 25.0% -> 84.4% after 30 steps in 60 s (seed 0; reused) {tag0}" in proc.stdout
    assert f"target reached: no {tag0}" in proc.stdout
    assert "(seed 1; reused) [machine unknown; bfloat16]" in proc.stdout
    report = json.loads((out / "headline.json").read_text())
    assert [(r["machine"] or {}).get("cpu") for r in report["runs"]] == ["AMD EPYC 7B13", None]
    assert [r["dtype"] for r in report["runs"]] == ["float32", "bfloat16"]
    assert set(report["machine"]) == {"cpu", "arch", "flags", "native_bf16"}  # the machine that wrote the report
