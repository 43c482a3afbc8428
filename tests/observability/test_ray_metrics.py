"""Ray metrics export: a gauge set the way the loop does shows up on a local Ray node's Prometheus
endpoint as ray_rlkit_*; nothing is exported (and Ray is not imported) outside a Ray cluster; the
Grafana dashboard queries exactly the names the exporter produces."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from rlkit.loggers import ConsoleLogger, MultiLogger
from rlkit.metrics_export import RAY_JOB_ENV, RayMetricsLogger, metric_name, with_cluster_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "rlkit_training.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 token auth: set explicitly, client and cluster agree
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", RAY_JOB_ENV):
        env.pop(k, None)
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    return env


def test_metric_names():
    assert metric_name("eval/success_rate") == "rlkit_eval_success_rate"
    assert metric_name("eval/pass@4") == "rlkit_eval_pass_at_4"
    assert metric_name("timing/rollout") == "rlkit_timing_rollout"
    assert metric_name("reward/shaped_distance/progress") == "rlkit_reward_shaped_distance_progress"


def test_no_ray_no_export(monkeypatch, tmp_path):
    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    base = ConsoleLogger()
    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        assert with_cluster_metrics(base) is base
    lg = RayMetricsLogger(mode="auto")
    if "ray" not in sys.modules:
        lg.start(tmp_path / "a" / "b", {}, "lr=1", None, None)
        assert not lg.active and "ray" not in sys.modules  # auto mode never imports or starts Ray
    off = RayMetricsLogger(mode="off")
    off.start(tmp_path, {}, "x", None, None)
    off.log({"reward/mean": 1.0}, 1)
    assert not off.active


def test_ray_job_entrypoint_gets_ray_metrics(monkeypatch):
    monkeypatch.setenv(RAY_JOB_ENV, "{}")
    monkeypatch.setenv("RLKIT_RAY_METRICS_LINGER_S", "0")
    wrapped = with_cluster_metrics(ConsoleLogger())
    assert isinstance(wrapped, MultiLogger) and len(wrapped.find(RayMetricsLogger)) == 1
    assert wrapped.find(RayMetricsLogger)[0].linger_s == 0.0
    explicit = MultiLogger({"r": RayMetricsLogger(mode="on")})
    assert with_cluster_metrics(explicit) is explicit  # already there: not added twice


def test_tags(tmp_path):
    lg = RayMetricsLogger(mode="off")
    lg.start(tmp_path / "sweep-09-00" / "1", {}, "experiment=smoke lr=1e-05", "sweep-09-00", None)
    assert lg.tags == {"run": "sweep-09-00/1", "group": "sweep-09-00", "overrides": "experiment=smoke lr=1e-05"}


_DRIVER = textwrap.dedent("""
    import sys, time
    import ray
    from rlkit.metrics_export import RayMetricsLogger
    port, out = int(sys.argv[1]), sys.argv[2]
    ray.init(num_cpus=1, include_dashboard=False, _metrics_export_port=port, log_to_driver=False,
             configure_logging=False)
    lg = RayMetricsLogger(mode="auto", linger_s=0)   # auto: Ray is initialized in this process
    lg.start(out, {}, "experiment=smoke", "sweep-test", None)
    assert lg.active, "auto mode must export inside an initialized Ray driver"
    for step in range(1, 4):                           # what NativeRun._log does each step
        lg.log({"reward/mean": 0.25 * step, "eval/success_rate": 0.5, "timing/rollout": 1.5,
                "policy/approx_kl": 0.001, "note": "strings are skipped"}, step)
        time.sleep(0.2)
    print("READY", flush=True)
    import os, threading
    failsafe = threading.Timer(float(sys.argv[3]), lambda: os._exit(3))  # if the test dies
    failsafe.daemon = True
    failsafe.start()
    sys.stdin.readline()                               # the test says when it has scraped
    lg.finish()
    ray.shutdown()
""")


@pytest.mark.slow  # 16 s: starts its own Ray instance with metrics export
def test_gauges_reach_the_ray_prometheus_endpoint(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(port), str(tmp_path / "2026-01-01" / "run7"), "150"],
                            env=_ray_env(), cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    found, body = None, ""
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(1)
                continue
            lines = [ln for ln in body.splitlines() if ln.startswith("ray_rlkit_reward_mean{")]
            if lines:
                found = lines[0]
                break
            time.sleep(1)
    finally:  # let the driver finish and shut Ray down itself (it stops the node processes it started)
        try:
            log = proc.communicate("stop\n", timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.terminate()
            log = proc.communicate(timeout=30)[0]
    assert found, f"ray_rlkit_reward_mean not scraped from :{port}/metrics\nDRIVER LOG:\n{log[-3000:]}\nBODY:\n{body[:1500]}"
    assert 'run="2026-01-01/run7"' in found and 'group="sweep-test"' in found and 'overrides="experiment=smoke"' in found
    assert found.rsplit(" ", 1)[1] == "0.75"  # the last value set (step 3)
    for name in ("ray_rlkit_eval_success_rate{", "ray_rlkit_timing_rollout{", "ray_rlkit_trainer_step{"):
        assert name in body, name
    assert "ray_rlkit_note" not in body


def _dashboard_metrics() -> set[str]:
    import re

    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    for p in dash["panels"]:
        exprs += [t["expr"] for t in p.get("targets", [])]
    return set(re.findall(r"\bray_rlkit_[A-Za-z0-9_]+", " ".join(exprs)))


def test_dashboard_is_valid_and_uses_a_prometheus_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for word in ("eval success", "reward", "kl", "clip", "phase", "gpu"):
        assert word in titles, word


def test_dashboard_queries_metrics_the_run_exports(smoke_run):
    """Every ray_rlkit_* name in the dashboard is the exported name of a key the smoke run logged."""
    keys = set()
    for ln in (smoke_run.out / "metrics.jsonl").read_text().splitlines():
        keys |= set(json.loads(ln)) - {"step"}
    exported = {"ray_" + metric_name(k) for k in keys} | {"ray_" + metric_name("trainer/step")}
    used = _dashboard_metrics()
    assert used, "no ray_rlkit_ metric in the dashboard"
    assert used <= exported, sorted(used - exported)


@pytest.mark.slow
def test_train_job_on_a_local_ray_cluster_exports_its_step_metrics(tmp_path, obs_tmp):
    """End to end: a private ``ray start --head --metrics-export-port`` cluster, train.py submitted as
    a Ray Job with the default logger choice (console): the job detects it is a Ray Job entrypoint,
    connects, and its step metrics appear on the node's Prometheus endpoint while it runs (~1-2 min)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    temp_dir = Path(tempfile.mkdtemp(prefix="rlk-obs-ray-", dir="/tmp"))
    metrics_port, dash = _free_port(), _free_port()
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={_free_port()}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
           "--include-dashboard=true", f"--ray-client-server-port={_free_port()}",
           f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={metrics_port}",
           "--num-cpus=1", "--num-gpus=0", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    head = subprocess.Popen(cmd, stdout=open(temp_dir / "ray_start.log", "w"), stderr=subprocess.STDOUT,
                            env=_ray_env(), start_new_session=True)
    out = tmp_path / "job"
    found = ""
    try:
        url = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/version", timeout=2)
                break
            except OSError:
                assert head.poll() is None and time.time() < deadline, (temp_dir / "ray_start.log").read_text()[-3000:]
                time.sleep(1)
        client = JobSubmissionClient(url)
        env_vars = {"WANDB_MODE": "offline", "RLKIT_CACHE_DIR": str(obs_tmp / "cache"), "PYTHONPATH": str(ROOT),
                    "RAY_AUTH_MODE": "disabled"}
        job = client.submit_job(entrypoint=f"{sys.executable} {ROOT / 'train.py'} experiment=smoke logger=console "
                                           f"steps=6 hydra.run.dir={out}",
                                runtime_env={"env_vars": env_vars})
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                found = "\n".join(ln for ln in body.splitlines() if ln.startswith("ray_rlkit_reward_mean{"))
            except OSError:
                pass
            status = client.get_job_status(job)
            if found or status in (JobStatus.FAILED, JobStatus.STOPPED):
                break
            time.sleep(2)
        assert found, f"no ray_rlkit_reward_mean while the job ran (status {status}):\n{client.get_job_logs(job)[-3000:]}"
        assert f'run="{out.parent.name}/job"' in found and 'overrides="experiment=smoke,logger=console,steps=6' in found
        while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.time() < deadline
            time.sleep(2)
        assert client.get_job_status(job) == JobStatus.SUCCEEDED, client.get_job_logs(job)[-3000:]
        assert json.loads((out / "result.json").read_text())["steps_completed"] == 6
    finally:
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)  # ray start --block stops its node processes on SIGTERM
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)



def test_required_export_without_a_cluster_names_the_fix(monkeypatch, tmp_path):
    """logger=ray_metrics (mode=on) with no cluster to join: a ConnectionError (train.py prints it as
    '[rlkit] connection error: ...', no traceback) that names the address and the three ways out."""
    import ray

    import rlkit.metrics_export as me

    def refuse(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(me, "ray_active", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    lg = RayMetricsLogger(mode="on", address="10.0.0.9:6379")
    with pytest.raises(me.RayMetricsUnavailable) as err:  # a ConnectionError train.py prints as one line
        lg.start(tmp_path, {}, "x", None, None)
    msg = str(err.value)
    assert "'10.0.0.9:6379'" in msg and "Ray instance. Start one" in msg  # no doubled full stop
    assert "logger.loggers.<name>.address under logger=multi" in msg and "RAY_ADDRESS" in msg and not lg.active
