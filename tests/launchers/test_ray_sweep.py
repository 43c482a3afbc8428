"""``launcher=ray`` against a real local Ray cluster, with the tiny Hydra app in tests/launchers/app.

One sweep of three jobs at max_concurrent_jobs=2: jobs x=1 and x=2 must run at the same time (a
file barrier only they pass together), no job ever sees more than two running, x=3 fails on
purpose. Checks: JobReturns reach the sweep summary (sweep_summary.json rows), the failure comes
back FAILED with its log tail in the error, logs are streamed with the job prefix, a passed-through
secret reaches the job but no file of the sweep. A second sweep checks the PENDING timeout.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from launchers.ray_jobs import result_from_logs
from tests.launchers.conftest import APP, run_sweep

SECRET = "not-a-real-key-7f3a"


def test_ray_sweep_concurrency_failure_and_summary(ray_cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    sync = tmp_path / "sync"
    sweep = run_sweep(APP, [
        "x=1,2,3", "fail_on=3", "+launcher=ray",
        f"hydra.launcher.address={ray_cluster.dashboard_url}",
        "hydra.launcher.max_concurrent_jobs=2", "hydra.launcher.poll_interval_s=0.5",
        "hydra.launcher.entrypoint_num_cpus=1",
        f"barrier={sync / 'barrier'}", "barrier_xs=[1,2]", f"running={sync / 'running'}",
        "report_env=[WANDB_RUN_GROUP,RLKIT_SWEPT_KEYS]", "report_secret_env=[WANDB_API_KEY]",
    ], cwd=tmp_path, sweep_dir=sweep_dir, env_extra={"WANDB_API_KEY": SECRET})
    out = sweep.output

    # The failing job fails the sweep (Hydra's BasicSweeper raises it) with its log tail ...
    assert sweep.returncode != 0, out
    assert "RayJobFailed" in out and "job 2" in out and "FAILED" in out
    assert "deliberate failure for x=3" in out.split("--- last")[1], "log tail missing from the error"
    # ... but the summary ran first and lists every job.
    rows = json.loads((sweep_dir / "sweep_summary.json").read_text())
    by_job = {r["job"]: r for r in rows}
    assert set(by_job) == {"0", "1", "2"}, rows
    assert by_job["0"]["status"] == "completed" and by_job["0"]["success_after"] == 0.1
    assert by_job["1"]["status"] == "completed" and by_job["1"]["success_after"] == 0.2
    assert by_job["2"]["status"].startswith("failed")
    assert by_job["0"]["overrides"].startswith("x=1")

    # Concurrency: x=1 and x=2 passed a barrier only passable together; never more than 2 at once.
    for job in ("0", "1"):
        res = json.loads((sweep_dir / job / "result.json").read_text())
        assert res["running_with"] <= 2
        assert res["env_sha256"]["WANDB_API_KEY"] == hashlib.sha256(SECRET.encode()).hexdigest()  # passed
        assert res["env"]["WANDB_RUN_GROUP"] == f"sweep-{sweep_dir.name}"
        assert res["env"]["RLKIT_SWEPT_KEYS"] == "x"  # a job's resume check knows what its sweep sweeps
        assert res["cwd"] == str(APP.parent)  # local cluster: in place, no upload
    # Logs streamed with the job prefix.
    assert "[job 0] sweep_app x=1 line 2" in sweep.stdout
    assert "[job 2] RuntimeError: deliberate failure for x=3" in sweep.stdout
    # Submitter-side records; the secret is in no file the launcher wrote.
    rec = json.loads((sweep_dir / "2" / "ray_job.json").read_text())
    assert rec["status"] == "FAILED" and rec["driver_exit_code"] == 1
    # the failure is on record where the summary looks (the app, unlike train.py, writes no error.txt)
    assert (sweep_dir / "2" / "error.txt").read_text().startswith("RayJobFailed: job 2 (")
    assert {"WANDB_API_KEY", "WANDB_RUN_GROUP"} <= set(rec["runtime_env"]["env_vars"])  # names only
    for p in sweep_dir.rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p

    # The result block in a real job log parses back to the job's result.json.
    log0 = (sweep_dir / "0" / "ray_job.log").read_text()
    assert result_from_logs(log0) == json.loads((sweep_dir / "0" / "result.json").read_text())


def test_pending_job_times_out_with_a_clear_message(ray_cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    sweep = run_sweep(APP, [
        "x=1", "+launcher=ray", f"hydra.launcher.address={ray_cluster.dashboard_url}",
        "hydra.launcher.poll_interval_s=0.5", "hydra.launcher.pending_timeout_s=3",
        "+hydra.launcher.entrypoint_resources.no_such_resource=1",
    ], cwd=tmp_path, sweep_dir=sweep_dir)
    assert sweep.returncode != 0
    out = sweep.output
    assert "stayed PENDING" in out and "no_such_resource" in out and "pending_timeout_s" in out, out[-3000:]
    rec = json.loads((sweep_dir / "0" / "ray_job.json").read_text())
    assert rec["status"] == "PENDING_TIMEOUT"
    rows = json.loads((sweep_dir / "sweep_summary.json").read_text())
    (row,) = rows  # the reason, from the error.txt the launcher wrote, not just "no result.json"
    assert row["status"].startswith("failed: RayJobFailed: job 0 (") and "stayed PENDING" in row["status"]


def test_unreachable_cluster_fails_before_submitting(tmp_path):
    from tests.launchers.ray_cluster import free_port

    sweep = run_sweep(APP, ["x=1", "+launcher=ray", f"hydra.launcher.address=http://127.0.0.1:{free_port()}"],
                      cwd=tmp_path, sweep_dir=tmp_path / "multirun", timeout=120)
    assert sweep.returncode != 0
    assert "[rlkit] launcher error: Cannot reach the Ray Jobs API" in sweep.output and "ray start --head" in sweep.output
    # the message names the fix; a traceback through Hydra and the launcher would bury it
    assert "Traceback" not in sweep.output, sweep.output[-3000:]


def test_hyperpod_launcher_refuses_an_address_without_a_cluster_scheme(tmp_path):
    sweep = run_sweep(APP, ["x=1", "+launcher=hyperpod", "hydra.launcher.address=my-cluster"],
                      cwd=tmp_path, sweep_dir=tmp_path / "multirun", timeout=120)
    assert sweep.returncode != 0
    assert "[rlkit] launcher error: launcher=hyperpod needs hydra.launcher.address=sagemaker_ray://" in sweep.output
    assert "'my-cluster'" in sweep.output and "Traceback" not in sweep.output, sweep.output[-3000:]


def test_app_launcher_configs_match_the_repo(repo_root: Path):
    """The tiny app selects launchers with copies of conf/launcher/{ray,hyperpod}.yaml; keep them equal."""
    for name in ("ray.yaml", "hyperpod.yaml"):
        assert (APP.parent / "conf" / "launcher" / name).read_text() == \
            (repo_root / "conf" / "launcher" / name).read_text()
