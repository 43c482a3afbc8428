"""Kubernetes manifests for rlkit on SageMaker HyperPod, rendered from config and validated offline.

Rendered (``render``), one document each:
- ``fsx-pv.yaml``: a static FSx for Lustre PersistentVolume (CSI driver ``fsx.csi.aws.com``);
- ``fsx-pvc.yaml``: its ReadWriteMany PersistentVolumeClaim, bound by ``volumeName``;
- ``raycluster.yaml``: a KubeRay ``ray.io/v1`` RayCluster: the head on a CPU node
  (``rayStartParams.num-cpus: "0"``, so no work lands there) and one GPU worker group, every pod
  mounting the claim at ``/shared`` and a memory-backed ``emptyDir`` at ``/dev/shm``, with the
  annotation ``access.sagemaker.amazonaws.com/enabled: "true"`` that asks the HyperPod Ray
  Endpoint Operator for the authenticated endpoint the ``sagemaker_ray://`` toolkit uses (needed
  when the operator was installed with ``manager.enableEndpointsByDefault=false``);
- ``rayjob.yaml`` (when ``rayjob.enabled``): a RayJob running one ``train.py`` job, on the
  RayCluster above (``clusterSelector``) or on a cluster of its own.

Validation (``validate``) is offline: the RayCluster/RayJob against KubeRay's v1 CRD
``openAPIV3Schema`` (not shipped with the repository: a folder holding ``kuberay_v1_rayclusters_schema.json``
and ``kuberay_v1_rayjobs_schema.json``, e.g. your cluster's ``kubectl get crd rayclusters.ray.io -o json``
saved under that name; ``schema_dir=None`` skips this part), the PV/PVC against a minimal schema written
here, and cross-document checks (claim names, mount paths, GPU requests == limits). Kubernetes prunes or
rejects fields a structural schema does not declare, but a JSON Schema only rejects them under
``additionalProperties: false``; :func:`strict_schema` adds that to every object that lists its
``properties`` and leaves open maps (``additionalProperties`` given) and
``x-kubernetes-preserve-unknown-fields`` nodes alone, so a typo such as ``workerGroupSpec`` or
``rayStartParam`` fails here as it would under ``kubectl apply --validate=strict``. CEL rules
(``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import copy
import functools
import json
import shlex
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

FSX_CSI_DRIVER = "fsx.csi.aws.com"
ENDPOINT_ANNOTATION = "access.sagemaker.amazonaws.com/enabled"
RAYCLUSTER_SCHEMA = "kuberay_v1_rayclusters_schema.json"
RAYJOB_SCHEMA = "kuberay_v1_rayjobs_schema.json"


class ManifestError(ValueError):
    """A manifest config value is missing or wrong, or a rendered manifest fails validation."""


# ----------------------------------------------------------------------------------------------
# config (structured: unknown keys fail when the config is built)


@dataclass
class FSxConf:
    """A FSx for Lustre file system (created beforehand in the cluster's VPC/subnet)."""

    file_system_id: str = MISSING       # fs-0123456789abcdef0
    dns_name: str = MISSING             # fs-0123456789abcdef0.fsx.<region>.amazonaws.com
    mount_name: str = MISSING           # from `aws fsx describe-file-systems` (LustreConfiguration.MountName)
    capacity: str = "1200Gi"            # the file system's storage capacity
    pv_name: str = "rlkit-fsx-pv"
    pvc_name: str = "rlkit-fsx-claim"
    mount_path: str = "/shared"


@dataclass
class HeadConf:
    instance_type: str = "ml.r5d.16xlarge"  # 64 vCPU, 512 GiB: a CPU node; Ray runs no tasks here
    cpu: str = "8"
    memory: str = "64Gi"
    shm_size: str = "16Gi"


@dataclass
class WorkerConf:
    group_name: str = "gpu-workers"
    instance_type: str = "ml.g7e.12xlarge"
    replicas: int = 3
    # GPUs per node: must equal the node's allocatable nvidia.com/gpu (`kubectl describe node`).
    gpus: int = 2
    cpu: str = "40"                     # requests/limits below the node's allocatable
    memory: str = "400Gi"
    shm_size: str = "64Gi"              # NCCL and vLLM use /dev/shm


@dataclass
class RayJobConf:
    enabled: bool = False
    name: str = "rlkit-train"
    # Where the image holds the repo (docker/Dockerfile: /opt/rlkit). A RayJob runs the image's code;
    # the sweep launchers upload your working tree instead.
    code_dir: str = "/opt/rlkit"
    overrides: list[str] = field(default_factory=list)   # train.py overrides, e.g. [lr=3e-5]
    # false: run on the RayCluster above (clusterSelector); true: a cluster of its own, deleted after.
    own_cluster: bool = False
    ttl_seconds_after_finished: int = 600


@dataclass
class ClusterConf:
    """Everything ``scripts/hyperpod_cluster.py`` renders; override with ``key=value`` arguments."""

    name: str = "rlkit"
    namespace: str = "default"
    image: str = MISSING                # your image: docker/Dockerfile pushed to ECR (Ray 2.60.0 + rlkit + SkyRL)
    ray_version: str = "2.60.0"
    annotations: dict[str, str] = field(default_factory=lambda: {ENDPOINT_ANNOTATION: "true"})
    env: dict[str, str] = field(default_factory=lambda: {
        "HF_HOME": "/shared/hf-cache", "RLKIT_SHARED_DIR": "/shared/rlkit", "RLKIT_CACHE_DIR": "/shared/rlkit/cache"})
    # Secrets as env vars from Kubernetes Secrets: ENV_NAME -> "<secret name>/<key>",
    # e.g. {WANDB_API_KEY: wandb/api-key} after `kubectl create secret generic wandb --from-literal=api-key=...`.
    secret_env: dict[str, str] = field(default_factory=dict)
    head: HeadConf = field(default_factory=HeadConf)
    worker: WorkerConf = field(default_factory=WorkerConf)
    fsx: FSxConf = field(default_factory=FSxConf)
    rayjob: RayJobConf = field(default_factory=RayJobConf)


def load_config(overrides: list[str] = (), files: list[str] = ()) -> ClusterConf:
    """``ClusterConf`` from YAML ``files`` then ``key=value`` ``overrides`` (OmegaConf dotlist).

    Raises: ManifestError for an unknown key, a wrong type, or a required value left unset
    (image, fsx.file_system_id, fsx.dns_name, fsx.mount_name), naming the key.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        cfg = OmegaConf.structured(ClusterConf)
        for f in files:
            cfg = OmegaConf.merge(cfg, OmegaConf.load(f))
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ManifestError(
                "required manifest values not set: " + ", ".join(missing) + ". Pass them as key=value, e.g. "
                "image=<account>.dkr.ecr.<region>.amazonaws.com/rlkit:<tag> fsx.file_system_id=fs-... "
                "fsx.dns_name=fs-....fsx.<region>.amazonaws.com fsx.mount_name=<mount name>.")
        return OmegaConf.to_object(cfg)
    except (MissingMandatoryValue, OmegaConfBaseException) as e:
        raise ManifestError(f"bad manifest config: {e}") from e


# ----------------------------------------------------------------------------------------------
# rendering


def _env(conf: ClusterConf) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in conf.env.items()]
    for name, ref in conf.secret_env.items():
        secret, _, key = ref.partition("/")
        if not secret or not key:
            raise ManifestError(f"secret_env.{name}={ref!r}: use '<secret name>/<key>'.")
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def _volumes(conf: ClusterConf, shm_size: str) -> list[dict[str, Any]]:
    return [
        {"name": "shared", "persistentVolumeClaim": {"claimName": conf.fsx.pvc_name}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
    ]


def _mounts(conf: ClusterConf) -> list[dict[str, Any]]:
    return [{"name": "shared", "mountPath": conf.fsx.mount_path}, {"name": "dshm", "mountPath": "/dev/shm"}]


def raycluster_spec(conf: ClusterConf) -> dict[str, Any]:
    """The ``spec`` of the RayCluster (shared with a RayJob's ``rayClusterSpec``)."""
    h, w = conf.head, conf.worker
    head_res = {"cpu": h.cpu, "memory": h.memory}
    worker_res = {"cpu": w.cpu, "memory": w.memory, "nvidia.com/gpu": w.gpus}
    return {
        "rayVersion": conf.ray_version,
        "headGroupSpec": {
            # num-cpus 0: the head schedules no tasks or actors (and no job entrypoints).
            "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
            "template": {"spec": {
                "nodeSelector": {"node.kubernetes.io/instance-type": h.instance_type},
                "containers": [{
                    "name": "ray-head", "image": conf.image, "env": _env(conf),
                    "ports": [{"containerPort": 6379, "name": "gcs-server"},
                              {"containerPort": 8265, "name": "dashboard"},
                              {"containerPort": 10001, "name": "client"}],
                    "resources": {"requests": dict(head_res), "limits": dict(head_res)},
                    "volumeMounts": _mounts(conf),
                }],
                "volumes": _volumes(conf, h.shm_size),
            }},
        },
        "workerGroupSpecs": [{
            "groupName": w.group_name, "replicas": w.replicas, "minReplicas": w.replicas,
            "maxReplicas": w.replicas,
            # KubeRay passes --num-gpus from the container's nvidia.com/gpu limit.
            "rayStartParams": {},
            "template": {"spec": {
                "nodeSelector": {"node.kubernetes.io/instance-type": w.instance_type},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "ray-worker", "image": conf.image, "env": _env(conf),
                    "resources": {"requests": dict(worker_res), "limits": dict(worker_res)},
                    "volumeMounts": _mounts(conf),
                }],
                "volumes": _volumes(conf, w.shm_size),
            }},
        }],
    }


def render(conf: ClusterConf) -> dict[str, dict[str, Any]]:
    """File name -> manifest, in the order to apply them (PV, PVC, RayCluster[, RayJob])."""
    f = conf.fsx
    labels = {"app.kubernetes.io/name": "rlkit", "app.kubernetes.io/instance": conf.name}
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f.pv_name, "labels": dict(labels)},
        "spec": {
            "capacity": {"storage": f.capacity},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",   # deleting the PV never deletes data
            "storageClassName": "",                      # static provisioning: bind by name only
            "mountOptions": ["flock"],
            "csi": {"driver": FSX_CSI_DRIVER, "volumeHandle": f.file_system_id,
                    "volumeAttributes": {"dnsname": f.dns_name, "mountname": f.mount_name}},
        },
    }
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": f.pvc_name, "namespace": conf.namespace, "labels": dict(labels)},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f.pv_name,
                 "resources": {"requests": {"storage": f.capacity}}},
    }
    rc = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": conf.name, "namespace": conf.namespace, "labels": dict(labels),
                     "annotations": dict(conf.annotations)},
        "spec": raycluster_spec(conf),
    }
    docs = {"fsx-pv.yaml": pv, "fsx-pvc.yaml": pvc, "raycluster.yaml": rc}
    if conf.rayjob.enabled:
        j = conf.rayjob
        out_dir = f"{conf.fsx.mount_path}/rlkit/rayjobs/{j.name}"
        cmd = shlex.join(["python", "train.py", *j.overrides, f"hydra.run.dir={out_dir}"])
        spec: dict[str, Any] = {
            "entrypoint": f"cd {shlex.quote(j.code_dir)} && {cmd}",
            "runtimeEnvYAML": json.dumps({"env_vars": dict(conf.env)}),  # JSON is YAML
            "submissionMode": "K8sJobMode",
        }
        if j.own_cluster:
            spec.update({"rayClusterSpec": raycluster_spec(conf), "shutdownAfterJobFinishes": True,
                         "ttlSecondsAfterFinished": j.ttl_seconds_after_finished})
        else:
            spec["clusterSelector"] = {"ray.io/cluster": conf.name}
        docs["rayjob.yaml"] = {
            "apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": j.name, "namespace": conf.namespace, "labels": dict(labels),
                         "annotations": dict(conf.annotations)},
            "spec": spec,
        }
    return docs


def to_yaml(doc: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


# ----------------------------------------------------------------------------------------------
# schemas

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mkun])?$"}]}

OBJECT_META = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "labels": _STR_MAP, "annotations": _STR_MAP,
    },
}

_ACCESS_MODES = {"type": "array", "minItems": 1,
                 "items": {"enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]}}

#: The part of core/v1 PersistentVolume that these manifests use (unknown fields rejected).
PV_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "v1"}, "kind": {"const": "PersistentVolume"},
        "metadata": {**OBJECT_META, "properties": {k: v for k, v in OBJECT_META["properties"].items()
                                                   if k != "namespace"}},  # cluster-scoped
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["capacity", "accessModes"],
            "properties": {
                "capacity": {"type": "object", "additionalProperties": False, "required": ["storage"],
                             "properties": {"storage": _QUANTITY}},
                "accessModes": _ACCESS_MODES,
                "volumeMode": {"enum": ["Filesystem", "Block"]},
                "persistentVolumeReclaimPolicy": {"enum": ["Retain", "Delete", "Recycle"]},
                "storageClassName": {"type": "string"},
                "mountOptions": {"type": "array", "items": {"type": "string"}},
                "csi": {
                    "type": "object", "additionalProperties": False, "required": ["driver", "volumeHandle"],
                    "properties": {"driver": {"type": "string"}, "volumeHandle": {"type": "string"},
                                   "readOnly": {"type": "boolean"}, "fsType": {"type": "string"},
                                   "volumeAttributes": _STR_MAP},
                },
            },
        },
    },
}

#: The part of core/v1 PersistentVolumeClaim that these manifests use (unknown fields rejected).
PVC_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "v1"}, "kind": {"const": "PersistentVolumeClaim"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["accessModes", "resources"],
            "properties": {
                "accessModes": _ACCESS_MODES,
                "storageClassName": {"type": "string"},
                "volumeName": {"type": "string"},
                "volumeMode": {"enum": ["Filesystem", "Block"]},
                "resources": {"type": "object", "additionalProperties": False, "required": ["requests"],
                              "properties": {"requests": {
                                  "type": "object", "additionalProperties": False, "required": ["storage"],
                                  "properties": {"storage": _QUANTITY}}}},
            },
        },
    },
}


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 (structural) schema where unknown object fields are errors.

    Every object node with ``properties`` and no ``additionalProperties`` gets
    ``additionalProperties: false``; nodes marked ``x-kubernetes-preserve-unknown-fields`` stay open.
    The root ``metadata`` (``{type: object}`` in CRDs) becomes :data:`OBJECT_META`.
    """
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    if "metadata" in out.get("properties", {}):
        out["properties"]["metadata"] = copy.deepcopy(OBJECT_META)
    return out


def load_crd_schema(path: Path) -> dict[str, Any]:
    """The ``openAPIV3Schema`` from a schema file: rlkit's wrapped form (``{"openAPIV3Schema": ...}``)
    or a CRD as ``kubectl get crd <name> -o json|yaml`` prints it (first version).

    Raises: ManifestError when the file is missing or holds no schema.
    """
    import yaml

    if not path.is_file():
        raise ManifestError(f"CRD schema not found: {path}. Pass --schemas DIR holding {RAYCLUSTER_SCHEMA} and "
                            f"{RAYJOB_SCHEMA}, or a CRD from `kubectl get crd rayclusters.ray.io -o json`.")
    text = path.read_text()
    try:
        data = json.loads(text)  # PyYAML would take seconds on these 150-220 KB files
    except json.JSONDecodeError:
        data = yaml.safe_load(text)
    if isinstance(data, dict) and "openAPIV3Schema" in data:
        return data["openAPIV3Schema"]
    try:
        return data["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    except (KeyError, IndexError, TypeError):
        raise ManifestError(f"{path} holds no openAPIV3Schema (neither rlkit's form nor a CRD).") from None


def _strict_crd(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return load_crd_schema(path)  # raises the "not found" error
    st = path.stat()
    return _strict_crd_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _strict_crd_cached(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    return strict_schema(load_crd_schema(Path(path)))


#: Environment variable naming a folder with the KubeRay v1 CRD schemas, read when ``--schemas`` is not given.
SCHEMAS_ENV = "RLKIT_KUBERAY_SCHEMAS"


def default_schema_dir() -> Path | None:
    """The folder named by ``$RLKIT_KUBERAY_SCHEMAS`` (the KubeRay v1 CRD schemas are not part of the
    repository), or None when it is unset or empty; ``scripts/hyperpod_cluster.py`` then skips the CRD
    validation with a notice."""
    value = os.environ.get(SCHEMAS_ENV, "").strip()
    return Path(value) if value else None


def missing_crd_schemas(docs: dict[str, dict[str, Any]], schema_dir: Path | None) -> list[str]:
    """The CRD schema file names ``docs`` need that ``schema_dir`` lacks (all of them when it is None):
    ``RAYCLUSTER_SCHEMA`` always, ``RAYJOB_SCHEMA`` when a RayJob is rendered. Empty when validation against
    the CRDs can run."""
    needed = [RAYCLUSTER_SCHEMA]
    if any(d.get("kind") == "RayJob" for d in docs.values()):
        needed.append(RAYJOB_SCHEMA)
    return [name for name in needed if schema_dir is None or not (Path(schema_dir) / name).is_file()]


def validate(docs: dict[str, dict[str, Any]], schema_dir: Path | None) -> None:
    """Validate rendered manifests; raise one ManifestError listing every problem.

    Each problem names the file and the field path (``raycluster.yaml: spec: Additional properties
    are not allowed ('workerGroupSpec' was unexpected)``). ``schema_dir=None`` skips the KubeRay CRD
    schemas (the PV/PVC schemas and the cross-document checks still run).
    """
    errors = problems(docs, schema_dir)
    if errors:
        raise ManifestError("manifests do not validate:\n  " + "\n  ".join(errors))


def problems(docs: dict[str, dict[str, Any]], schema_dir: Path | None) -> list[str]:
    """Every schema and consistency problem of ``docs`` (empty when they are valid).

    ``schema_dir``: the folder with the KubeRay CRD schemas, or None to leave RayCluster/RayJob documents
    unchecked against them. Raises ManifestError when a folder is given but lacks a needed schema.
    """
    from jsonschema import Draft7Validator

    schemas: dict[str, dict[str, Any] | None] = {
        "PersistentVolume": PV_SCHEMA,
        "PersistentVolumeClaim": PVC_SCHEMA,
        "RayCluster": None,
        "RayJob": None,
    }
    if schema_dir is not None:
        schemas["RayCluster"] = _strict_crd(Path(schema_dir) / RAYCLUSTER_SCHEMA)
        if any(d.get("kind") == "RayJob" for d in docs.values()):
            schemas["RayJob"] = _strict_crd(Path(schema_dir) / RAYJOB_SCHEMA)
    out: list[str] = []
    for fname, doc in docs.items():
        kind = doc.get("kind")
        if kind not in schemas:
            out.append(f"{fname}: unknown kind {kind!r}")
            continue
        schema = schemas[kind]
        if schema is None:  # a CRD kind while the CRD schemas are skipped
            continue
        for err in sorted(Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in err.absolute_path) or "(root)"
            out.append(f"{fname}: {where}: {err.message}")
    if not out:
        out.extend(_consistency(docs))
    return out


def _pod_specs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = doc["spec"]
    if doc["kind"] == "RayJob":
        spec = spec.get("rayClusterSpec")
        if spec is None:
            return []
    out = [("headGroupSpec", spec["headGroupSpec"]["template"]["spec"])]
    for i, g in enumerate(spec.get("workerGroupSpecs", [])):
        out.append((f"workerGroupSpecs.{i}", g["template"]["spec"]))
    return out


def _consistency(docs: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    by_kind = {d["kind"]: (f, d) for f, d in docs.items()}
    pv = by_kind.get("PersistentVolume", (None, None))[1]
    pvc = by_kind.get("PersistentVolumeClaim", (None, None))[1]
    if pv is not None and pvc is not None:
        if pvc["spec"].get("volumeName") != pv["metadata"]["name"]:
            out.append(f"fsx-pvc.yaml: spec.volumeName {pvc['spec'].get('volumeName')!r} is not the PV "
                       f"{pv['metadata']['name']!r}")
        if pv["spec"].get("csi", {}).get("driver") != FSX_CSI_DRIVER:
            out.append(f"fsx-pv.yaml: spec.csi.driver must be {FSX_CSI_DRIVER}")
        if "ReadWriteMany" not in pvc["spec"]["accessModes"]:
            out.append("fsx-pvc.yaml: spec.accessModes must include ReadWriteMany (every pod mounts it)")
    claim = pvc["metadata"]["name"] if pvc is not None else None
    for fname, doc in docs.items():
        if doc["kind"] not in ("RayCluster", "RayJob"):
            continue
        if claim and doc["metadata"].get("namespace") != pvc["metadata"].get("namespace"):
            out.append(f"{fname}: namespace {doc['metadata'].get('namespace')!r} differs from the claim's "
                       f"{pvc['metadata'].get('namespace')!r}: pods can only mount claims of their namespace")
        for where, pod in _pod_specs(doc):
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            for c in pod["containers"]:
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
                shared = vols.get(mounts.get("/shared", ""), {})
                if claim and shared.get("persistentVolumeClaim", {}).get("claimName") != claim:
                    out.append(f"{fname}: {where}: container {c['name']} does not mount claim {claim!r} at /shared")
                shm = vols.get(mounts.get("/dev/shm", ""), {})
                if shm.get("emptyDir", {}).get("medium") != "Memory":
                    out.append(f"{fname}: {where}: container {c['name']} has no memory-backed emptyDir at /dev/shm")
                res = c.get("resources", {})
                lim, req = res.get("limits", {}), res.get("requests", {})
                if "nvidia.com/gpu" in lim and str(req.get("nvidia.com/gpu", lim["nvidia.com/gpu"])) != \
                        str(lim["nvidia.com/gpu"]):
                    out.append(f"{fname}: {where}: nvidia.com/gpu requests must equal limits")
    return out


def write(docs: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write each manifest as YAML into ``out_dir``; returns the paths in apply order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, doc in docs.items():
        p = out_dir / fname
        p.write_text(to_yaml(doc))
        paths.append(p)
    return paths


def conf_summary(conf: ClusterConf) -> str:
    """One line describing the cluster, for the script's output."""
    w = conf.worker
    return (f"RayCluster {conf.namespace}/{conf.name}: head on {conf.head.instance_type} (num-cpus 0), "
            f"{w.replicas} x {w.instance_type} with {w.gpus} GPU(s) each; FSx {conf.fsx.file_system_id} "
            f"at {conf.fsx.mount_path}")


__all__ = ["ClusterConf", "ManifestError", "load_config", "render", "validate", "problems", "write",
           "strict_schema", "load_crd_schema", "default_schema_dir", "SCHEMAS_ENV", "missing_crd_schemas", "PV_SCHEMA", "PVC_SCHEMA"]
