"""Resume: which checkpoint a run goes on from, whether it is the same experiment, and what a checkpoint holds.

A GRPO checkpoint (rlkit.checkpoint: atomic, ``latest`` points only at complete ones) holds the adapter, the
optimizer and LR-scheduler state, the RNG states (torch, numpy, Python, the update's shuffle generator), the
task sampler's position, the sampling strategy's state, the run's step, W&B id and wall time, and how many
metrics.jsonl lines it had logged; ``config.yaml`` is the run's config. Loading it makes the resumed run log
exactly what the uninterrupted run would have (tests/test_resume.py).

A resume may change only ``RESUMABLE_KEYS`` (how long, how fast, where things go); any other change makes it
another experiment and is refused, listing the keys. A checkpoint written by an earlier rlkit is read through
conf/compat.yaml: keys added since read as the value that did what runs did before, renamed keys under their
new names, and keys of removed levers are accepted at the value that did what runs do now.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlkit import checkpoint as ckpt
from rlkit.config import KEYS_ADDED_LATER, compat_table
from rlkit.run_folder import SWEPT_KEYS_ENV, swept_keys

#: Config keys (dotted; a key covers everything under it) that may change when a run resumes. The new
#: values apply from the resumed step on: ``steps`` (train to the new total; a cosine schedule stretches to
#: it), ``lr`` (the base learning rate; the schedule's factor at the resumed step is kept), loop cadence and
#: checkpointing (``trainer``), where metrics go (``logger``), how the job runs (``backend``, ``paths``), the
#: extra pass@k evaluation, the reward's guard (time limit, on_error) and ``rollout.reuse_kv_cache`` (how
#: multi-turn rollouts are computed, not what they sample: exact) and ``rollout.engine`` (who samples: the same
#: distribution, other random draws, like a change of backend). Each resume that changes something appends
#: what changed, and from which step, to resumes.jsonl.
RESUMABLE_KEYS = ("steps", "lr", "trainer", "logger", "backend", "paths", "eval.pass_k", "eval.seen_tasks",
                  "reward.timeout_s", "reward.on_error", "rollout.reuse_kv_cache", "rollout.engine")

#: The git tag that holds the removed levers' code (conf/compat.yaml ``removed``).
REMOVED_LEVERS_TAG = "levers-before-removal"

#: conf/sampling/'s options before the strategies were classes (``sampling.name``) -> their ``_target_`` today
#: (rlkit.sampling.strategies.TARGETS; written out here so that resume stays below the sampling package).
SAMPLING_TARGETS = {"plain": "rlkit.sampling.PlainSampling", "dapo": "rlkit.sampling.DapoSampling"}


@dataclass
class RunState:
    """What the loop carries from step to step, beside the weights: the last finished step, the logger's run
    id, the training wall time accumulated over resumed segments (seconds), the success before training."""

    step: int = 0
    run_id: str | None = None
    wall_time_s: float = 0.0
    eval_success_before: float | None = None


def resume_path(mode: str, ckpt_root: Path, path: str | None, overwrite: bool) -> Path | None:
    """The checkpoint a run resumes from (``trainer.resume_mode``: latest | none | from_path), or None to start
    fresh. Raises: CheckpointError on an unusable ``trainer.resume_path``, on ``latest`` over checkpoints none of
    which is usable, or on ``none`` over existing checkpoints without ``trainer.overwrite``."""
    if mode == "from_path":
        found = Path(str(path))
        problem = ckpt.verify(found) if found.is_dir() else "it does not exist"
        if problem:
            raise ckpt.CheckpointError(f"trainer.resume_path={found} is not a usable checkpoint: {problem}")
        return found
    if mode == "latest":
        found = ckpt.find_latest(ckpt_root)
        unusable = sorted(ckpt_root.glob(f"{ckpt.PREFIX}*")) if found is None and ckpt_root.is_dir() else []
        if unusable:  # an earlier run's checkpoints, none usable: starting fresh would redo (and overwrite) it
            raise ckpt.CheckpointError(
                f"{ckpt_root} holds {len(unusable)} checkpoint(s) of an earlier run and none is usable "
                f"({unusable[-1].name}: {ckpt.verify(unusable[-1])}); repair or copy one back, or start that "
                "run over with trainer.resume_mode=none trainer.overwrite=true")
        return found
    if mode == "none" and ckpt.complete_checkpoints(ckpt_root) and not overwrite:
        raise ckpt.CheckpointError(
            f"{ckpt_root} already holds checkpoints and trainer.resume_mode=none; "
            f"use trainer.resume_mode=latest to continue, or trainer.overwrite=true to start over there")
    return None


def adapter_base_model(checkpoint: Path) -> str | None:
    """The base checkpoint the adapter of the GRPO checkpoint folder ``checkpoint`` was trained on
    (``adapter/rlkit_adapter.json``'s base_model, rlkit.sync), or None when it records none or cannot be read."""
    try:
        return json.loads((checkpoint / "adapter" / "rlkit_adapter.json").read_text()).get("base_model") or None
    except (OSError, ValueError):
        return None


def recorded_base(path: Path, cache_dir: str | Path, prompt: str | None, say: Callable[[str], None]) -> str | None:
    """The built stage (warm start or grounded base) the checkpoint at ``path`` was trained on, as its adapter
    records it, when it still exists as a finished build: at the recorded path, or under ``cache_dir`` (a moved
    or shared cache keeps its entries' names); else None.

    A resumed run puts its adapter back on those weights rather than on what the config keys today (a key that
    now hashes more, or a build rounded on another CPU, would otherwise stack the adapter on other weights).
    Says so when that build was made for another prompt than ``prompt`` (rlkit.stages.cache.prompt_fingerprint).
    """
    base = adapter_base_model(path)
    if not base:
        return None
    summaries = ("sft_summary.json", "grounding_summary.json")
    for folder in (Path(base), Path(cache_dir) / Path(base).parent.name / Path(base).name):
        done = [folder / f for f in summaries if (folder / f).is_file()]
        if done:
            break
    else:
        return None
    try:
        built_for = json.loads(done[0].read_text()).get("build", {}).get("inputs", {}).get("prompt")
    except (OSError, ValueError):
        built_for = None
    if built_for is not None and prompt is not None and built_for != prompt:
        say(f"warning: the warm start {folder} was built for another prompt or answer format than the env's today; "
            "the resumed run goes on from it, as it started (start fresh to rebuild: trainer.resume_mode=none "
            "trainer.overwrite=true)")
    return str(folder)


def _flat(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = node
    return out


def upgrade_flat_config(old: dict[str, Any], new_keys: set[str]) -> dict[str, Any]:
    """A checkpoint's flat config (``{dotted key: value}``) read as today's rlkit reads it (conf/compat.yaml):
    renamed keys under their new names, removed levers' keys dropped where they hold their neutral value
    (kept otherwise, so the change is refused), keys added since filled with their old-behaviour value."""
    a = dict(old)
    for old_key, new_key in compat_table("renamed").items():
        if old_key in a and new_key not in a:
            a[new_key] = a.pop(old_key)
    if "sampling.max_rounds" in a and "sampling.name" not in a and "sampling._target_" not in a:
        a["sampling.name"] = "dapo" if a["sampling.max_rounds"] else "plain"  # before conf/sampling/: rounds > 0 = dapo
    if "sampling.name" in a and "sampling._target_" not in a:  # before the strategies were classes (issue 76)
        name = a.pop("sampling.name")
        a["sampling._target_"] = SAMPLING_TARGETS.get(name, name)
        if name == "plain":  # plain's unused keys, at the values that said so, are not keys of PlainSampling
            for key, neutral in (("sampling.max_rounds", 0), ("sampling.adaptive_batch", False)):
                if a.get(key) == neutral:
                    del a[key]
    for old_key, new_key in compat_table("renamed_one_phase").items():
        phases = a.get(old_key)
        if new_key not in a and isinstance(phases, list) and len(phases) == 1 and isinstance(phases[0], list):
            a.pop(old_key)
            a[new_key] = list(phases[0])
    removed = compat_table("removed")
    for key, neutral in removed.items():
        if key in a and key not in new_keys and a[key] == neutral:
            del a[key]
    for key, value in KEYS_ADDED_LATER.items():
        if key not in a and key in new_keys:
            a[key] = value
    return a


def config_changes(old: DictConfig, new: DictConfig) -> dict[str, tuple[Any, Any]]:
    """Leaves that differ between a checkpoint's config and this run's (unresolved), as {dotted key: (old, new)};
    the old config read through ``upgrade_flat_config``. A key present in one only compares with None. Lists are
    compared as values."""
    b = _flat(OmegaConf.to_container(new, resolve=False), "", {})
    a = upgrade_flat_config(_flat(OmegaConf.to_container(old, resolve=False), "", {}), set(b))
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def resumable(key: str) -> bool:
    """Whether ``key`` may change on resume (``RESUMABLE_KEYS``)."""
    return any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS)


def check_same_experiment(path: Path, cfg: DictConfig, out: Path, ckpt_root: Path) -> dict[str, tuple[Any, Any]]:
    """Compare this run's config with the checkpoint's; returns the changed RESUMABLE_KEYS leaves as {dotted key:
    (checkpoint value, new value)}. Raises: CheckpointError listing every other changed key with the fix (a
    removed lever's key set to a value other than its neutral one names the tag that holds that lever), or a
    sweep's change of a swept key (``check_sweep_resume``)."""
    changes = config_changes(OmegaConf.load(path / "config.yaml"), cfg)
    refused = sorted(k for k in changes if not resumable(k))
    if refused:
        removed = [k for k in refused if k in compat_table("removed") and changes[k][1] is None]
        shown = ", ".join(f"{k} ({changes[k][0]!r} -> {changes[k][1]!r})" for k in refused[:12])
        more = f" and {len(refused) - 12} more" if len(refused) > 12 else ""
        lever = (f" {', '.join(removed)} belong(s) to levers removed from rlkit (docs/experiments.md); that run "
                 f"resumes with the code at git tag {REMOVED_LEVERS_TAG}." if removed else "")
        raise ckpt.CheckpointError(
            f"cannot resume from {path}: these keys change the experiment: {shown}{more}.{lever} "
            f"On resume only these may change: {', '.join(RESUMABLE_KEYS)}. Restore the others, or start a "
            f"new run (another hydra.run.dir, or trainer.resume_mode=none trainer.overwrite=true)."
        )
    check_sweep_resume(path, changes, out, ckpt_root)
    return changes


def check_sweep_resume(path: Path, changes: dict[str, tuple[Any, Any]], out: Path, ckpt_root: Path) -> None:
    """In a sweep (``-m``), refuse a resume that changes a key this sweep sweeps, even a resumable one.

    Hydra matches a sweep's jobs to folders by job number, so a sweep run again into the same
    ``hydra.sweep.dir`` with another value list would hand job 0's folder, trained at ``lr=1e-5``, the value
    ``lr=1e-4``. The swept keys come from the sweep's ``multirun.yaml`` in a local multirun, and from
    ``$RLKIT_SWEPT_KEYS`` (rlkit.run_folder.SWEPT_KEYS_ENV) in a job the Ray Jobs launchers run on a cluster.
    Raises CheckpointError naming the key, both values and the fix."""
    if ckpt_root.resolve() not in Path(path).resolve().parents:
        return  # trainer.resume_path: a sweep may well start every job from one checkpoint elsewhere
    try:
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            swept = swept_keys(Path(hc.sweep.dir))
        else:
            swept = {k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k}
    except Exception:  # noqa: BLE001 - not a Hydra run (tests, launchers calling run() directly)
        return
    clash = sorted(k for k in changes if any(k == s or k.startswith(s + ".") for s in swept))
    if clash:
        shown = ", ".join(f"{k}={changes[k][0]!r}" for k in clash)
        now = ", ".join(f"{k}={changes[k][1]!r}" for k in clash)
        raise ckpt.CheckpointError(
            f"cannot resume {out} in this sweep: that folder's run has {shown} ({path}), and this sweep gives its "
            f"job {now}. Hydra matches a sweep's jobs to folders by number, so a sweep with other values (one "
            "added, another order) would relabel finished runs. Run the new values into a new hydra.sweep.dir "
            "(with launcher=ray / hyperpod also a new hydra.launcher.sweep_dir, when it is set), or repeat the "
            "earlier sweep's values to resume it."
        )


def clear_earlier_run(out: Path, ckpt_root: Path, say: Callable[[str], None]) -> None:
    """Under ``trainer.overwrite=true`` (start over in this folder), remove what the earlier run there wrote before
    this one starts: its checkpoints, evaluations (``eval/step_*.json``, ``final.json``, ``seen_*.json``), exports,
    adapter (``adapter/`` holding ``rlkit_adapter.json``), ``result.json`` and ``resumes.jsonl``; nothing else, so a
    run pointed at a folder that holds other work removes none of it. Kept, they would be read as this run's."""
    removed = []
    targets = [*ckpt_root.glob(f"{ckpt.PREFIX}*"), ckpt_root / ckpt.LATEST, *ckpt_root.glob(".tmp-*"),
               *(out / "eval").glob("step_*.json"), out / "eval" / "final.json", *(out / "eval").glob("seen_*.json"),
               *(out / "exports").glob("step_*"), out / "result.json", out / "resumes.jsonl"]
    if (out / "adapter" / "rlkit_adapter.json").is_file():
        targets.append(out / "adapter")
    for t in targets:
        if t.is_symlink() or t.is_file():
            t.unlink()
        elif t.is_dir():
            shutil.rmtree(t)
        else:
            continue
        removed.append(t.relative_to(out).parts[0])
    if removed:
        say(f"starting over in {out} (trainer.overwrite=true): removed the earlier run's "
            f"{', '.join(dict.fromkeys(removed))}")


def apply_resume_changes(changes: dict[str, tuple[Any, Any]], lr: float, optimizer: Any, scheduler: Any,
                         out: Path, path: Path, step: int, say: Callable[[str], None]) -> None:
    """Make the resumed run use its new settings (RESUMABLE_KEYS) and record them in resumes.jsonl.

    ``lr``: the checkpoint's optimizer and scheduler carry the old base lr; replace it. ``steps``: the scheduler
    was built for the new total (a cosine stretches to it), but the loaded optimizer holds the lr the old total
    gave the resumed step. Either way the resumed step's lr is set to the new base lr x the new schedule's factor
    at that step. The other keys are read from the config as the loop goes.
    """
    if "lr" in changes:
        scheduler.base_lrs = [float(lr) for _ in scheduler.base_lrs]
        for group in optimizer.param_groups:
            group["initial_lr"] = float(lr)
    if "lr" in changes or "steps" in changes:
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * factor
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    if changes:
        shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in sorted(changes.items())))
        say(f"resuming with changed settings from step {step + 1}: {shown}")
        record = {"from_step": step + 1, "checkpoint": str(path),
                  "changes": {k: {"was": a, "now": b} for k, (a, b) in sorted(changes.items())}}
        with open(out / "resumes.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")


def save_checkpoint(ckpt_root: Path, step: int, *, policy: Any, optimizer: Any, scheduler: Any,
                    shuffle_gen: torch.Generator, sampler: Any, state: RunState, strategy_state: dict[str, Any],
                    metrics_lines: int, config_yaml: str, max_to_keep: int,
                    before_rng: Callable[[], None] | None = None) -> None:
    """Write the checkpoint of step ``step`` atomically (rlkit.checkpoint.save): the adapter, optimizer.pt
    (optimizer and scheduler), rng.pt, trainer_state.json (step, sampler, run id, wall time, the Python and
    numpy RNGs, ``strategy_state``: the sampling strategy's own keys, and the metrics.jsonl lines logged) and
    config.yaml. ``before_rng``: called after the optimizer is written (fault injection in tests)."""

    def contents(d: Path) -> None:
        policy.save_adapter(d / "adapter")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, d / "optimizer.pt")
        if before_rng is not None:
            before_rng()
        torch.save({"torch": torch.get_rng_state(), "shuffle": shuffle_gen.get_state()}, d / "rng.pt")
        meta = {"step": step, "sampler": sampler.state_dict(), "run_id": state.run_id,
                "wall_time_s": state.wall_time_s, "eval_success_before": state.eval_success_before,
                "python_rng": random.getstate(), "numpy_rng": _listify(np.random.get_state()),
                **strategy_state, "metrics_lines": metrics_lines}
        (d / "trainer_state.json").write_text(json.dumps(meta, default=_json_default))
        (d / "config.yaml").write_text(config_yaml)

    ckpt.save(ckpt_root, step, contents, max_to_keep=max_to_keep)


def checkpoint_step(path: Path) -> int:
    """The GRPO step the checkpoint at ``path`` was saved after (its trainer_state.json)."""
    return int(json.loads((path / "trainer_state.json").read_text())["step"])


def load_checkpoint(path: Path, *, policy: Any, optimizer: Any, scheduler: Any, shuffle_gen: torch.Generator,
                    sampler: Any) -> tuple[RunState, dict[str, Any]]:
    """Load the checkpoint at ``path`` into the live objects and the global RNGs; returns (RunState, the
    trainer_state.json dict, whose ``metrics_lines`` and sampling-strategy keys the caller reads)."""
    policy.load_adapter(path / "adapter")
    trainer_state = torch.load(path / "optimizer.pt", weights_only=True)
    optimizer.load_state_dict(trainer_state["optimizer"])
    scheduler.load_state_dict(trainer_state["scheduler"])
    meta = json.loads((path / "trainer_state.json").read_text())
    sampler.load_state_dict(meta["sampler"])
    state = RunState(step=meta["step"], run_id=meta.get("run_id"), wall_time_s=meta.get("wall_time_s", 0.0),
                     eval_success_before=meta.get("eval_success_before"))
    random.setstate(_tuplify(meta["python_rng"]))
    np.random.set_state(_tuplify(meta["numpy_rng"]))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    shuffle_gen.set_state(rng["shuffle"])
    return state, meta


def _listify(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, list)):
        return [_listify(v) for v in x]
    return x


def _tuplify(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    return x


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")
