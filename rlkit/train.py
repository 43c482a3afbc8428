"""rlkit main job: GRPO post-training of a vision-language policy (see README.md), as a Hydra app.

    python train.py                                               # from a clone (train.py runs ``cli`` below)
    rlkit-train                                                   # the same app, as an installed package's command
    rlkit-train env=visgym reward=maze_exit -m lr=1e-5,3e-5       # a sweep, with a summary table at the end
    rlkit-train --cfg job                                         # print the composed config

The config is rlkit's conf/ wherever it is (rlkit.config.CONF_DIR: the checkout's conf/, or the copy an installed
wheel carries), so both commands compose the same config. Hydra's job name is this module's, ``train`` (the run
folder's train.log), as it was for train.py.
"""

import sys

import hydra
from omegaconf import DictConfig

from rlkit.config import CONF_DIR  # (importing it registers the typed schema conf/train.yaml builds on)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    """The Hydra app behind ``python train.py`` and ``rlkit-train``: one job of ``cfg`` (conf/train.yaml) through
    rlkit.run.run; returns its result dict (also result.json). A config, checkpoint, metrics-service or worker error
    ends a single run with its message and exit code 1 (in a sweep it is raised for the launcher to record)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rlkit.checkpoint import CheckpointError
    from rlkit.errors import ConfigError
    from rlkit.metrics_export import RayMetricsUnavailable
    from rlkit.recipes.heal import WorkerError, WorkerLostError
    from rlkit.run import run

    try:
        return run(cfg)
    except (ConfigError, CheckpointError, RayMetricsUnavailable, WorkerLostError, WorkerError) as e:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the launcher records the failure and the sweep summary shows it
        # a bad setting, a refused resume or a service that is not there (logger=ray_metrics with no Ray
        # cluster) is the user's to fix, and an error raised in a worker (a bug) is its own: the message names it
        # (the run folder's error.txt keeps the traceback), not a traceback through rlkit
        kind = ("config error" if isinstance(e, ConfigError) else
                "checkpoint error" if isinstance(e, CheckpointError) else
                "worker lost" if isinstance(e, WorkerLostError) else
                "worker error" if isinstance(e, WorkerError) else "connection error")
        print(f"[rlkit] {kind}: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        out = HydraConfig.get().runtime.output_dir
        print(f"\n[rlkit] stopped (Ctrl-C). To go on from its last checkpoint (a one-time build: from its last "
              f"save), rerun with hydra.run.dir={out} trainer.resume_mode=latest (the default; without "
              "trainer.overwrite=true, which would start over, or trainer.resume_path)", file=sys.stderr)
        sys.exit(130)


def _flags_first(argv: list[str]) -> list[str]:
    """Hydra's argparse accepts its flags only before the overrides; users type
    `train.py env=visgym -m lr=1e-5,3e-5`. Move the value-less run-mode flags to the front."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags]


def _refuse_unknown_keys(argv: list[str]) -> None:
    """Exit with rlkit's message for a mistyped key (rlkit.run.unknown_override_keys), before Hydra's,
    which suggests a '+' that would only be refused later."""
    from rlkit.run import unknown_override_keys

    unknown = unknown_override_keys(argv, CONF_DIR)
    if unknown:
        print(f"[rlkit] config error: unknown config key(s): {', '.join(unknown)}. Check the spelling against "
              "`python train.py --cfg job` (schema: rlkit/config/schema.py)", file=sys.stderr)
        sys.exit(1)


def cli() -> None:
    """``python train.py`` and the ``rlkit-train`` command: the run-mode flags first, rlkit's message for a
    mistyped key, then the Hydra app."""
    sys.argv = [sys.argv[0], *_flags_first(sys.argv[1:])]
    _refuse_unknown_keys(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
