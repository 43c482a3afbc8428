"""rlkit's config, by job; every name is importable from ``rlkit.config`` as before the split:

- rlkit.config.schema: the typed schemas of conf/train.yaml (TrainConfig, AlgorithmConfig, ...), registered in
  Hydra's ConfigStore on import (``register_configs``), and ``stop_strings``;
- rlkit.config.ranges: every typed field's valid values (``Range``, ``RANGES``) and the checks applying them
  (``check_ranges``, ``check_sft_stage``);
- rlkit.config.compat: conf/compat.yaml, how an earlier rlkit's checkpoint config is read (``compat_table``,
  ``KEYS_ADDED_LATER``);
- rlkit.config.conf_dir: where conf/ is (``CONF_DIR``: the package's copy in a wheel, the checkout's in a clone).
"""

from rlkit.config.compat import COMPAT_FILE, KEYS_ADDED_LATER, compat_table
from rlkit.config.conf_dir import CONF_DIR
from rlkit.config.ranges import RANGES, SFT_STAGE_FIXED, Range, check_ranges, check_sft_stage
from rlkit.config.schema import (
    AlgorithmConfig,
    AuxLossConfig,
    EvalConfig,
    GroundingConfig,
    OptimConfig,
    PathsConfig,
    RolloutConfig,
    SFTConfig,
    TrainConfig,
    TrainerConfig,
    register_configs,
    stop_strings,
)

__all__ = [
    "AlgorithmConfig", "AuxLossConfig", "COMPAT_FILE", "CONF_DIR", "EvalConfig", "GroundingConfig", "KEYS_ADDED_LATER",
    "OptimConfig", "PathsConfig", "RANGES", "Range", "RolloutConfig", "SFTConfig", "SFT_STAGE_FIXED", "TrainConfig",
    "TrainerConfig", "check_ranges", "check_sft_stage", "compat_table", "register_configs", "stop_strings",
]
