"""Entry from train.py: instantiate the backend and run one job of the (multi)run.

``cfg`` stops here and in the backend's entry; below that, typed configs or plain arguments.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

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


#: ``hydra.*`` keys whose overrides change what a job composes (``hydra.searchpath``: config folders outside the
#: clone, docs/adding-an-env.md section 8), unlike those that say where it writes or how it launches
#: (``hydra.run.dir``, ``hydra/launcher=...``). Hydra keeps every ``hydra.*`` override out of the task overrides.
RERUN_HYDRA_KEYS = ("hydra.searchpath",)


def rerun_overrides(task: Sequence[str], hydra: Sequence[str]) -> list[str]:
    """The overrides that rerun a job, as its records keep them (result.json's ``overrides``).

    Args:
        task: the job's task overrides (``HydraConfig.overrides.task``, ``.hydra/overrides.yaml``), as typed.
        hydra: its ``hydra.*`` overrides (``HydraConfig.overrides.hydra``), as typed or added by Hydra.

    Returns: those of ``hydra`` on a RERUN_HYDRA_KEYS key (``+``, ``++`` and ``~`` forms too; in order), then ``task``:
    without the search path, a rerun of an env outside the clone stops at Hydra's "Could not find 'env/...'".
    """
    kept = [o for o in hydra if o.lstrip("+~").split("=", 1)[0] in RERUN_HYDRA_KEYS]
    return [*kept, *task]


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
            f"existing one: check the spelling against `python train.py --cfg job` (schema: rlkit/config.py)."
        )


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
                close = (difflib.get_close_matches(prefix + part, names, n=1)
                         or [n for n in names if n.endswith("." + part)][:1])
                out.append(key + (f" (did you mean {close[0]}?)" if close else ""))
                break
            cls = _typed_group(known[part])
            if cls is None:
                break
    typed = {f.name for f in fields(TrainConfig) if _typed_group(f) is not None}
    return out + _unknown_group_keys(overrides, groups, groups - typed - {"hydra"}, conf_dir)


def _in_some_option(conf_dir: Path, group: str, key: str) -> bool:
    """Whether the dotted ``key`` is set in any option file of ``conf/<group>/`` (a fast pre-check: a key that
    some option holds is left to Hydra; one that none holds is checked by composing)."""
    for f in sorted((conf_dir / group).glob("*.yaml")):
        try:
            node: Any = OmegaConf.to_container(OmegaConf.load(f))
        except Exception:  # noqa: BLE001 - an unreadable option: leave the key to the full check
            continue
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return True
    return False


def _unknown_group_keys(overrides: list[Any], groups: set[str], untyped: set[str], conf_dir: str | Path) -> list[str]:
    """``unknown_override_keys`` for keys inside the untyped groups (``env.wall_mov``, ``policy.tiny.text_layer``):
    composed with the run's group choices (and no key overrides), a key the chosen options do not have is named
    with the closest sibling. [] when nothing is set inside such a group, or when the choices do not compose
    (Hydra's own message then says why)."""
    import difflib

    from hydra.core.override_parser.types import OverrideType

    inside = [o for o in overrides if o.type == OverrideType.CHANGE and o.package is None
              and "." in o.key_or_group and o.key_or_group.split(".")[0] in untyped
              and not _in_some_option(Path(conf_dir), *o.key_or_group.split(".", 1))]
    if not inside:
        return []  # every key is in one of its group's option files: no need to compose (~0.5 s a start)
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
        out.append(o.key_or_group + (f" (did you mean {parent}.{close[0]}?)" if close else
                                     f" ({parent} has {', '.join(sorted(str(k) for k in node.keys()))})"))
    return out


def _record_resolved_dtype(out: Path | None, dtype: str) -> None:
    """Write the resolved ``policy.dtype`` into the run's ``.hydra/config.yaml`` (Hydra wrote it with "auto"
    before the job started), atomically; nothing without that file or when it holds another value."""
    record = _hydra_record_dir(out) if out is not None else None
    path = record / "config.yaml" if record is not None else None
    if path is None or not path.is_file():
        return
    try:
        saved = OmegaConf.load(path)
        if OmegaConf.select(saved, "policy.dtype", default=None) != "auto":
            return
        saved.policy.dtype = dtype
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(OmegaConf.to_yaml(saved, resolve=False))
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001 - the record is informative; the run itself uses cfg
        log.warning("could not record policy.dtype=%s in %s: %s", dtype, path, e)


#: Written into a job's output folder when the job raises: the error and its traceback. The sweep
#: summary (rlkit.sweep) shows its first line as the job's status.
ERROR_FILE = "error.txt"


#: Where a run folder keeps a copy of the Hydra record (``.hydra/*.yaml``) of the last run it accepted.
ACCEPTED_SUBDIR = "accepted"
_accepted: set[str] = set()  # run folders (realpath) whose current attempt has been accepted, in this process


def _hydra_record_dir(out: Path) -> Path | None:
    """The run's Hydra record folder (``hydra.output_subdir``, ``.hydra`` by default), or None without one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        sub = HydraConfig.get().output_subdir
    except Exception:  # noqa: BLE001 - outside a Hydra run (tests, launchers calling run() directly)
        sub = ".hydra"
    return None if sub is None else out / sub


def accept_run_config(out: Path | None) -> None:
    """Record that this attempt of the run in ``out`` was accepted (its config checked, a resume allowed):
    copy its Hydra record (``.hydra/{config,hydra,overrides}.yaml``) to ``.hydra/accepted/``, atomically.

    Hydra writes ``.hydra/`` before the job starts, so a later attempt in the same folder that is refused
    (a resume that would change the experiment, a bad value) has overwritten it with settings that never
    ran; ``run`` then puts this copy back, and the folder's record again says what its checkpoints hold
    (scripts/eval.py and report.py read it). Idempotent within an attempt."""
    if out is None:
        return
    record = _hydra_record_dir(out)
    key = os.path.realpath(out)
    if key in _accepted or record is None or not record.is_dir():
        _accepted.add(key)
        return
    import shutil

    tmp = record / f".{ACCEPTED_SUBDIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in record.glob("*.yaml"):
        shutil.copy2(f, tmp / f.name)
    previous = record / f".{ACCEPTED_SUBDIR}.old-{os.getpid()}"
    if (record / ACCEPTED_SUBDIR).is_dir():
        os.replace(record / ACCEPTED_SUBDIR, previous)  # a crash from here on still leaves one of the two
    os.replace(tmp, record / ACCEPTED_SUBDIR)
    shutil.rmtree(previous, ignore_errors=True)
    _accepted.add(key)


def _restore_accepted_config(out: Path) -> bool:
    """Put the last accepted attempt's Hydra record back over this refused attempt's; True if there was one."""
    record = _hydra_record_dir(out)
    saved = record / ACCEPTED_SUBDIR if record is not None else None
    if saved is None or not saved.is_dir():
        return False
    import shutil

    for f in saved.glob("*.yaml"):
        tmp = record / f".{f.name}.tmp"
        shutil.copy2(f, tmp)
        os.replace(tmp, record / f.name)
    return True


def run(cfg: DictConfig) -> dict:
    """Run one job with the configured backend; returns the job's result dict (also result.json).

    Holds the run folder's lock (rlkit.run_lock) for the whole job. An attempt refused before the backend
    accepts it (``accept_run_config``; a ConfigError or CheckpointError: a bad value, a resume that would
    change the experiment) leaves the folder's Hydra record as the last accepted attempt wrote it.

    Raises: RunFolderBusyError (a ConfigError) when another live run holds the folder; whatever the
    job raised, after writing it to ``<paths.output_dir>/error.txt``.
    """
    import contextlib

    from rlkit import run_lock

    out = _output_dir(cfg)
    # one run per folder (taken earlier by the Hydra callback in a train.py run; re-entrant). A refusal
    # is raised before the try below, so the other run's error.txt is left alone.
    with run_lock.locked(out) if out is not None else contextlib.nullcontext():
        if out is not None:  # a resumed run that now succeeds must not keep the last attempt's error
            (out / ERROR_FILE).unlink(missing_ok=True)
            _accepted.discard(os.path.realpath(out))  # this attempt is not accepted yet
        try:
            check_top_level_keys(cfg)
            resolved = resolve_policy_dtype(cfg)
            if resolved is not None:
                _say(f"policy.dtype=auto -> {resolved[0]} ({resolved[1]})")
                _record_resolved_dtype(out, resolved[0])
            backend = instantiate_plugin(cfg.backend, "backend")
            result = backend.run(cfg)
        except Exception as e:
            from rlkit.checkpoint import CheckpointError

            e = _explain_disk_full(e)
            if (out is not None and isinstance(e, (ConfigError, CheckpointError))
                    and os.path.realpath(out) not in _accepted and _restore_accepted_config(out)):
                log.info("this attempt was refused; %s keeps the Hydra record of the run it holds", out)
            _write_error(cfg, e)
            raise e
        try:
            accept_run_config(out)  # a backend that does not accept early: its run is done
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


def _write_error(cfg: DictConfig, err: BaseException) -> None:
    import traceback

    try:
        out = _output_dir(cfg)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            # written whole or not at all (a full disk must not leave an empty error.txt)
            tmp = out / f".{ERROR_FILE}.tmp"
            try:
                tmp.write_text(f"{type(err).__name__}: {err}\n\n" + "".join(traceback.format_exception(err)))
                os.replace(tmp, out / ERROR_FILE)
            finally:
                tmp.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - never hide the job's own error behind this one
        pass
