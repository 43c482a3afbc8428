"""Render and validate the Kubernetes manifests for rlkit on SageMaker HyperPod.

    python scripts/hyperpod_cluster.py image=<ecr image> fsx.file_system_id=fs-0abc... \
        fsx.dns_name=fs-0abc....fsx.us-west-2.amazonaws.com fsx.mount_name=abcdefgh --out k8s/
    kubectl apply -f k8s/fsx-pv.yaml -f k8s/fsx-pvc.yaml -f k8s/raycluster.yaml

Writes fsx-pv.yaml, fsx-pvc.yaml, raycluster.yaml (and rayjob.yaml with rayjob.enabled=true) after
validating them offline against the KubeRay v1 CRD schemas (unknown fields are errors) and a minimal
PV/PVC schema. Settings are ``key=value`` overrides of ``launchers.manifests.ClusterConf`` (e.g.
``namespace=team-a worker.replicas=3 worker.gpus=2 secret_env.WANDB_API_KEY=wandb/api-key``), after
optional ``--config file.yaml`` files. Without --out, prints the manifests as one multi-document YAML.
Exit status 2 on a config or validation error, with the reason on stderr. See docs/hyperpod.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from launchers.manifests import (  # noqa: E402
    ManifestError, conf_summary, default_schema_dir, load_config, render, to_yaml, validate, write,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("overrides", nargs="*", help="key=value settings (launchers/manifests.py: ClusterConf)")
    ap.add_argument("--config", action="append", default=[], help="YAML file(s) with settings, merged in order")
    ap.add_argument("--out", type=Path, help="folder to write the manifests into (default: print to stdout)")
    ap.add_argument("--schemas", type=Path, default=default_schema_dir(REPO),
                    help="folder with kuberay_v1_rayclusters_schema.json and kuberay_v1_rayjobs_schema.json "
                         "(default: %(default)s)")
    ap.add_argument("--no-validate", action="store_true", help="skip the offline schema validation")
    args = ap.parse_args(argv)
    try:
        conf = load_config(args.overrides, args.config)
        docs = render(conf)
        if not args.no_validate:
            validate(docs, args.schemas)
    except ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write("---\n".join(to_yaml(d) for d in docs.values()))
        return 0
    paths = write(docs, args.out)
    print(conf_summary(conf))
    print(("validated against " + str(args.schemas)) if not args.no_validate else "not validated (--no-validate)")
    for p in paths:
        print(f"wrote {p}")
    print("apply with: kubectl apply " + " ".join(f"-f {p}" for p in paths if p.name != "rayjob.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
