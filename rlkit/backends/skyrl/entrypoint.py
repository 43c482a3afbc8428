"""Start SkyRL's trainer on the Ray cluster, the way SkyRL's own entry points do, plus rlkit's envs.

SkyRL's ``skyrl.train.entrypoints.main_base.main`` builds ``SkyRLTrainConfig`` from the command line,
runs ``validate_cfg``, ``initialize_ray`` and then ``ray.get(skyrl_entrypoint.remote(cfg))``, a Ray task
that builds ``BasePPOExp(cfg)`` (tokenizer, datasets, colocated placement group, vLLM engines,
generator, FSDP2 workers) and runs its training loop. Custom envs are registered with skyrl-gym inside
that task (skyrl-gym's registry is per process), as SkyRL's examples do. This module does the same,
registering ``rlkit-rewarded`` (rlkit.backends.skyrl.gym_env) first:

    python -m rlkit.backends.skyrl.entrypoint data.train_data=[...] trainer.policy.model.path=... ...

``scripts/skyrl_config.py`` prints that command for a Hydra config; ``backend=skyrl`` calls ``launch``.
Both need SkyRL's GPU stack (vLLM, FSDP2, flash-attn), which installs on Python 3.12 with CUDA only.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rlkit.backends.skyrl.compile import SKYRL_VERSION

INSTALL_HINT = (
    "backend=skyrl runs SkyRL's vLLM + FSDP2 trainer, which needs `pip install 'rlkit[skyrl]'` on Python 3.12 "
    f"with CUDA (skyrl[fsdp]=={SKYRL_VERSION}; the GPU image is docker/Dockerfile)"
)
#: Variables passed from the launching shell into the Ray task (W&B naming; the API key SkyRL forwards).
FORWARDED_ENV = ("WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_MODE", "WANDB_PROJECT", "HF_HOME", "HF_HUB_OFFLINE")


class SkyRLUnavailableError(RuntimeError):
    """SkyRL's training stack cannot be imported here; the message names the install and the cause."""


def require_skyrl_runtime() -> dict[str, Any]:
    """Import what SkyRL's main_base uses; returns the objects.

    Raises: SkyRLUnavailableError on Python < 3.12 or when an import fails (message: INSTALL_HINT and
        the import error).
    """
    if sys.version_info < (3, 12):
        raise SkyRLUnavailableError(f"{INSTALL_HINT}; this is Python {sys.version.split()[0]}")
    try:
        import ray
        from skyrl.train.config import SkyRLTrainConfig
        from skyrl.train.entrypoints.main_base import BasePPOExp
        from skyrl.train.utils import validate_cfg
        from skyrl.train.utils.utils import initialize_ray
    except Exception as e:  # ImportError, or a CUDA-only dependency failing at import
        raise SkyRLUnavailableError(f"{INSTALL_HINT}; import failed: {type(e).__name__}: {e}") from e
    return {"ray": ray, "SkyRLTrainConfig": SkyRLTrainConfig, "BasePPOExp": BasePPOExp,
            "validate_cfg": validate_cfg, "initialize_ray": initialize_ray}


def train_task(cfg: Any, env_vars: dict[str, str]) -> None:
    """The Ray task: env vars, skyrl-gym registration of rlkit's env, then SkyRL's ``BasePPOExp.run``."""
    os.environ.update(env_vars)
    from rlkit.backends.skyrl.gym_env import register

    register()
    from skyrl.train.entrypoints.main_base import BasePPOExp

    BasePPOExp(cfg).run()


def _run(skyrl: dict[str, Any], cfg: Any, env_vars: dict[str, str]) -> None:
    skyrl["validate_cfg"](cfg)
    skyrl["initialize_ray"](cfg)
    ray = skyrl["ray"]
    task = ray.remote(num_cpus=1)(train_task)  # not on the head node's driver, as main_base does
    ray.get(task.remote(cfg, env_vars))


def launch(config: dict[str, Any], env_vars: dict[str, str]) -> None:
    """Build SkyRL's config from a compiled job's mapping and train (blocks until SkyRL returns).

    Raises: SkyRLUnavailableError (see ``require_skyrl_runtime``); SkyRL's own errors from validation
        and training propagate.
    """
    skyrl = require_skyrl_runtime()
    from omegaconf import OmegaConf

    cfg = skyrl["SkyRLTrainConfig"].from_dict_config(OmegaConf.create(config))
    _run(skyrl, cfg, env_vars)


def main(argv: list[str] | None = None) -> None:
    """``python -m rlkit.backends.skyrl.entrypoint key=value ...`` (SkyRL's override syntax)."""
    skyrl = require_skyrl_runtime()
    cfg = skyrl["SkyRLTrainConfig"].from_cli_overrides(list(sys.argv[1:] if argv is None else argv))
    env_vars = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    _run(skyrl, cfg, env_vars)


if __name__ == "__main__":
    try:
        main()
    except SkyRLUnavailableError as e:
        sys.exit(f"error: {e}")
