"""``hydra.launcher.max_retries`` against a real local Ray cluster: a sweep job whose driver is killed is
resubmitted into its own folder and completes, and the sweep summary counts its attempts; a job refused for
its config is not resubmitted (it would fail the same way)."""

from __future__ import annotations

import json

from launchers.ray_jobs import REFUSED
from tests.launchers.conftest import APP, run_sweep


def test_a_killed_job_is_resubmitted_and_the_summary_counts_attempts(ray_cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    sweep = run_sweep(APP, [
        "x=1,2", "+launcher=ray", f"hydra.launcher.address={ray_cluster.dashboard_url}",
        "hydra.launcher.max_concurrent_jobs=2", "hydra.launcher.poll_interval_s=0.5", "hydra.launcher.max_retries=1",
        f"die_once={tmp_path / 'markers'}",
    ], cwd=tmp_path, sweep_dir=sweep_dir)
    assert sweep.returncode == 0, sweep.output
    assert "resubmitting into the same folder" in sweep.stdout
    rows = {r["job"]: r for r in json.loads((sweep_dir / "sweep_summary.json").read_text())}
    assert rows["0"]["status"] == "completed" and rows["0"]["attempts"] == 2, rows
    assert rows["1"]["status"] == "completed" and rows["1"]["attempts"] == 2, rows
    assert rows["1"]["success_after"] == 0.2
    rec = json.loads((sweep_dir / "0" / "ray_job.json").read_text())
    assert rec["status"] == "SUCCEEDED" and rec["submission_id"].endswith("-retry1")
    assert not (sweep_dir / "0" / "error.txt").exists()  # the first attempt's failure is not this job's outcome


def test_no_retries_leaves_the_killed_job_failed(ray_cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    sweep = run_sweep(APP, [
        "x=3", "+launcher=ray", f"hydra.launcher.address={ray_cluster.dashboard_url}",
        "hydra.launcher.poll_interval_s=0.5", "hydra.launcher.max_retries=0", f"die_once={tmp_path / 'markers'}",
    ], cwd=tmp_path, sweep_dir=sweep_dir)
    assert sweep.returncode != 0
    assert "resubmitting" not in sweep.stdout
    row = json.loads((sweep_dir / "sweep_summary.json").read_text())[0]
    assert row["status"].startswith("failed") and row["attempts"] == 1


def test_refused_configs_are_recognised():
    assert REFUSED.search("[rlkit] config error: sampling.max_rounds=3 ...")
    assert REFUSED.search("rlkit.errors.ConfigError: unknown key")
    assert REFUSED.search("[rlkit] checkpoint error: cannot resume")
    assert not REFUSED.search("RuntimeError: deliberate failure for x=3")
    assert not REFUSED.search("ray.exceptions.ActorDiedError: the actor died")
    assert REFUSED.search("[rlkit] worker error: RolloutWorker.rollout raised RuntimeError: boom")
    assert REFUSED.search("rlkit.recipes.heal.WorkerError: RolloutWorker.rollout raised RuntimeError: boom")
    assert not REFUSED.search("rlkit.recipes.heal.WorkerLostError: a worker died (ActorDiedError)")
    assert not REFUSED.search("[rlkit] worker lost: a worker hung")
