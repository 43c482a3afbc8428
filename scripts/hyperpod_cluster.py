"""Render and validate the Kubernetes manifests for rlkit on SageMaker HyperPod.

    python scripts/hyperpod_cluster.py image=<ecr image> fsx.file_system_id=fs-0abc... \
        fsx.dns_name=fs-0abc....fsx.us-west-2.amazonaws.com fsx.mount_name=abcdefgh --out k8s/
    kubectl apply -f k8s/fsx-pv.yaml -f k8s/fsx-pvc.yaml -f k8s/raycluster.yaml

Writes fsx-pv.yaml, fsx-pvc.yaml, raycluster.yaml (and rayjob.yaml with rayjob.enabled=true) after
validating them offline against the KubeRay v1 CRD schemas (unknown fields are errors) and a minimal
PV/PVC schema. The CRD schemas are not part of the repository: --schemas DIR names a folder holding
kuberay_v1_rayclusters_schema.json and kuberay_v1_rayjobs_schema.json (`kubectl get crd
rayclusters.ray.io -o json` saved under that name will do); without --schemas the script looks in
$RLKIT_KUBERAY_SCHEMAS, and where that is unset or lacks them it prints one line on stderr saying that
the CRD validation was skipped and renders anyway (the PV/PVC and cross-document checks still run). Settings are ``key=value`` overrides of ``launchers.manifests.ClusterConf`` (e.g.
``namespace=team-a worker.replicas=3 worker.gpus=2 secret_env.WANDB_API_KEY=wandb/api-key``), after
optional ``--config file.yaml`` files. Without --out, prints the manifests as one multi-document YAML.
Exit status 2 on a config or validation error, with the reason on stderr. See docs/hyperpod.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launchers.manifests import (
    SCHEMAS_ENV, ManifestError, conf_summary, default_schema_dir, load_config, missing_crd_schemas, render, to_yaml,
    validate, write,
)


def skip_line(schema_dir: Path | None, missing: list[str]) -> str:
    """The one line printed when the KubeRay CRD schemas are absent (``schema_dir`` None: $RLKIT_KUBERAY_SCHEMAS
    unset) and their validation is skipped."""
    where = f"in {schema_dir}" if schema_dir else f"(${SCHEMAS_ENV} is not set)"
    return (f"schema validation skipped: no {' / '.join(missing)} {where}; put the KubeRay v1 CRD schemas in a "
            "folder (e.g. `kubectl get crd rayclusters.ray.io -o json` saved as kuberay_v1_rayclusters_schema.json) "
            f"and pass --schemas DIR or set {SCHEMAS_ENV}=DIR; the PV/PVC and cross-document checks ran")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("overrides", nargs="*", help="key=value settings (launchers/manifests.py: ClusterConf)")
    ap.add_argument("--config", action="append", default=[], help="YAML file(s) with settings, merged in order")
    ap.add_argument("--out", type=Path, help="folder to write the manifests into (default: print to stdout)")
    ap.add_argument("--schemas", type=Path, default=None,
                    help="folder with kuberay_v1_rayclusters_schema.json and kuberay_v1_rayjobs_schema.json; a "
                         "missing file there is an error (default: %s if it holds them, else the CRD validation "
                         "is skipped with a notice)" % ("$" + SCHEMAS_ENV))
    ap.add_argument("--no-validate", action="store_true", help="skip the offline schema validation")
    args = ap.parse_args(argv)
    schema_dir: Path | None = args.schemas
    skipped = None
    try:
        conf = load_config(args.overrides, args.config)
        docs = render(conf)
        if not args.no_validate:
            if schema_dir is None:
                schema_dir = default_schema_dir()
                missing = missing_crd_schemas(docs, schema_dir)
                if missing:
                    skipped = skip_line(schema_dir, missing)
                    print(skipped, file=sys.stderr)
                    schema_dir = None
            validate(docs, schema_dir)
    except ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write("---\n".join(to_yaml(d) for d in docs.values()))
        return 0
    paths = write(docs, args.out)
    print(conf_summary(conf))
    if args.no_validate:
        print("not validated (--no-validate)")
    elif skipped is None:
        print("validated against " + str(schema_dir))
    for p in paths:
        print(f"wrote {p}")
    print("apply with: kubectl apply " + " ".join(f"-f {p}" for p in paths if p.name != "rayjob.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
