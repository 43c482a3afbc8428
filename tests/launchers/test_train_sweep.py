"""The real rlkit job through ``launcher=ray``: ``train.py experiment=smoke logger=console`` swept over two
learning rates on the session's local Ray cluster (2 GRPO steps each; the sweep took 17-55 s here with a
cold cache, well under the ~3 minutes above which it would be marked slow).

Both jobs run at once (2 CPUs, one per entrypoint) and share a fresh cache folder: the tiny model
and SFT warm start are built by one of them under rlkit's cache lock while the other waits.
"""

from __future__ import annotations

import pytest

import json

from tests.launchers.conftest import REPO, run_sweep


@pytest.mark.slow  # 31 s; tests/launchers/test_ray_sweep.py keeps the launcher's own tests in the default suite
def test_train_smoke_sweep_on_ray(ray_cluster, tmp_path):
    sweep_dir = tmp_path / "multirun"
    sweep = run_sweep(REPO / "train.py", [
        "experiment=smoke", "logger=console", "lr=1e-5,3e-5", "launcher=ray",
        f"hydra.launcher.address={ray_cluster.dashboard_url}", "hydra.launcher.max_concurrent_jobs=2",
        "hydra.launcher.poll_interval_s=2", f"+hydra.launcher.env_vars.RLKIT_CACHE_DIR={tmp_path / 'cache'}",
    ], cwd=tmp_path, sweep_dir=sweep_dir, timeout=1200)
    assert sweep.returncode == 0, sweep.output[-6000:]
    rows = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert [r["job"] for r in rows] == ["0", "1"]
    assert "lr=1e-05" in rows[0]["overrides"] and "lr=3e-05" in rows[1]["overrides"]  # Hydra writes 1e-5 so
    assert all(r["status"] == "completed" and r["steps"] == 2 for r in rows), rows
    for job in ("0", "1"):
        res = json.loads((sweep_dir / job / "result.json").read_text())
        assert res["steps_completed"] == 2 and 0.0 <= res["eval_success_after"] <= 1.0
        assert (sweep_dir / job / "checkpoints" / "latest").is_file()
        assert json.loads((sweep_dir / job / "ray_job.json").read_text())["status"] == "SUCCEEDED"
    assert "[job 1]" in sweep.stdout and "eval success on" in sweep.stdout
