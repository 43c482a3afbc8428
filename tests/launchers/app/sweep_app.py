"""A tiny Hydra task for the launcher tests: writes result.json like rlkit's jobs do.

    python tests/launchers/app/sweep_app.py -m x=1,2,3 fail_on=3 +launcher=ray hydra.launcher.address=...

Knobs: ``x`` (the swept value; success_after = x / 10), ``fail_on`` (this x raises), ``barrier``
(a folder: jobs with x in ``barrier_xs`` wait until all of them have started, which proves they ran
concurrently), ``running`` (a folder where each job counts the jobs running next to it),
``report_env`` / ``report_secret_env`` (environment variables reported in result.json, the latter
as SHA-256 digests), ``die_once`` (a folder: the first attempt of each job SIGKILLs itself, as a driver lost
with its node would; it leaves a marker there, so a resubmitted attempt completes).
"""

import hashlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

# The launcher plugins live in the repo root (hydra_plugins/, launchers/); the job needs them to
# compose `launcher=...` just as train.py does from the repo root.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    out = Path(HydraConfig.get().runtime.output_dir)
    start = time.time()
    print(f"sweep_app x={cfg.x} starting in {out}", flush=True)
    if cfg.die_once:
        marker = Path(cfg.die_once) / f"died-{cfg.x}"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            print(f"sweep_app x={cfg.x} killing itself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    peers = None
    if cfg.running:
        running = Path(cfg.running)
        running.mkdir(parents=True, exist_ok=True)
        me = running / f"{cfg.x}-{os.getpid()}"
        me.touch()
        peers = len(list(running.iterdir()))
    try:
        if cfg.barrier and cfg.x in cfg.barrier_xs:
            b = Path(cfg.barrier)
            b.mkdir(parents=True, exist_ok=True)
            (b / str(cfg.x)).touch()
            deadline = time.time() + cfg.barrier_timeout_s
            while not all((b / str(x)).exists() for x in cfg.barrier_xs):
                if time.time() > deadline:
                    raise TimeoutError(f"barrier: jobs {list(cfg.barrier_xs)} never ran together")
                time.sleep(0.1)
        time.sleep(cfg.sleep_s)
        for i in range(3):
            print(f"sweep_app x={cfg.x} line {i}", flush=True)
        if cfg.fail_on is not None and cfg.x == cfg.fail_on:
            raise RuntimeError(f"deliberate failure for x={cfg.x}")
        result = {
            "status": "completed",
            "eval_success_before": 0.0,
            "eval_success_after": cfg.x / 10,
            "steps_completed": int(cfg.x),
            "wall_time_s": round(time.time() - start, 3),
            "running_with": peers,
            "host": socket.gethostname(),
            "env": {k: os.environ.get(k) for k in cfg.report_env},
            # secrets: only a digest, so the value itself is written nowhere
            "env_sha256": {k: hashlib.sha256(os.environ[k].encode()).hexdigest() if k in os.environ else None
                           for k in cfg.report_secret_env},
            "cwd": os.getcwd(),
        }
        (out / "result.json").write_text(json.dumps(result, indent=2))
        return result
    finally:
        if cfg.running:
            me.unlink()


if __name__ == "__main__":
    main()
