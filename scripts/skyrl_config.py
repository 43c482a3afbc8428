"""Print the SkyRL configuration and command line that backend=skyrl would run; start nothing.

    python scripts/skyrl_config.py experiment=hyperpod_visgym
    python scripts/skyrl_config.py experiment=hyperpod_visgym --overrides-only     # only the keys rlkit sets
    python scripts/skyrl_config.py experiment=hyperpod_visgym --write-data         # also write the datasets

Composes conf/train.yaml with the given Hydra overrides (plus ``backend=skyrl`` when they do not select
it, as ``python train.py <overrides> backend=skyrl`` would), compiles it (rlkit.backends.skyrl.compile), validates it with SkyRL's own config classes
when SkyRL is installed (``pip install --no-deps skyrl==0.3.0 loguru`` is enough on CPU), and prints:
the SkyRL config as YAML (every key, SkyRL's defaults filled in), then the equivalent command
``python -m rlkit.backends.skyrl.entrypoint key=value ...``. With ``--write-data`` it writes the
training and evaluation datasets the command reads (under the run folder on paths.shared).

Exit status 2 with the message on stderr when the config cannot run on SkyRL.
"""

from __future__ import annotations

import argparse
import sys


def compose(overrides: list[str]):
    """The composed config (with its ``hydra`` node, registered as the current Hydra config)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from rlkit.config import CONF_DIR  # importing rlkit.config registers the schema

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=overrides, return_hydra_config=True)
        if cfg.backend.get("_target_") != "rlkit.backends.skyrl.SkyRLBackend":
            # as `python train.py <overrides> backend=skyrl` would compose it (same run name)
            cfg = hydra_compose(config_name="train", overrides=[*overrides, "backend=skyrl"],
                                return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=hyperpod_visgym")
    parser.add_argument("--overrides-only", action="store_true", help="print only the keys rlkit sets")
    parser.add_argument("--write-data", action="store_true", help="write the task datasets the command reads")
    args = parser.parse_args(argv)

    from hydra.utils import instantiate

    from rlkit.backends.skyrl import SkyRLBackend
    from rlkit.backends.skyrl.data import write_datasets
    from rlkit.backends.skyrl.schema import SkyRLNotInstalledError, validate
    from rlkit.errors import ConfigError

    cfg = compose(args.overrides)
    try:
        backend = instantiate(cfg.backend)
        if not isinstance(backend, SkyRLBackend):
            raise ConfigError(f"backend={cfg.backend._target_} is not the SkyRL backend")
        job = backend.compile(cfg)
        text, level = job.overrides_yaml(), "overrides only"
        if not args.overrides_only:
            try:
                import yaml

                validated = validate(job.config)
                text, level = yaml.safe_dump(validated.as_dict, sort_keys=False), f"validated by SkyRL ({validated.level})"
            except SkyRLNotInstalledError as e:
                level = f"not validated: {e}"
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# SkyRL config for: {' '.join(args.overrides) or '(defaults)'} -- {level}")
    for note in job.notes:
        print(f"# {note}")
    print(text)
    print("# equivalent command (the datasets must exist: --write-data writes them)")
    print(job.command())
    if args.write_data:
        train, evals = write_datasets(job)
        print(f"# wrote {train} ({len(job.train_seeds)} rows) and {evals} ({len(job.eval_seeds)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
