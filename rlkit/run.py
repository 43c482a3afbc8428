"""Entry from train.py: instantiate the backend and run one job of the (multi)run.

``cfg`` stops here and in the backend's entry; below that, typed configs or plain arguments.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlkit.config import compat_table
from rlkit.errors import ConfigError, DiskFullError
from rlkit.plugins import (  # noqa: F401 (re-exported)
    compose_train,
    instantiate_plugin,
    instantiate_reward,
    policy_device_type,
    resolve_policy_dtype,
    to_dataclass,
)

log = logging.getLogger(__name__)


def _typed_group(f: Any) -> type | None:
    """The dataclass a schema field holds (AlgorithmConfig for ``algorithm``...), or None."""
    from dataclasses import is_dataclass

    default = f.default_factory() if callable(f.default_factory) else None
    return type(default) if is_dataclass(default) else None


def check_top_level_keys(cfg: DictConfig) -> None:
    """Refuse keys the typed schema does not know, at the top level and inside the typed groups
    (algorithm, rollout, trainer, sft, eval, paths): ``+typo=1`` / ``+algorithm.typo=1`` pass
    Hydra's compose (an append), and would otherwise be silently ignored.

    Raises: ConfigError listing the unknown keys.
    """
    import difflib
    from dataclasses import fields

    from rlkit.config import TrainConfig

    def unknown_in(node: Any, cls: type, prefix: str) -> list[str]:
        known = {f.name: f for f in fields(cls)}
        out = []
        for k in node.keys():
            if k == "hydra" and not prefix:
                continue
            if k not in known:
                close = difflib.get_close_matches(str(k), list(known), n=1)
                out.append(prefix + str(k) + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
            else:
                group = _typed_group(known[k])
                if group is not None and OmegaConf.is_dict(node[k]):
                    out += unknown_in(node[k], group, f"{prefix}{k}.")
        return out

    unknown = unknown_in(cfg, TrainConfig, "")
    if unknown:
        raise ConfigError(
            f"unknown config key(s): {', '.join(sorted(unknown))}. A '+' adds a new key instead of setting an "
            f"existing one: check the spelling against `python train.py --cfg job` (schema: rlkit/config/schema.py)."
        )


#: Top-level names TRL's GRPOConfig (and transformers' TrainingArguments under it) gives these settings -> rlkit's
#: key, so a researcher who types the name of their habit is told rlkit's (``learning_rate=1e-5`` -> ``lr``).
FAMILIAR_KEYS = {
    "learning_rate": "lr",            # TRL / transformers TrainingArguments
    "num_generations": "group_size",  # TRL GRPOConfig: completions per prompt
    "max_steps": "steps",             # TRL / transformers
    "beta": "algorithm.kl_coef",      # TRL GRPOConfig: the KL coefficient
    "epsilon": "algorithm.eps_clip_low",  # TRL GRPOConfig: the clip range (epsilon_high: eps_clip_high)
    "epsilon_high": "algorithm.eps_clip_high",
    "kl_coef": "algorithm.kl_coef",
    "temperature": "rollout.temperature",
    "max_completion_length": "rollout.max_new_tokens",  # TRL GRPOConfig
}


def unknown_override_keys(args: list[str], conf_dir: str | Path) -> list[str]:
    """The command-line overrides that set (without a '+') a key the typed schema does not have.

    Hydra refuses those itself, but its message ("Could not override 'algorithm.demo_cof'. To
    append to your config use +algorithm.demo_cof=...") recommends the '+' that
    check_top_level_keys then refuses; train.py checks first and names the closest real key.
    Only the schema's dataclass part is checked: the top level (a name that is neither a field
    nor a config group under ``conf_dir``) and the typed groups (algorithm, rollout, trainer, sft,
    grounding, eval, paths). Keys inside env, policy, backend, ... and Hydra's own are left to Hydra.

    Args: args: sys.argv[1:] (flags and non-override words are skipped). conf_dir: the config folder.
    Returns: one "key (did you mean ...?)" entry per unknown key, in order.
    """
    import difflib
    from dataclasses import fields

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    from rlkit.config import TrainConfig

    groups = {p.name for p in Path(conf_dir).iterdir() if p.is_dir()} | {"hydra"}
    top = {f.name for f in fields(TrainConfig)}
    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except Exception:  # noqa: BLE001 - a malformed override: Hydra's own message says what is wrong
        return []
    out = []
    for o in overrides:
        if o.type != OverrideType.CHANGE or o.package is not None:
            continue
        parts = o.key_or_group.split(".")
        if parts[0].split("/")[0] in groups and (len(parts) == 1 or parts[0] not in top):
            continue  # a group choice (`env=visgym`, `hydra/launcher=...`) or a key inside an untyped group
        cls: Any = TrainConfig
        for depth, part in enumerate(parts):
            known = {f.name: f for f in fields(cls)}
            if part not in known:
                prefix = ".".join(parts[:depth] + [""])
                names = [prefix + k for k in known]
                if depth == 0:  # a group's key typed without its group: `demo_coef=0.3`
                    names += [f"{k}.{g.name}" for k, f in known.items() if _typed_group(f) for g in fields(_typed_group(f))]
                key = o.key_or_group
                renamed, removed = compat_table("renamed"), compat_table("removed")
                if key in renamed:  # an older rlkit's name (conf/compat.yaml)
                    out.append(f"{key} (renamed: {renamed[key]})")
                    break
                if key in removed:
                    out.append(f"{key} (a lever removed from rlkit, docs/experiments.md; its code is at git tag "
                               "levers-before-removal)")
                    break
                close = ([FAMILIAR_KEYS[key]] if key in FAMILIAR_KEYS else []) \
                    or difflib.get_close_matches(prefix + part, names, n=1) \
                    or [n for n in names if n.endswith("." + part)][:1] \
                    or [n for n in names if n == prefix + part.split("_")[0]][:1]  # `lr_rate` -> lr
                out.append(key + (f" (did you mean {close[0]}?)" if close else ""))
                break
            cls = _typed_group(known[part])
            if cls is None:
                break
    typed = {f.name for f in fields(TrainConfig) if _typed_group(f) is not None}
    return out + _unknown_group_keys(overrides, groups, groups - typed - {"hydra"}, conf_dir)


def _options_with(conf_dir: Path, group: str, key: str) -> tuple[list[str], int]:
    """The option files of ``conf/<group>/`` that set the dotted ``key`` (their names), and how many options the group
    has. A key every option holds is left to Hydra; any other is checked by composing with the run's choices."""
    files = sorted((conf_dir / group).glob("*.yaml"))
    out = []
    for f in files:
        try:
            node: Any = OmegaConf.to_container(OmegaConf.load(f))
        except Exception:  # noqa: BLE001 - an unreadable option: leave the key to the full check
            continue
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out.append(f.stem)
    return out, len(files)


def _unknown_group_keys(overrides: list[Any], groups: set[str], untyped: set[str], conf_dir: str | Path) -> list[str]:
    """``unknown_override_keys`` for keys inside the untyped groups (``env.wall_mov``, ``policy.tiny.text_layer``):
    composed with the run's group choices (and no key overrides), a key the chosen options do not have is named
    with the closest sibling, or with the options that have it (``sampling.max_rounds`` under sampling=plain). []
    when nothing is set inside such a group, or when the choices do not compose (Hydra's own message then says why)."""
    import difflib

    from hydra.core.override_parser.types import OverrideType

    holders = {o.key_or_group: _options_with(Path(conf_dir), *o.key_or_group.split(".", 1)) for o in overrides
               if o.type == OverrideType.CHANGE and o.package is None and "." in o.key_or_group
               and o.key_or_group.split(".")[0] in untyped}
    inside = [o for o in overrides if o.key_or_group in holders and o.type == OverrideType.CHANGE
              and o.package is None and len(holders[o.key_or_group][0]) < holders[o.key_or_group][1]]
    if not inside:
        return []  # every key is in all of its group's option files: no need to compose (~0.5 s a start)
    # the group choices (`env=visgym`, `experiment=smoke`): what decides which keys the groups hold
    picks = [o for o in overrides if o.key_or_group.split("/")[0] in groups - {"hydra"} and "." not in o.key_or_group]
    if any(o.is_sweep_override() for o in picks):
        return []  # `-m env=a,b`: each job holds other keys; Hydra checks each job's
    choices = [o.input_line for o in picks]
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import rlkit.config  # noqa: F401  (registers the schema)

    if GlobalHydra.instance().is_initialized():
        return []  # inside a Hydra app: its config is composed already, and Hydra checks it
    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):  # cleared on exit
            cfg = compose(config_name="train", overrides=choices)
    except Exception:  # noqa: BLE001 - Hydra reports what does not compose
        return []
    out = []
    for o in inside:
        parent, _, leaf = o.key_or_group.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None)
        if not OmegaConf.is_dict(node) or leaf in node:
            continue  # a key inside a list or a value Hydra checks itself; or a key that exists
        close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=1)
        group, (others, _) = o.key_or_group.split(".")[0], holders[o.key_or_group]
        if others and parent == group:  # a key of another option: sampling.max_rounds with sampling=plain
            named = ", ".join(f"{group}={n}" for n in others)
            out.append(f"{o.key_or_group} (not a key of the chosen {group} option: {named} "
                       f"{'has' if len(others) == 1 else 'have'} it)")
            continue
        out.append(o.key_or_group + (f" (did you mean {parent}.{close[0]}?)" if close else
                                     f" ({parent} has {', '.join(sorted(str(k) for k in node.keys()))})"))
    return out


def run(cfg: DictConfig) -> dict:
    """Run one job with the configured backend; returns the job's result dict (also result.json).

    Holds the run folder's lock (rlkit.run_lock) for the whole job. An attempt refused before the backend
    accepts it (rlkit.run_folder.accept_run_config; a ConfigError or CheckpointError: a bad value, a resume that
    would change the experiment) leaves the folder's Hydra record as the last accepted attempt wrote it.

    Raises: RunFolderBusyError (a ConfigError) when another live run holds the folder; whatever the
    job raised, after writing it to ``<paths.output_dir>/error.txt``.
    """
    import contextlib

    from rlkit import run_folder, run_lock

    out = _output_dir(cfg)
    # one run per folder (taken earlier by the Hydra callback in a train.py run; re-entrant). A refusal
    # is raised before the try below, so the other run's error.txt is left alone.
    with run_lock.locked(out) if out is not None else contextlib.nullcontext():
        if out is not None:  # a resumed run that now succeeds must not keep the last attempt's error
            run_folder.begin_attempt(out)
        try:
            check_top_level_keys(cfg)
            resolved = resolve_policy_dtype(cfg)
            if resolved is not None:
                _say(f"policy.dtype=auto -> {resolved[0]} ({resolved[1]})")
                run_folder.record_resolved_dtype(out, resolved[0])
            backend = instantiate_plugin(cfg.backend, "backend")
            result = backend.run(cfg)
        except Exception as e:
            from rlkit.checkpoint import CheckpointError

            e = _explain_disk_full(e)
            if (out is not None and isinstance(e, (ConfigError, CheckpointError))
                    and not run_folder.is_accepted(out) and run_folder.restore_accepted_config(out)):
                log.info("this attempt was refused; %s keeps the Hydra record of the run it holds", out)
            if out is not None:
                run_folder.write_error(out, e)
            raise e
        try:
            run_folder.accept_run_config(out)  # a backend that does not accept early: its run is done
        except OSError as e:  # the run itself succeeded; only the copy of its record did not
            log.warning("could not keep a copy of the run's Hydra record in %s: %s", out, e)
        return result


def _say(text: str) -> None:
    """One ``[rlkit] text`` line on stdout and in the run's log file (as rlkit.console.Progress.say)."""
    from rlkit.console import to_log_files

    print(f"[rlkit] {text}", flush=True)
    to_log_files(f"[rlkit] {text}")


def _explain_disk_full(err: Exception) -> Exception:
    """``err`` itself, or for a bare ENOSPC/EDQUOT OSError (metrics, results, exports) a DiskFullError
    saying "no space left on <folder> while writing <file>" (checkpoints say so themselves)."""
    import errno

    if isinstance(err, OSError) and not isinstance(err, DiskFullError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        target = err.filename or "a file"
        folder = Path(err.filename).parent if err.filename else "the run folder"
        new = DiskFullError(err.errno, f"no space left on {folder} while writing {target}; free space and resume "
                            "(the last complete checkpoint is kept)")
        new.__cause__ = err
        return new
    return err


def _output_dir(cfg: DictConfig) -> Path | None:
    """``paths.output_dir`` as a Path, or None when it is unset or cannot be resolved."""
    try:
        out = OmegaConf.select(cfg, "paths.output_dir", default=None)
    except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra run
        return None
    return Path(str(out)) if out else None
