"""Unit tests of launchers/ray_jobs/ without a cluster: entrypoint quoting, result parsing,
settings, and the runner's loop (concurrency, pending timeout, re-authentication, outages) against
a scripted fake of ``JobSubmissionClient``."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from launchers.ray_jobs import (
    RESULT_MARKER, JobSpec, LauncherError, RayJobsRunner, Settings, build_entrypoint, check_address,
    job_env_vars, log_tail, result_from_logs, runtime_env_for,
)


def test_entrypoint_passes_overrides_unchanged_through_sh():
    overrides = ["lr=1e-5", "tag='a b'", "x=${oc.env:HOME}", "+extra=[1,2]", "name=it's"]
    cmd = build_entrypoint("/venv/bin/python", "train.py", overrides, "/shared/rlkit/multirun/d t/0", 3, "id-3",
                           cd="/repo dir")
    parts = shlex.split(cmd)  # what /bin/sh hands the programs
    assert parts[:3] == ["cd", "/repo dir", "&&"]
    argv = parts[3:parts.index("&&", 3)]
    assert argv[:2] == ["/venv/bin/python", "train.py"]
    assert argv[2:7] == overrides
    assert argv[7] == "hydra.run.dir='/shared/rlkit/multirun/d t/0'"  # Hydra-quoted: the path has a space
    assert argv[8:] == ["hydra.job.num=3", "hydra.job.id=id-3"]
    assert RESULT_MARKER not in cmd  # Ray logs the command; only the echo may print the marker
    plain = build_entrypoint("python", "train.py", [], "/shared/x/0", 0, "i")
    assert "hydra.run.dir=/shared/x/0 " in plain and not plain.startswith("cd ")


@pytest.mark.parametrize("job_env, expected", [({}, "3"), ({"OMP_NUM_THREADS": "7"}, "7")])
def test_the_entrypoint_runs_on_its_cpus_unless_the_job_env_sets_omp_num_threads(tmp_path, job_env, expected):
    show = "import os, sys; print('threads', os.environ['OMP_NUM_THREADS'])"
    cmd = build_entrypoint(sys.executable, "-c", [show], str(tmp_path / "0"), 0, "i", threads=3)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | job_env
    out = subprocess.run(cmd, shell=True, executable="/bin/sh", env=env, capture_output=True, text=True).stdout
    assert out.splitlines()[0] == f"threads {expected}"  # (cat result.json then fails: no job ran)
    assert not build_entrypoint("python", "train.py", [], "/d/0", 0, "i").startswith("OMP_NUM_THREADS")


def test_result_from_logs_ignores_the_logged_command():
    cmd = build_entrypoint("python", "train.py", ["x=1"], "/d/0", 0, "i")
    result = {"status": "completed", "eval_success_after": 0.5}
    logs = (f"Running entrypoint for job i: {cmd}\nstep 1\n{RESULT_MARKER}\n{json.dumps(result, indent=2)}\n"
            f"Running entrypoint for job i: {cmd}\n")  # Ray may flush its header last
    assert result_from_logs(logs) == result
    assert result_from_logs("no marker\n") is None
    assert result_from_logs(f"{RESULT_MARKER}\nnot json\n") is None
    assert log_tail(f"a\nb\nc\n{RESULT_MARKER}\n{{}}\n", 2) == "b\nc"


def test_check_address():
    assert check_address("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert check_address("https://h:443/") == "https://h:443"
    assert check_address(None) is None
    with pytest.raises(LauncherError, match="Ray Client address"):
        check_address("ray://h:10001")
    with pytest.raises(LauncherError, match="module named 'no_such_scheme'"):
        check_address("no_such_scheme://x")


def test_settings_locality_modes_and_env(tmp_path):
    assert Settings(address="http://127.0.0.1:8265").is_local()
    assert Settings(address="http://localhost:1").is_local()
    assert not Settings(address="http://10.0.0.5:8265").is_local()
    assert not Settings(address="sagemaker_ray://c/ns").is_local()
    assert Settings(address="http://10.0.0.5:8265", local_cluster=True).is_local()

    s = Settings(address="http://10.0.0.5:8265", excludes=[".venv/"], runtime_env={"pip": ["x"]},
                 env_vars={"A": "1"}, pass_env=["SECRET", "UNSET"])
    env = job_env_vars(s, {"SECRET": "v", "OTHER": "o"})
    assert env == {"A": "1", "SECRET": "v"}
    renv = runtime_env_for(s, tmp_path, env)
    assert renv == {"pip": ["x"], "working_dir": str(tmp_path), "excludes": [".venv/"], "env_vars": env}
    local = Settings(address="http://127.0.0.1:8265")
    assert "working_dir" not in runtime_env_for(local, tmp_path, {})
    uri = Settings(working_dir="s3://bucket/code.zip")
    assert runtime_env_for(uri, tmp_path, {})["working_dir"] == "s3://bucket/code.zip"
    for bad in (Settings(working_dir="copy"), Settings(max_concurrent_jobs=0),
                Settings(runtime_env={"env_vars": {}}), Settings(poll_interval_s=0)):
        with pytest.raises(LauncherError):
            bad.validate()


# ------------------------------------------------------------------------------------------------
# the runner against a scripted fake client


@dataclass
class Info:
    status: str
    message: str = ""
    driver_exit_code: int | None = None


class FakeClient:
    """Jobs run for ``run_polls`` polls after submission; ``script`` overrides per submission id."""

    def __init__(self, world: "World") -> None:
        self.w = world

    def submit_job(self, **kw):
        w = self.w
        w.calls.append("submit")
        if w.auth_fail_next:
            w.auth_fail_next -= 1
            raise RuntimeError("Request failed with status code 401: session expired.")
        sid = kw["submission_id"]
        w.jobs[sid] = {"polls": 0, "kw": kw}
        w.max_active = max(w.max_active, sum(1 for j in w.jobs.values() if not j.get("done")))
        return sid

    def get_job_info(self, sid):
        w = self.w
        if w.down_for:
            w.down_for -= 1
            raise ConnectionError("connection refused")
        j = w.jobs[sid]
        j["polls"] += 1
        if sid in w.pending:
            return Info("PENDING", "Job has not started yet. It may be waiting for resources")
        if j["polls"] < w.run_polls:
            return Info("RUNNING")
        j["done"] = True
        return Info(w.final.get(sid, "SUCCEEDED"), "Job entrypoint command failed with exit code 1, last "
                    "available logs (truncated to 20,000 chars):\nboom", 0 if w.final.get(sid) is None else 1)

    def get_job_logs(self, sid):
        j = self.w.jobs[sid]
        self.w.log_fetches += 1
        text = self.w.pad + "".join(f"line {i}\n" for i in range(j["polls"]))
        if j.get("done") and self.w.final.get(sid) is None:
            text += f"{RESULT_MARKER}\n" + json.dumps({"status": "completed", "job": sid}) + "\n"
        return text

    def stop_job(self, sid):
        self.w.calls.append(f"stop {sid}")
        return True


@dataclass
class World:
    run_polls: int = 3
    pending: tuple = ()
    final: dict = None
    auth_fail_next: int = 0
    down_for: int = 0
    pad: str = ""

    def __post_init__(self):
        self.final = self.final or {}
        self.jobs: dict = {}
        self.calls: list = []
        self.max_active = 0
        self.connects = 0
        self.log_fetches = 0

    def factory(self):
        self.connects += 1
        return FakeClient(self)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _specs(tmp_path: Path, n: int) -> list[JobSpec]:
    return [JobSpec(num=i, overrides=[f"x={i}"], job_dir=str(tmp_path / "cluster" / str(i)),
                    local_dir=tmp_path / "local" / str(i), entrypoint="true", runtime_env={},
                    submission_id=f"sid-{i}", metadata={}) for i in range(n)]


def _runner(world, clock, lines, **kw) -> RayJobsRunner:
    s = Settings(poll_interval_s=1.0, **{"max_retries": 0, **kw})
    return RayJobsRunner(s, world.factory, echo=lines.append, clock=clock, sleep=clock.sleep)


def test_runner_bounds_concurrency_streams_logs_and_collects_results(tmp_path):
    world, clock, lines = World(final={"sid-2": "FAILED"}), Clock(), []
    outcomes = _runner(world, clock, lines, max_concurrent_jobs=2).run(_specs(tmp_path, 3))
    assert world.max_active == 2
    assert [o.ok for o in outcomes] == [True, True, False]
    assert outcomes[0].result == {"status": "completed", "job": "sid-0"}
    assert json.loads((tmp_path / "local" / "0" / "result.json").read_text())["job"] == "sid-0"
    err = outcomes[2].error
    assert "sid-2" in err and "FAILED: Job entrypoint command failed with exit code 1" in err
    assert "truncated to 20,000" not in err and "line 2" in err  # our tail, not Ray's copy
    assert "[job 0] line 0" in lines and "[job 0] SUCCEEDED" in lines
    assert not any(RESULT_MARKER in ln or "sid-0\"}" in ln for ln in lines)  # result block not echoed
    assert lines.index("[job 0] line 2") < lines.index("[job 0] SUCCEEDED")
    rec = json.loads((tmp_path / "local" / "2" / "ray_job.json").read_text())
    assert rec["status"] == "FAILED" and rec["submission_id"] == "sid-2"


def test_runner_pending_timeout_stops_the_job(tmp_path):
    world, clock, lines = World(pending=("sid-0",)), Clock(), []
    runner = _runner(world, clock, lines, pending_timeout_s=5, entrypoint_num_gpus=8)
    (o,) = runner.run(_specs(tmp_path, 1))
    assert not o.ok and o.status == "PENDING_TIMEOUT"
    assert "stayed PENDING for 6 s" in o.error and "entrypoint_num_gpus=8" in o.error
    assert "stop sid-0" in world.calls


def test_runner_reconnects_when_the_session_expires(tmp_path):
    world, clock, lines = World(auth_fail_next=1), Clock(), []
    (o,) = _runner(world, clock, lines).run(_specs(tmp_path, 1))
    assert o.ok and world.connects == 2 and world.calls.count("submit") == 2


def test_runner_rides_out_a_short_outage_and_gives_up_on_a_long_one(tmp_path):
    world, clock, lines = World(down_for=3), Clock(), []
    (o,) = _runner(world, clock, lines, unreachable_timeout_s=60).run(_specs(tmp_path, 1))
    assert o.ok and world.connects == 1  # the same client retried; reconnecting would fail too
    world, clock = World(down_for=10_000), Clock()
    with pytest.raises(LauncherError, match="unreachable for .* keep running on the cluster"):
        _runner(world, clock, lines, unreachable_timeout_s=30).run(_specs(tmp_path, 1))


def test_runner_marks_a_refused_submission_failed(tmp_path):
    world, clock, lines = World(), Clock(), []

    def refusing():
        c = FakeClient(world)
        c.submit_job = lambda **kw: (_ for _ in ()).throw(RuntimeError("Request failed with status code 500: "
                                                                       "package too large"))
        return c

    runner = RayJobsRunner(Settings(poll_interval_s=1), refusing, echo=lines.append, clock=clock, sleep=clock.sleep)
    (o,) = runner.run(_specs(tmp_path, 1))
    assert not o.ok and o.status == "NOT_SUBMITTED" and "package too large" in o.error


def test_runner_fetches_big_logs_less_often(tmp_path):
    world, clock, lines = World(run_polls=12), Clock(), []
    _runner(world, clock, lines).run(_specs(tmp_path, 1))
    small = world.log_fetches  # every RUNNING poll + the final fetch
    world, clock = World(run_polls=12, pad="x" * 4_000_000 + "\n"), Clock()
    _runner(world, clock, lines).run(_specs(tmp_path, 1))
    assert small == 12 and world.log_fetches <= 4  # 4 MB: about one fetch per 4 polls


def test_local_records_follow_this_run_not_an_earlier_one(tmp_path):
    """The sweep summary reads each job's local folder. An earlier run of the sweep left result.json (and
    job 1 an error.txt) there; this run's outcome must replace them, or a failed job lists as completed
    with the earlier numbers, and a job that now succeeds keeps its old error."""
    from rlkit.sweep import collect

    specs = _specs(tmp_path, 3)
    for spec in specs:
        (spec.local_dir / ".hydra").mkdir(parents=True)  # as launch() writes it before the runner starts
        (spec.local_dir / ".hydra" / "overrides.yaml").write_text(f"- x={spec.num}\n")
        (spec.local_dir / "result.json").write_text(json.dumps({"status": "completed", "job": "earlier"}))
    (specs[1].local_dir / "error.txt").write_text("ValueError: an earlier attempt\n")
    world, clock, lines = World(final={"sid-2": "FAILED"}), Clock(), []
    _runner(world, clock, lines).run(specs)
    assert json.loads((specs[0].local_dir / "result.json").read_text())["job"] == "sid-0"  # not kept
    assert json.loads((specs[1].local_dir / "result.json").read_text())["job"] == "sid-1"
    assert not (specs[1].local_dir / "error.txt").exists()
    err = (specs[2].local_dir / "error.txt").read_text()
    assert err.startswith("RayJobFailed: job 2 (sid-2) FAILED: Job entrypoint command failed")
    rows = {r["job"]: r for r in collect(tmp_path / "local")}
    assert rows["0"]["status"] == rows["1"]["status"] == "completed"
    assert rows["2"]["status"].startswith("failed: RayJobFailed: job 2 (sid-2) FAILED")
    assert rows["2"]["status"].endswith("(the numbers are the earlier run's)")


def test_in_one_folder_the_jobs_own_error_stays_and_an_earlier_attempts_goes(tmp_path):
    """On a local cluster or a shared filesystem the job's folder is the local one. rlkit's own error.txt (with
    its traceback) stays; an earlier attempt's is not this one's: a job that fails before rlkit writes one, or a
    submission the cluster refuses, leaves the launcher's record instead. And with hydra.launcher.sweep_dir=null
    on a remote cluster the paths look the same while the disks differ: the result comes from the job's log."""
    (spec,) = _specs(tmp_path, 1)
    spec.job_dir = str(spec.local_dir)
    spec.local_dir.mkdir(parents=True)
    err = spec.local_dir / "error.txt"
    world, clock, lines = World(final={"sid-0": "FAILED"}), Clock(), []

    class WritesItsError(FakeClient):  # rlkit's run() writes error.txt into its folder as it fails
        def get_job_info(self, sid):
            info = super().get_job_info(sid)
            if info.status == "FAILED":
                err.write_text("CheckpointError: cannot resume ...\n\nTraceback ...\n")
            return info

    err.write_text("ValueError: an earlier attempt\n")
    (o,) = RayJobsRunner(Settings(poll_interval_s=1), lambda: WritesItsError(world), echo=lines.append, clock=clock,
                         sleep=clock.sleep).run([spec])
    # a refused checkpoint fails the same way again: not resubmitted, though max_retries allows one
    assert not o.ok and o.attempts == 1 and err.read_text().startswith("CheckpointError: cannot resume")

    err.write_text("ValueError: an earlier attempt\n")  # this attempt fails before rlkit runs (it writes nothing)
    world.jobs.clear()
    (o,) = _runner(world, clock, lines).run([spec])
    assert not o.ok and err.read_text().startswith("RayJobFailed: job 0 (sid-0) FAILED")

    def refusing():
        c = FakeClient(world)
        c.submit_job = lambda **kw: (_ for _ in ()).throw(RuntimeError("status code 500: package too large"))
        return c

    runner = RayJobsRunner(Settings(poll_interval_s=1), refusing, echo=lines.append, clock=clock, sleep=clock.sleep)
    (o,) = runner.run([spec])
    assert o.status == "NOT_SUBMITTED"
    assert err.read_text().startswith("RayJobFailed: submission refused by the cluster")

    # sweep_dir=null, remote cluster: the local file at job_dir is an earlier run's; the log holds this one's
    (spec.local_dir / "result.json").write_text(json.dumps({"status": "completed", "job": "earlier"}))
    world = World()
    (o,) = _runner(world, clock, lines).run([spec])
    assert o.ok and o.result["job"] == "sid-0" and not err.exists()
    assert json.loads((spec.local_dir / "result.json").read_text())["job"] == "sid-0"


def test_a_failed_job_is_resubmitted_under_a_new_id_and_counts_its_attempts(tmp_path):
    world, clock, lines = World(final={"sid-0": "FAILED", "sid-1": "FAILED", "sid-1-retry1": "FAILED"}), Clock(), []
    outcomes = _runner(world, clock, lines, max_retries=1).run(_specs(tmp_path, 3))
    assert [(o.ok, o.attempts) for o in outcomes] == [(True, 2), (False, 2), (True, 1)]
    assert outcomes[0].result["job"] == "sid-0-retry1"  # the second attempt's result, in the same folder
    assert set(world.jobs) == {"sid-0", "sid-0-retry1", "sid-1", "sid-1-retry1", "sid-2"}
    assert sum("resubmitting into the same folder" in ln for ln in lines) == 2
    rec = json.loads((tmp_path / "local" / "1" / "ray_job.json").read_text())
    assert rec["attempts"] == 2 and rec["status"] == "FAILED"


def test_a_refused_config_is_not_resubmitted(tmp_path):
    world, clock, lines = World(final={"sid-0": "FAILED"}, pad="[rlkit] config error: sampling.max_rounds=3 ...\n"), Clock(), []
    (o,) = _runner(world, clock, lines, max_retries=2).run(_specs(tmp_path, 1))
    assert not o.ok and o.attempts == 1 and set(world.jobs) == {"sid-0"}


def test_a_stopped_job_is_not_resubmitted_unless_asked(tmp_path):
    """`ray job stop` (docs/hyperpod.md) ends a job for good: max_retries resubmits FAILED jobs only, a STOPPED one
    with hydra.launcher.retry_stopped=true."""
    world, clock, lines = World(final={"sid-0": "STOPPED", "sid-1": "FAILED"}), Clock(), []
    outcomes = _runner(world, clock, lines, max_retries=2).run(_specs(tmp_path, 2))
    assert [(o.ok, o.status, o.attempts) for o in outcomes] == [(False, "STOPPED", 1), (True, "SUCCEEDED", 2)]
    assert set(world.jobs) == {"sid-0", "sid-1", "sid-1-retry1"}
    assert any("[job 0] STOPPED: not resubmitted" in ln and "retry_stopped=true" in ln for ln in lines), lines

    world, clock, lines = World(final={"sid-0": "STOPPED"}), Clock(), []
    (o,) = _runner(world, clock, lines, max_retries=1, retry_stopped=True).run(_specs(tmp_path / "again", 1))
    assert o.ok and o.attempts == 2 and set(world.jobs) == {"sid-0", "sid-0-retry1"}


def test_an_error_raised_in_a_worker_is_not_resubmitted(tmp_path):
    """A bug in a worker (rlkit.recipes.heal.WorkerError) fails the same way again; a lost worker past
    trainer.max_failures (WorkerLostError) is resubmitted: the rerun resumes on a healthy cluster."""
    world, clock, lines = World(final={"sid-0": "FAILED"}, pad="[rlkit] worker error: RolloutWorker.rollout raised "
                                "RuntimeError: boom (at envs/x.py:3 in step)\n"), Clock(), []
    (o,) = _runner(world, clock, lines, max_retries=2).run(_specs(tmp_path, 1))
    assert not o.ok and o.attempts == 1 and set(world.jobs) == {"sid-0"}

    world, clock, lines = World(final={"sid-0": "FAILED"}, pad="rlkit.recipes.heal.WorkerLostError: a worker died "
                                "(ActorDiedError: ...) at step 3; trainer.max_failures=2 spent.\n"), Clock(), []
    (o,) = _runner(world, clock, lines, max_retries=1).run(_specs(tmp_path / "lost", 1))
    assert o.ok and o.attempts == 2
