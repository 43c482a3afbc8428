"""HyperPod manifests (launchers/manifests.py, scripts/hyperpod_cluster.py) validated offline against the
KubeRay v1 CRD schemas. The tests read them from ../shared/k8s beside the clone where a checkout keeps them
(the product never looks outside the repository: --schemas DIR or $RLKIT_KUBERAY_SCHEMAS; without either the
script skips the CRD validation with a notice)."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from launchers.manifests import (
    ENDPOINT_ANNOTATION, FSX_CSI_DRIVER, SCHEMAS_ENV, ManifestError, default_schema_dir, load_config, load_crd_schema,
    missing_crd_schemas, problems, render, strict_schema, validate,
)

REQUIRED = ["image=123456789012.dkr.ecr.us-west-2.amazonaws.com/rlkit:0.1",
            "fsx.file_system_id=fs-0123456789abcdef0",
            "fsx.dns_name=fs-0123456789abcdef0.fsx.us-west-2.amazonaws.com", "fsx.mount_name=abcdefgh"]


@pytest.fixture(scope="module")
def schemas(repo_root):
    d = repo_root.parent / "shared" / "k8s"
    if not (d / "kuberay_v1_rayclusters_schema.json").is_file():  # a plain clone: as tests/envs/conftest.py does
        pytest.skip(f"KubeRay CRD schemas not found in {d} (../shared/k8s beside the clone)")
    return d


def test_default_manifests_validate_and_hold_the_cluster_shape(schemas):
    docs = render(load_config(REQUIRED + ["namespace=team-a", "rayjob.enabled=true",
                                          "secret_env.WANDB_API_KEY=wandb/api-key"]))
    validate(docs, schemas)
    assert list(docs) == ["fsx-pv.yaml", "fsx-pvc.yaml", "raycluster.yaml", "rayjob.yaml"]
    pv, pvc, rc = docs["fsx-pv.yaml"], docs["fsx-pvc.yaml"], docs["raycluster.yaml"]
    assert pv["spec"]["csi"]["driver"] == FSX_CSI_DRIVER
    assert pv["spec"]["csi"]["volumeHandle"] == "fs-0123456789abcdef0"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert rc["metadata"]["annotations"][ENDPOINT_ANNOTATION] == "true"
    head = rc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "ml.r5d.16xlarge"
    (workers,) = rc["spec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 3
    wpod = workers["template"]["spec"]
    assert wpod["nodeSelector"]["node.kubernetes.io/instance-type"] == "ml.g7e.12xlarge"
    res = wpod["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == 2
    for pod in (head["template"]["spec"], wpod):
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["shared"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
        assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts == {"/shared", "/dev/shm"}
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}
    job = docs["rayjob.yaml"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "rlkit"}
    assert "python train.py" in job["spec"]["entrypoint"]
    own = render(load_config(REQUIRED + ["rayjob.enabled=true", "rayjob.own_cluster=true"]))
    validate(own, schemas)
    assert own["rayjob.yaml"]["spec"]["shutdownAfterJobFinishes"] is True


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["raycluster.yaml"]["spec"].__setitem__(
        "workerGroupSpec", d["raycluster.yaml"]["spec"].pop("workerGroupSpecs")), "'workerGroupSpec' was unexpected"),
    (lambda d: d["raycluster.yaml"]["spec"]["headGroupSpec"].__setitem__(
        "rayStartParam", d["raycluster.yaml"]["spec"]["headGroupSpec"].pop("rayStartParams")),
     "'rayStartParam' was unexpected"),
    (lambda d: d["raycluster.yaml"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].__setitem__(
        "volumeMount", []), "'volumeMount' was unexpected"),
    (lambda d: d["raycluster.yaml"]["metadata"].__setitem__("annotation", {}), "'annotation' was unexpected"),
    (lambda d: d["raycluster.yaml"]["spec"]["workerGroupSpecs"][0].__setitem__("replicas", "3"), "is not of type"),
    (lambda d: d["fsx-pvc.yaml"]["spec"].__setitem__("accesModes", ["ReadWriteMany"]), "'accesModes' was unexpected"),
    (lambda d: d["fsx-pv.yaml"]["spec"]["csi"].pop("volumeHandle"), "'volumeHandle' is a required property"),
    (lambda d: d["fsx-pvc.yaml"]["spec"].__setitem__("volumeName", "other-pv"), "is not the PV"),
    (lambda d: d["raycluster.yaml"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
     ["resources"]["requests"].__setitem__("nvidia.com/gpu", 1), "requests must equal limits"),
])
def test_typos_and_inconsistencies_fail_validation(schemas, mutate, expected):
    docs = render(load_config(REQUIRED))
    mutate(docs)
    errors = problems(docs, schemas)
    assert any(expected in e for e in errors), errors
    with pytest.raises(ManifestError):
        validate(docs, schemas)


def test_strict_schema_keeps_open_maps_open(schemas):
    raw = load_crd_schema(schemas / "kuberay_v1_rayclusters_schema.json")
    strict = strict_schema(raw)
    spec = strict["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert "additionalProperties" not in raw["properties"]["spec"]  # the input is not modified
    rsp = spec["properties"]["headGroupSpec"]["properties"]["rayStartParams"]
    assert rsp["additionalProperties"] == {"type": "string"}  # any ray start flag is allowed


def test_crd_in_kubectl_form_loads(schemas, tmp_path):
    wrapped = json.loads((schemas / "kuberay_v1_rayclusters_schema.json").read_text())
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": wrapped["openAPIV3Schema"]}}]}}
    (tmp_path / "kuberay_v1_rayclusters_schema.json").write_text(json.dumps(crd))  # kubectl get crd -o json
    validate(render(load_config(REQUIRED)), tmp_path)
    with pytest.raises(ManifestError, match="CRD schema not found"):
        validate(render(load_config(REQUIRED)), tmp_path / "missing")


def test_config_errors_name_the_key():
    with pytest.raises(ManifestError, match="image"):
        load_config(REQUIRED[1:])
    with pytest.raises(ManifestError, match="workr"):
        load_config(REQUIRED + ["workr.replicas=2"])
    with pytest.raises(ManifestError, match="secret name"):
        render(load_config(REQUIRED + ["secret_env.WANDB_API_KEY=no-key"]))


def test_script_writes_valid_manifests(repo_root, schemas, tmp_path):
    script = repo_root / "scripts" / "hyperpod_cluster.py"
    out = tmp_path / "k8s"
    proc = subprocess.run([sys.executable, str(script), *REQUIRED, "worker.replicas=2", "--out", str(out),
                           "--schemas", str(schemas)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "kubectl apply -f" in proc.stdout and f"validated against {schemas}" in proc.stdout
    assert proc.stderr == ""  # the schemas were found: no skip notice
    rc = yaml.safe_load((out / "raycluster.yaml").read_text())
    assert rc["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    docs = {p.name: yaml.safe_load(p.read_text()) for p in sorted(out.glob("*.yaml"))}
    validate(docs, schemas)  # what was written validates, not just what was rendered
    bad = subprocess.run([sys.executable, str(script), *REQUIRED[:1]], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "fsx.file_system_id" in bad.stderr
    multi = subprocess.run([sys.executable, str(script), *REQUIRED], capture_output=True, text=True, timeout=120)
    assert [d["kind"] for d in yaml.safe_load_all(multi.stdout)] == \
        ["PersistentVolume", "PersistentVolumeClaim", "RayCluster"]


def test_rendered_docs_are_independent_copies():
    conf = load_config(REQUIRED)
    a, b = render(conf), render(copy.deepcopy(conf))
    a["raycluster.yaml"]["metadata"]["labels"]["x"] = "y"
    assert "x" not in b["raycluster.yaml"]["metadata"]["labels"]


def _script_module(repo_root):
    spec = importlib.util.spec_from_file_location("rlkit_script_hyperpod_cluster",
                                                  repo_root / "scripts" / "hyperpod_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_in_a_plain_clone_skips_the_crd_schemas_and_renders(repo_root, tmp_path, monkeypatch, capsys):
    """No --schemas and no $RLKIT_KUBERAY_SCHEMAS: one notice on stderr, the manifests are still written and
    the checks that need no outside data still run."""
    script = _script_module(repo_root)
    monkeypatch.delenv(SCHEMAS_ENV, raising=False)
    assert default_schema_dir() is None
    out = tmp_path / "k8s"
    assert script.main([*REQUIRED, "rayjob.enabled=true", "--out", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    (line,) = stderr.strip().splitlines()
    assert line.startswith("schema validation skipped: no kuberay_v1_rayclusters_schema.json / "
                           f"kuberay_v1_rayjobs_schema.json (${SCHEMAS_ENV} is not set)")
    assert "--schemas DIR" in line
    assert "validated against" not in stdout and "kubectl apply -f" in stdout
    assert sorted(p.name for p in out.glob("*.yaml")) == ["fsx-pv.yaml", "fsx-pvc.yaml", "raycluster.yaml",
                                                          "rayjob.yaml"]
    assert yaml.safe_load((out / "raycluster.yaml").read_text())["kind"] == "RayCluster"
    # to stdout as one multi-document YAML: the notice stays on stderr, the YAML parses whole
    assert script.main(REQUIRED) == 0
    stdout, stderr = capsys.readouterr()
    assert stderr.startswith("schema validation skipped: no kuberay_v1_rayclusters_schema.json (")
    assert [d["kind"] for d in yaml.safe_load_all(stdout)] == ["PersistentVolume", "PersistentVolumeClaim",
                                                                "RayCluster"]
    # without the CRD schemas the consistency checks still refuse a broken claim
    monkeypatch.setattr(script, "render", lambda conf: _broken_claim(render(conf)))
    assert script.main(REQUIRED) == 2
    assert "is not the PV" in capsys.readouterr().err
    # an explicit --schemas folder that lacks them is still an error, not a skip
    assert script.main([*REQUIRED, "--schemas", str(tmp_path / "none")]) == 2
    assert "CRD schema not found" in capsys.readouterr().err


def test_script_reads_the_schema_folder_from_the_environment(repo_root, schemas, tmp_path, monkeypatch, capsys):
    """$RLKIT_KUBERAY_SCHEMAS names the folder when --schemas is not given: validated against it when it holds
    the schemas, the skip notice naming it when it does not."""
    script = _script_module(repo_root)
    monkeypatch.setenv(SCHEMAS_ENV, str(schemas))
    assert script.main(REQUIRED) == 0
    assert capsys.readouterr().err == ""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(SCHEMAS_ENV, str(empty))
    assert script.main(REQUIRED) == 0
    assert capsys.readouterr().err.startswith(
        f"schema validation skipped: no kuberay_v1_rayclusters_schema.json in {empty};")


def _broken_claim(docs):
    docs["fsx-pvc.yaml"]["spec"]["volumeName"] = "other-pv"
    return docs


def test_missing_crd_schemas_names_what_the_manifests_need(schemas, tmp_path):
    plain = render(load_config(REQUIRED))
    with_job = render(load_config(REQUIRED + ["rayjob.enabled=true"]))
    assert missing_crd_schemas(plain, schemas) == [] and missing_crd_schemas(with_job, schemas) == []
    assert missing_crd_schemas(plain, tmp_path) == ["kuberay_v1_rayclusters_schema.json"]
    assert missing_crd_schemas(with_job, tmp_path) == ["kuberay_v1_rayclusters_schema.json",
                                                       "kuberay_v1_rayjobs_schema.json"]
    validate(with_job, None)  # the PV/PVC schemas and consistency only
    bad = render(load_config(REQUIRED))
    bad["raycluster.yaml"]["spec"]["workerGroupSpec"] = bad["raycluster.yaml"]["spec"].pop("workerGroupSpecs")
    assert problems(bad, None) == []  # a CRD typo goes unseen without the CRD schemas...
    assert any("'workerGroupSpec' was unexpected" in e for e in problems(bad, schemas))  # ...and is caught with them
