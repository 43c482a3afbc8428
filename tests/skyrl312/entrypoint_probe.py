"""Run rlkit's SkyRL entry point (rlkit.backends.skyrl.entrypoint.main's steps) on CPU until SkyRL needs a GPU.

    python tests/skyrl312/entrypoint_probe.py <overrides file>     # one SkyRL override (key=value) a line

Steps, as ``main`` does them: ``SkyRLTrainConfig.from_cli_overrides`` -> ``validate_cfg`` ->
``initialize_ray`` -> a Ray task running ``train_task`` (registers rlkit-rewarded with skyrl-gym, then
``BasePPOExp(cfg).run()``: tokenizer from the policy path, SkyRL's PromptDatasets from rlkit's files,
then the colocated placement group of GPU bundles, which a CPU machine cannot give).

One deviation: ``initialize_ray`` is replaced by its first half (``prepare_runtime_environment``) and a
local ``ray.init`` without the dashboard. SkyRL's own ``ray.init()`` starts the dashboard and its agent,
and on this 2-core machine under load the raylet gave up waiting for the agent (seen twice), so the probe
starts Ray the way rlkit's other Ray tests do. Prints one JSON line: how far it got and SkyRL's error.
"""

from __future__ import annotations

import json
import sys
import time


def main(path: str) -> None:
    t0 = time.time()
    report: dict = {"reached": []}
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import prepare_runtime_environment

    from rlkit.backends.skyrl.entrypoint import require_skyrl_runtime, train_task

    require_skyrl_runtime()
    report["reached"].append("imports")
    cfg = SkyRLTrainConfig.from_cli_overrides([ln for ln in open(path).read().splitlines() if ln])
    report["reached"].append("config")
    validate_cfg(cfg)
    report["reached"].append("validate_cfg")
    env_vars = prepare_runtime_environment(cfg)
    report["reached"].append("runtime_env")
    report["t_config"] = round(time.time() - t0, 1)
    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": env_vars})
    report["reached"].append("ray")
    report["t_ray"] = round(time.time() - t0, 1)
    try:
        ray.get(ray.remote(num_cpus=1)(train_task).remote(cfg, {}))
        report["reached"].append("trained")
    except Exception as e:  # SkyRL's error from inside the Ray task (a RayTaskError wrapping it)
        cause = getattr(e, "cause", None) or e
        report["error"] = f"{type(cause).__name__}: {cause}"
    finally:
        ray.shutdown()
    report["seconds"] = round(time.time() - t0, 1)
    print("PROBE " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
