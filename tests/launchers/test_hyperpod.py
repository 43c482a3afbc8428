"""``sagemaker_ray://`` without AWS: the real toolkit-for-ray-on-sagemaker-ai against a mocked EKS API and
a mocked secured dashboard endpoint (tests/launchers/mock_hyperpod.py), both TLS on 127.0.0.1.

The dashboard mock forwards authenticated requests to the session's local Ray cluster, so the
``launcher=hyperpod`` sweep below goes through the same code path as on HyperPod: Ray imports the
``sagemaker_ray`` module, the toolkit reads the kubeconfig, creates a RayDashboardConnection,
exchanges the token for a session cookie, and the Jobs API calls carry that cookie. The mock expires
sessions after a few requests, as HyperPod does after six hours, to check that the launcher
re-authenticates instead of losing the sweep.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launchers.conftest import APP, REPO, run_sweep
from tests.launchers.mock_hyperpod import GROUP, MockDashboard, MockEKS, make_certs, write_kubeconfig

pytest.importorskip("sagemaker_ray", reason="pip install toolkit-for-ray-on-sagemaker-ai")

TOKEN = "eks-static-token-123"
SECRET = "not-a-real-key-51c0"


@pytest.fixture
def hyperpod(tmp_path, monkeypatch):
    """Mock EKS + dashboard; kubeconfig and CA trust set in this process's environment. The dashboard
    forwards to nothing until a test points ``dash.upstream`` at a Ray dashboard."""
    certs = make_certs(tmp_path / "tls")
    dash = MockDashboard(certs=certs, upstream="http://127.0.0.1:9")
    eks = MockEKS(certs, token=TOKEN, clusters={("team-a", "rlkit"): dash})
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", eks.url, certs.ca, TOKEN)
    env = {"KUBECONFIG": str(kubeconfig), "REQUESTS_CA_BUNDLE": str(certs.ca)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield eks, dash, env
    eks.close()
    dash.close()


def test_toolkit_resolves_the_cluster_through_eks_and_bearer_auth(hyperpod):
    import sagemaker_ray

    eks, dash, _ = hyperpod
    info = sagemaker_ray.get_job_submission_client_cluster_info("rlkit/team-a")
    # What Ray's SubmissionClient gets: https dashboard address + the session cookie.
    assert info.address == dash.url
    assert info.cookies == {"ray_session": "session-1"}
    # The RayDashboardConnection request, authenticated with the kubeconfig's token.
    (req,) = eks.requests
    assert req.path == f"/apis/{GROUP}/v1alpha1/namespaces/team-a/raydashboardconnections"
    assert req.authorization == f"Bearer {TOKEN}"
    assert req.content_type == "application/json"
    assert req.body == {"apiVersion": f"{GROUP}/v1alpha1", "kind": "RayDashboardConnection",
                        "metadata": {"generateName": "rlkit-", "namespace": "team-a"},
                        "spec": {"clusterName": "rlkit"}}
    # The token from status.connectionUrl was exchanged once at /bearer-auth.
    assert dash.exchanges == ["jwt-1"]


def test_toolkit_errors_become_launcher_errors_with_a_fix(hyperpod, tmp_path, monkeypatch):
    from launchers.ray_jobs import LauncherError, connect

    with pytest.raises(LauncherError, match=r"(?s)Resource not found.*kubectl get rayclusters"):
        connect("sagemaker_ray://no-such-cluster/team-a")
    eks, _, _ = hyperpod
    write_kubeconfig(tmp_path / "bad", eks.url, Path(hyperpod[2]["REQUESTS_CA_BUNDLE"]), "wrong-token")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "bad"))
    with pytest.raises(LauncherError, match="Authentication failed when calling the K8s API"):
        connect("sagemaker_ray://rlkit/team-a")


def test_missing_toolkit_names_the_package(monkeypatch):
    import launchers.ray_jobs.connection as conn

    real = conn.importlib.util.find_spec
    monkeypatch.setattr(conn.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sagemaker_ray" else real(name, *a))
    with pytest.raises(conn.LauncherError, match="pip install toolkit-for-ray-on-sagemaker-ai"):
        conn.check_address("sagemaker_ray://rlkit/team-a")


def test_hyperpod_sweep_through_the_real_toolkit(ray_cluster, hyperpod, tmp_path):
    eks, dash, env = hyperpod
    dash.upstream = ray_cluster.dashboard_url
    dash.expire_after = 8  # sessions die after 8 requests: the sweep must re-authenticate
    fsx = tmp_path / "fsx" / "rlkit" / "sweep"  # the "cluster side" folder (stands for /shared/rlkit/...)
    sweep_dir = tmp_path / "multirun"
    sweep = run_sweep(APP, [
        "x=1,2", "+launcher=hyperpod",
        "hydra.launcher.address=sagemaker_ray://rlkit/team-a",
        f"hydra.launcher.python={sys.executable}", f"hydra.launcher.code_dir={REPO}",
        f"hydra.launcher.sweep_dir={fsx}", "hydra.launcher.poll_interval_s=0.5",
        "hydra.launcher.max_concurrent_jobs=2",
        "report_env=[RLKIT_SHARED_DIR,WANDB_RUN_GROUP]", "report_secret_env=[WANDB_API_KEY]",
    ], cwd=tmp_path, sweep_dir=sweep_dir, env_extra={**env, "WANDB_API_KEY": SECRET})
    assert sweep.returncode == 0, sweep.output[-5000:]

    rows = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert [(r["job"], r["status"], r["success_after"]) for r in rows] == [("0", "completed", 0.1),
                                                                          ("1", "completed", 0.2)]
    for job in ("0", "1"):
        res = json.loads((fsx / job / "result.json").read_text())          # written by the job
        assert json.loads((sweep_dir / job / "result.json").read_text()) == res  # mirrored for the summary
        assert res["env"]["RLKIT_SHARED_DIR"] == "/shared/rlkit"        # launcher env_vars
        assert res["env_sha256"]["WANDB_API_KEY"] is None               # secrets are not passed on HyperPod
        assert not res["cwd"].startswith(str(REPO))                     # code was uploaded (working_dir)
    assert "[job 1] sweep_app x=2 line 2" in sweep.stdout

    # Every Jobs API call went through the secured endpoint with a session cookie; sessions expired
    # and the launcher came back through the toolkit (a new RayDashboardConnection, a new cookie).
    assert len(eks.requests) >= 2, "expected a re-authentication"
    assert all(r.authorization == f"Bearer {TOKEN}" and r.body["spec"] == {"clusterName": "rlkit"}
               for r in eks.requests)
    assert dash.exchanges == [f"jwt-{i + 1}" for i in range(len(eks.requests))]
    assert any(r.status == 401 for r in dash.requests)
    ok = [r for r in dash.requests if r.status != 401]
    assert {r.path for r in ok} >= {"/api/version", "/api/jobs/"}
    assert any(r.path.startswith("/api/packages/") and r.method == "PUT" for r in ok)  # the upload
    assert all(r.session and r.session.startswith("session-") for r in ok)
    for p in sweep_dir.rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
