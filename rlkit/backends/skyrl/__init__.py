"""backend=skyrl: the same Hydra experiment on SkyRL's colocated vLLM + FSDP2 trainer (docs/skyrl.md).

    settings.py   conf/backend/skyrl.yaml's options (cluster shape, vLLM engines)
    compile.py    composed rlkit config -> SkyRL config overrides + task datasets (pure; SkyRLConfigError)
    schema.py     validation with SkyRL's own config classes (skyrl.train.config)
    data.py       the task datasets in SkyRL's prompt-dataset format (JSON lines, one row per seed)
    gym_env.py    rlkit-rewarded: the env package's skyrl-gym adapter scored by the rlkit reward
    entrypoint.py SkyRL's main_base flow plus rlkit's env registration (python -m ...)
    backend.py    SkyRLBackend, the ``_target_`` of conf/backend/skyrl.yaml

Importing this package needs neither SkyRL nor a GPU; running a job needs ``rlkit[skyrl]``.
"""

from rlkit.backends.skyrl.backend import SkyRLBackend, read_eval_success
from rlkit.backends.skyrl.compile import (
    REWARDED_ENV_ID,
    SKYRL_VERSION,
    SkyRLConfigError,
    SkyRLJob,
    compile_job,
    find_skyrl_adapter,
)
from rlkit.backends.skyrl.settings import SkyRLSettings

__all__ = [
    "REWARDED_ENV_ID",
    "SKYRL_VERSION",
    "SkyRLBackend",
    "SkyRLConfigError",
    "SkyRLJob",
    "SkyRLSettings",
    "compile_job",
    "find_skyrl_adapter",
    "read_eval_success",
]
