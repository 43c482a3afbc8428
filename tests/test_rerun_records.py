"""A rerun into a run's folder keeps the folder's record true: a refused attempt leaves the Hydra record of the
run the folder holds, a sweep run again with other values does not relabel finished jobs, and a fresh start
over an earlier run (trainer.overwrite=true) leaves none of that run's checkpoints or evaluations behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# the GRPO smoke job without its one-time builds: a few seconds a run
FAST = ["experiment=smoke", "logger=console", "sft.enabled=false", "grounding.enabled=false"]


def _train(args, tmp_path, ok=True, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "RLKIT_SWEPT_KEYS"}  # set in a cluster job only
    env.update(RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env_extra)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _overrides(run: Path, sub: str = "") -> list[str]:
    return yaml.safe_load((run / ".hydra" / sub / "overrides.yaml").read_text())


def test_a_refused_resume_keeps_the_runs_record_and_a_fresh_start_clears_the_earlier_run(tmp_path):
    run = tmp_path / "run"
    _train([*FAST, "steps=2", f"hydra.run.dir={run}"], tmp_path)
    config = (run / ".hydra" / "config.yaml").read_text()
    assert _overrides(run, "accepted") == _overrides(run)  # the accepted attempt's record is kept aside

    refused = _train([*FAST, "steps=2", "seed=3", f"hydra.run.dir={run}"], tmp_path, ok=False)
    assert refused.returncode == 1 and "[rlkit] checkpoint error: cannot resume" in refused.stderr
    assert "seed (0 -> 3)" in refused.stderr and "Traceback" not in refused.stderr
    # Hydra wrote seed=3 into .hydra/ before the job started; the refused attempt put the record back
    assert (run / ".hydra" / "config.yaml").read_text() == config and "seed=3" not in _overrides(run)
    assert "cannot resume" in (run / "error.txt").read_text()  # what the last attempt did, for the sweep table

    _train([*FAST, "steps=3", f"hydra.run.dir={run}"], tmp_path)  # a resumable change: accepted
    assert "steps=3" in _overrides(run) and "steps=3" in _overrides(run, "accepted")
    assert not (run / "error.txt").exists() and (run / "resumes.jsonl").is_file()
    assert json.loads((run / "result.json").read_text())["steps_completed"] == 3

    # start over there: nothing of the 3-step run may stay to be read as this run's, and nothing else goes
    (run / "eval" / "my_notes.md").write_text("mine")
    fresh = _train([*FAST, "steps=1", "trainer.resume_mode=none", "trainer.overwrite=true", f"hydra.run.dir={run}"],
                   tmp_path)
    assert "removed the earlier run's checkpoints, eval, result.json, resumes.jsonl, adapter" in fresh.stdout
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_000001"]
    assert not (run / "resumes.jsonl").exists() and (run / "eval" / "my_notes.md").read_text() == "mine"
    assert json.loads((run / "result.json").read_text())["steps_completed"] == 1

    # checkpoints that no longer verify are not a reason to start over silently (and redo the run over its results)
    (run / "checkpoints" / "step_000001" / "optimizer.pt").unlink()
    damaged = _train([*FAST, "steps=1", f"hydra.run.dir={run}"], tmp_path, ok=False)
    assert damaged.returncode == 1 and "none is usable" in damaged.stderr and "trainer.overwrite=true" in damaged.stderr
    assert json.loads((run / "result.json").read_text())["steps_completed"] == 1 and (run / "adapter").is_dir()


def test_a_sweep_run_again_with_other_values_does_not_relabel_its_finished_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    _train(["-m", *FAST, "lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}"], tmp_path)
    before = {job: json.loads((sweep / job / "result.json").read_text()) for job in ("0", "1")}

    # one value added in front: Hydra hands job 0's folder (lr=1e-3) the value 5e-3, and job 1's 1e-3
    again = _train(["-m", *FAST, "lr=5e-3,1e-3,2e-3", f"hydra.sweep.dir={sweep}"], tmp_path, ok=False)
    assert "in this sweep: that folder's run has lr=0.001" in again.stderr + again.stdout
    rows = {r["job"]: r for r in json.loads((sweep / "sweep_summary.json").read_text())}
    for job, lr in (("0", "lr=0.001"), ("1", "lr=0.002")):
        assert lr in rows[job]["overrides"]  # the folder's record still names what it trained with
        assert rows[job]["status"].startswith("failed: CheckpointError: cannot resume")
        assert rows[job]["status"].endswith("(the numbers are the earlier run's)")
        assert json.loads((sweep / job / "result.json").read_text()) == before[job]
    assert rows["2"]["status"] == "completed" and "lr=0.002" in rows["2"]["overrides"]


def test_a_cluster_job_refuses_a_swept_key_change_and_a_sweep_may_share_one_resume_path(tmp_path):
    """A Ray Jobs launcher's job is a single run on the cluster; the launcher names the sweep's swept keys in
    RLKIT_SWEPT_KEYS, and there the same resume check holds as in a local multirun. A key a sweep sweeps may
    still differ from a checkpoint outside the job's own folder (trainer.resume_path: one start for all)."""
    run = tmp_path / "run"
    _train([*FAST, "steps=2", "lr=1e-3", f"hydra.run.dir={run}"], tmp_path)
    job = _train([*FAST, "steps=2", "lr=2e-3", f"hydra.run.dir={run}"], tmp_path, ok=False,
                 RLKIT_SWEPT_KEYS="lr,seed")
    assert job.returncode == 1 and "in this sweep: that folder's run has lr=0.001" in job.stderr
    assert "lr=2e-3" not in _overrides(run)  # refused before it was accepted: the record is the run's
    # (outside a sweep the same change resumes: test_resume.py::test_resume_applies_changed_lr_and_steps_and_records_them)

    start = next((run / "checkpoints").glob("step_*"))
    ignored = _train([*FAST, f"trainer.resume_path={start}", f"hydra.run.dir={tmp_path / 'other'}"], tmp_path,
                     ok=False)  # resume_mode=latest would not read it: refused, not started fresh
    assert "add trainer.resume_mode=from_path" in ignored.stderr
    sweep = tmp_path / "sweep"
    _train(["-m", *FAST, "steps=3", "lr=3e-3,4e-3", "trainer.resume_mode=from_path", f"trainer.resume_path={start}",
            f"hydra.sweep.dir={sweep}"], tmp_path)
    for job_dir, lr in ((sweep / "0", 3e-3), (sweep / "1", 4e-3)):
        result = json.loads((job_dir / "result.json").read_text())
        assert result["steps_completed"] == 3 and not (job_dir / "error.txt").exists()
        assert [json.loads(line)["changes"]["lr"]["now"] for line in (job_dir / "resumes.jsonl").open()] == [lr]


def _top_level_split(joined: str) -> list[str]:
    """result.json's ``overrides`` back into overrides: split at the commas outside brackets and quotes."""
    out, depth, quote, cur = [], 0, None, ""
    for ch in joined:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return [*out, cur] if cur else out


def test_a_runs_recorded_overrides_keep_its_search_path_and_rerun_it(tmp_path):
    """An experiment from a conf folder outside the clone (docs/adding-an-env.md section 8): result.json's
    ``overrides`` hold the ``hydra.searchpath`` the run was given (not where it wrote, ``hydra.run.dir``), and
    train.py with exactly those overrides reruns it; without the search path the same overrides do not."""
    conf = tmp_path / "my_task" / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "outside_smoke.yaml").write_text(
        "# @package _global_\ndefaults:\n  - smoke\n\nsteps: 1\n")
    search = f"hydra.searchpath=[file://{conf}]"
    first = tmp_path / "first"
    _train([search, "experiment=outside_smoke", *FAST[1:], f"hydra.run.dir={first}"], tmp_path)
    recorded = json.loads((first / "result.json").read_text())["overrides"]
    overrides = _top_level_split(recorded)
    assert overrides == [search, "experiment=outside_smoke", *FAST[1:]], recorded
    again = tmp_path / "again"
    _train([*overrides, f"hydra.run.dir={again}"], tmp_path)
    result = json.loads((again / "result.json").read_text())
    assert result["overrides"] == recorded and result["steps_completed"] == 1
    lost = _train([*overrides[1:], f"hydra.run.dir={tmp_path / 'lost'}"], tmp_path, ok=False)
    assert lost.returncode != 0 and "outside_smoke" in lost.stderr


def test_rerun_overrides_keep_only_the_hydra_overrides_that_change_the_config():
    from rlkit.run_folder import rerun_overrides

    hydra = ["hydra.run.dir=/x", "hydra.mode=RUN", "+hydra.searchpath=[file:///a/conf,pkg://b]", "hydra/launcher=basic"]
    assert rerun_overrides(["env=dots", "lr=1e-3"], hydra) == ["+hydra.searchpath=[file:///a/conf,pkg://b]",
                                                               "env=dots", "lr=1e-3"]
    assert rerun_overrides(["lr=1e-3"], ["hydra.run.dir=/x", "hydra.searchpathx=1"]) == ["lr=1e-3"]
    assert rerun_overrides([], []) == []
