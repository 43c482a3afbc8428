"""The one-time builds' cache: content keys, build records, resumable progress and atomic saves.

A one-time build (the grounding stage, each SFT warm-start stage) is a full checkpoint cached under
``paths.cache_dir/<stage>/<key>``, where the key is the sha256 of everything that determines it
(``cache_key_inputs``): its config, the env and policy configs, the builder version, and what the env's code
puts in its prompt (``prompt_fingerprint``). A second run, or the second job of a sweep, finds the entry and
reuses it; jobs that need the same entry at once build it once (``FileLock``). A build in progress saves its
state every ``PARTIAL_EVERY`` steps (``partial_dir``) so a stopped build resumes where it left off, and a
finished one is written to a temp folder and renamed (``save_stage``), so an entry is never half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from omegaconf import OmegaConf

from rlkit.config import KEYS_ADDED_LATER, compat_table
from rlkit.hardware import cpu_record
from rlkit.tasks import TaskSampler
from rlkit.types import EnvSpec, SupportsDemonstrations, SupportsRecoveryDemonstrations

log = logging.getLogger(__name__)


#: Bump when the warm-start builder changes what it produces for the same config (a new cache key).
SFT_BUILDER_VERSION = 2

#: Policy config keys that do not change a full fine-tuning stage's checkpoint, left out of the cache
#: key: where things are (cache_dir), and the LoRA adapter of the later GRPO stage (the warm start and
#: grounding train all weights, without an adapter), so a sweep over policy.lora.* shares one warm start.
_IGNORED_POLICY_KEYS = ("cache_dir", "lora")


#: Env keys that leave a build's key when at this value (conf/compat.yaml): keys added after caches existed, at
#: the value that draws what builds drew before them, and keys removed since, at the value that drew what builds
#: draw now (an older run's config still finds its entries).
_ENV_KEYS_NEUTRAL: dict[str, Any] = {k[len("env."):]: v for k, v in {**KEYS_ADDED_LATER, **compat_table("removed")}.items()
                                     if k.startswith("env.")}


def sft_cache_key(sft_cfg: Any, env_cfg: Any, policy_cfg: Any, decoding: Any = None, prompt: str | None = None) -> str:
    """``cache_key_of(cache_key_inputs(...))``: the 16-hex-char cache key of a one-time build (see there)."""
    return cache_key_of(cache_key_inputs(sft_cfg, env_cfg, policy_cfg, decoding, prompt))


def prompt_fingerprint(env_spec: EnvSpec, recovery: bool = False) -> str:
    """The first 16 hex chars of the sha256 of the env's opening prompt and the answer a warm start learns for it:
    its system prompt, the first user text of its first evaluation task and, where the env has a solver
    (rlkit.types.SupportsDemonstrations), that task's demonstrated answers. Both are the env's code, not its config, so a warm
    start keyed on the config alone would be reused after either text changed, though it learned another
    prompt or another answer format; the warm-start keys hash this too (``cache_key_inputs``' ``prompt``).
    ``recovery``: for a stage that learns recovery demonstrations (``sft.recovery_share`` > 0), that task's recovery
    demonstration drawn with ``numpy.random.default_rng(0)`` is hashed too, with its imitate flags (the env's code
    draws the mistakes). Raises: TypeError with ``recovery`` for an env without recovery demonstrations."""
    env = env_spec.make()
    seed = env_spec.eval_seeds()[0]
    obs = env.reset(seed)
    answers = env_spec.demonstration(seed) if isinstance(env_spec, SupportsDemonstrations) else []
    if recovery:
        if not isinstance(env_spec, SupportsRecoveryDemonstrations):
            raise TypeError(f"{type(env_spec).__name__} has no recovery_demonstration(seed, rng); "
                            "set sft.recovery_share=0")
        answers = [*answers, *(f"{text}\t{int(imitate)}" for text, imitate in
                               env_spec.recovery_demonstration(seed, np.random.default_rng(0)))]
    text = "\n".join([env.system_prompt or "", obs.text, *answers])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key_of(inputs: dict[str, Any]) -> str:
    """The cache key of ``cache_key_inputs``' dict: the first 16 hex chars of the sha256 of its sorted JSON."""
    blob = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_key_inputs(sft_cfg: Any, env_cfg: Any, policy_cfg: Any, decoding: Any = None,
                     prompt: str | None = None) -> dict[str, Any]:
    """What determines a one-time build's checkpoint, as its cache key hashes it: the sft, env and policy configs, the
    builder version (SFT_BUILDER_VERSION) and, for a policy loaded from a local checkpoint folder, that
    checkpoint's content fingerprint (``checkpoint_fingerprint``) instead of its path.

    ``decoding``: what else the stage's outcome depends on, hashed as given when not None. The SFT
    stage passes its greedy validation's ``max_new_tokens`` and stop strings (``rollout.*``): they
    decide the val success at which it stops, so another value must build another warm start.
    ``prompt``: the env's ``prompt_fingerprint``, hashed when not None (the SFT stages pass it: their
    demonstrations answer that prompt; an edited prompt text must build another warm start).

    Location does not count: ``policy.cache_dir`` is left out, so a copied or shared cache
    (another RLKIT_CACHE_DIR, another machine's mount point) finds its entries. Nor does
    ``policy.lora``: the stage trains all weights, the adapter belongs to GRPO. Nor does an env key
    added or removed since caches existed, at its neutral value (``env.holdout`` at "layout"; conf/compat.yaml):
    caches built before the change stay valid.
    Returns a dict {sft, env, policy, builder_version[, decoding][, prompt]} of plain
    values; a build records it
    (``build`` in its summary) so that a cache entry says what it is (scripts/cache.py).
    """
    def plain(v: Any) -> Any:
        return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v

    policy = dict(plain(policy_cfg) or {})
    for key in _IGNORED_POLICY_KEYS:
        policy.pop(key, None)
    path = policy.get("path")
    if isinstance(path, str) and Path(path).is_dir():
        policy["path"] = {"fingerprint": checkpoint_fingerprint(Path(path))}
    env = plain(env_cfg)
    for added_later, before in _ENV_KEYS_NEUTRAL.items():  # at `before`: the tasks every earlier build drew
        if isinstance(env, dict) and added_later in env and env[added_later] == before:
            env = {k: v for k, v in env.items() if k != added_later}
    content = {"sft": plain(sft_cfg), "env": env, "policy": policy, "builder_version": SFT_BUILDER_VERSION}
    if decoding is not None:
        content["decoding"] = plain(decoding)
    if prompt is not None:
        content["prompt"] = prompt
    return content


def build_record(build: dict[str, Any] | None, policy: Any = None) -> dict[str, Any]:
    """What a one-time build's summary keeps of how it was built (``build`` in sft_summary.json and
    grounding_summary.json, listed by scripts/cache.py): the caller's ``build`` (stage, the checkpoint it
    started from, ``inputs``: ``cache_key_inputs``, and with them ``key``), plus the torch version, its
    intra-op thread count, the device ``policy``'s weights are on (its GPU's name; else cpu) and the CPU, and the
    UTC time it finished: a bf16 build rounds differently on another CPU or thread count, so the same key can hold
    other weights elsewhere. (A resumed build records the machine of its last part.)"""
    record = dict(build or {})
    if "inputs" in record:
        record["key"] = cache_key_of(record["inputs"])
    device = next(policy.model.parameters()).device if policy is not None else torch.device("cpu")
    record.update({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                   "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "cpu": cpu_record()["cpu"],
                   "cpu_flags": cpu_record()["flags"],
                   "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return json.loads(json.dumps(record, default=str))


#: Files up to this size are hashed whole (a tiny checkpoint's weights: a few MiB); larger ones by samples.
_WHOLE_FILE_BYTES = 256 << 20
#: A larger file (an 8B checkpoint's shards, GiBs each) is hashed by this many evenly spaced 1 MiB chunks.
_CHUNKS = 64


def checkpoint_fingerprint(folder: Path) -> str:
    """sha256 over a checkpoint folder's files by relative name, size and content, the same wherever the
    folder is copied to. Files up to 256 MiB (config, tokenizer, a tiny model's weights) count whole; a larger
    one (a shard of an 8B checkpoint) by 64 evenly spaced 1 MiB chunks, its first and last included, so the
    key costs 64 MiB of reading per shard, not the whole model. A checkpoint retrained or overwritten in place
    changes its key (its weights change throughout); a change confined to bytes between the chunks of a
    large shard would not."""
    h = hashlib.sha256()
    chunk = 1 << 20
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        size = f.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= _WHOLE_FILE_BYTES:
                for block in iter(lambda: fh.read(chunk), b""):
                    h.update(block)
            else:
                for i in range(_CHUNKS):
                    fh.seek((size - chunk) * i // (_CHUNKS - 1))
                    h.update(fh.read(chunk))
    return h.hexdigest()


#: A build saves its progress (``partial_dir``) this often, in steps, and at every validation check.
PARTIAL_EVERY = 50


def partial_dir(out_dir: Path) -> Path:
    """Where the build of ``out_dir`` keeps its progress until it is done (a sibling folder)."""
    return out_dir.with_name(out_dir.name + ".partial")


def save_partial(folder: Path, state: dict[str, Any]) -> None:
    """Write a build's progress (one torch.save file) atomically: a temp file renamed over the old one."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"state.pt.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before it replaces the last good save
    os.replace(tmp, folder / "state.pt")


_PARTIAL_KEYS = ("model", "optimizer", "scheduler", "generator", "torch_rng", "sampler", "grounding_sampler",
                 "grounding_rng", "step", "history", "order", "num_drawn", "val_success", "wall_time_s", "resumed_at")


def load_partial(folder: Path, keys: Iterable[str] = _PARTIAL_KEYS, stage: str = "sft") -> dict[str, Any] | None:
    """A stopped build's saved progress, or None when there is none or it cannot be read (a file cut short,
    another version's fields: one of ``keys`` missing): such a folder is removed with a warning naming the
    ``stage``, and the build starts over."""
    path = folder / "state.pt"
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # saved on a GPU, resumed anywhere
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"no {', '.join(missing)}")
        return state
    except Exception as e:  # noqa: BLE001 - any unreadable save means: start over
        log.warning("%s: the saved progress in %s cannot be read (%s: %s); removing it, the build starts over",
                    stage, folder, type(e).__name__, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def restore_training_state(state: dict[str, Any], policy: Any, opt: Any, sched: Any, sampler: TaskSampler) -> None:
    """Load what every resumable build saves (weights, AdamW, lr schedule, torch RNG, task sampler) from
    ``state`` (``load_partial``) into the live objects."""
    policy.model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    sampler.load_state_dict(state["sampler"])


def save_stage(policy: Any, out_dir: Path, summary_name: str, summary: dict[str, Any]) -> None:
    """Save a one-time stage's full checkpoint and its summary JSON to ``out_dir`` atomically: written
    to a sibling temp folder, then renamed, so ``out_dir`` is never half-written (the caches test
    for the summary file)."""
    tmp = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp)
    (tmp / summary_name).write_text(json.dumps(summary, indent=1))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)


class FileLock:
    """Exclusive advisory lock (``fcntl.flock``) on ``path``, so concurrent jobs build a shared cache entry once."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self) -> "FileLock":
        import fcntl

        self.fh = open(self.path, "w")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        import fcntl

        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
