"""backend=skyrl: the same Hydra experiment on SkyRL's colocated vLLM + FSDP2 trainer (docs/skyrl.md).

    settings.py   conf/backend/skyrl.yaml's options (cluster shape, vLLM engines)
    compile.py    composed rlkit config -> SkyRL config overrides + task datasets (pure; SkyRLConfigError)
    schema.py     validation with SkyRL's own config classes (skyrl.train.config)
    data.py       the task datasets in SkyRL's prompt-dataset format (JSON lines, one row per seed)
    env_adapter.py rlkit-env: any rlkit EnvSpec as a skyrl-gym env (one adapter over rlkit.types' protocol)
    gym_env.py    rlkit-rewarded: the rlkit-env episode scored by the rlkit reward
    entrypoint.py SkyRL's main_base flow plus rlkit's env registration (python -m ...)
    backend.py    SkyRLBackend, the ``_target_`` of conf/backend/skyrl.yaml

Importing this package needs neither SkyRL nor a GPU; running a job needs ``rlkit[skyrl]``.
"""

from rlkit.backends.skyrl.backend import SkyRLBackend, read_eval_success
from rlkit.backends.skyrl.compile import (
    REWARDED_ENV_ID,
    SKYRL_VERSION,
    SkyRLConfigError,
    SPEC_ENV_ID,
    SkyRLJob,
    compile_job,
)
from rlkit.backends.skyrl.settings import SkyRLSettings

__all__ = [
    "REWARDED_ENV_ID",
    "SKYRL_VERSION",
    "SPEC_ENV_ID",
    "SkyRLBackend",
    "SkyRLConfigError",
    "SkyRLJob",
    "SkyRLSettings",
    "compile_job",
    "read_eval_success",
]
