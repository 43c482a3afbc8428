"""Supervised warm start: the analogue of the VisGym SFT checkpoint GRPO starts from.

Solver demonstrations come from the env (``EnvSpec.make().demonstration(seed)``: the assistant texts
of a solved episode, in the env's own output format) on training seeds only; evaluation seeds are
never used. Each demonstration is replayed through the env to get the observations, and encoded
with the policy's chat format exactly as a rollout would be; the loss is the cross-entropy on the
assistant tokens only (loss mask 1), i.e. the mean negative logprob of the demonstrated tokens.

Training stops when the greedy success on ``val_tasks`` held-out training seeds reaches
``target_success`` (checked every ``eval_every`` steps) or after ``max_steps``. Each check also
records, in ``sft_summary.json``'s history, the teacher-forced fit to those seeds' demonstrations
(``demonstration_metrics``: loss, token accuracy, first-decision accuracy) and the share of
distinct greedy answers, which tell a policy that reads its observation from one that learned an
answer prior. The model is then
saved as a full HF checkpoint (save_pretrained) under a folder named by a hash of everything that
determines it, so a second run (or the second job of a sweep) reuses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from omegaconf import OmegaConf

from rlkit.config import KEYS_ADDED_LATER, SFTConfig
from rlkit.evaluation import evaluate
from rlkit.rollout import Trajectory, route_in_text, with_continuations
from rlkit.tasks import TaskSampler, training_sampler
from rlkit.types import Episode, EnvSpec
from rlkit.update import warmup_schedule

log = logging.getLogger(__name__)


#: Bump when the warm-start builder changes what it produces for the same config (a new cache key).
SFT_BUILDER_VERSION = 2

#: Bump when what a route-pass warm start (``env.route_context=text``) produces changes for the same config. Hashed
#: into the keys of route-pass builds only, so the other warm starts keep theirs. 2: the continuation's loss on the
#: route alone (not ``<answer>``) and the second pass's own sampling seed (03fa612); builds before it were keyed
#: without this field and are not reused.
ROUTE_PASS_BUILDER_VERSION = 2

#: Policy config keys that do not change a full fine-tuning stage's checkpoint, left out of the cache
#: key: where things are (cache_dir), and the LoRA adapter of the later GRPO stage (the warm start and
#: grounding train all weights, without an adapter), so a sweep over policy.lora.* shares one warm start.
_IGNORED_POLICY_KEYS = ("cache_dir", "lora")


#: Env keys added after warm-start caches existed, with the value that draws what builds drew before the key.
_ENV_KEYS_ADDED_LATER: dict[str, Any] = {k[len("env."):]: v for k, v in KEYS_ADDED_LATER.items()
                                         if k.startswith("env.")}


def sft_cache_key(sft_cfg: Any, env_cfg: Any, policy_cfg: Any, decoding: Any = None, prompt: str | None = None) -> str:
    """``cache_key_of(cache_key_inputs(...))``: the 16-hex-char cache key of a one-time build (see there)."""
    return cache_key_of(cache_key_inputs(sft_cfg, env_cfg, policy_cfg, decoding, prompt))


def prompt_fingerprint(env_spec: EnvSpec) -> str:
    """The first 16 hex chars of the sha256 of the env's opening prompt and the answer a warm start learns for it:
    its system prompt, the first user text of its first evaluation task and, where the env has a solver
    (``demonstration``), that task's demonstrated answers. Both are the env's code, not its config, so a warm
    start keyed on the config alone would be reused after either text changed, though it learned another
    prompt or another answer format; the warm-start keys hash this too (``cache_key_inputs``' ``prompt``)."""
    env = env_spec.make()
    seed = env_spec.eval_seeds()[0]
    obs = env.reset(seed)
    demonstration = getattr(env, "demonstration", None)
    answers = demonstration(seed) if callable(demonstration) else []
    text = "\n".join([getattr(env, "system_prompt", None) or "", getattr(obs, "text", ""), *answers])
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
    ``policy.lora``: the stage trains all weights, the adapter belongs to GRPO. Nor does
    ``env.train_room_endpoints`` or ``env.train_open_passage`` when it is 0, or ``env.holdout`` when it is
    "layout" (``_ENV_KEYS_ADDED_LATER``: caches built before the key existed stay valid). A route-pass build
    (``env.route_context`` "text") also hashes ``ROUTE_PASS_BUILDER_VERSION``.
    Returns a dict {sft, env, policy, builder_version[, route_pass_builder_version][, decoding][, prompt]} of plain
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
    for added_later, before in _ENV_KEYS_ADDED_LATER.items():  # at `before`: the tasks every earlier build drew
        if isinstance(env, dict) and added_later in env and env[added_later] == before:
            env = {k: v for k, v in env.items() if k != added_later}
    content = {"sft": plain(sft_cfg), "env": env, "policy": policy, "builder_version": SFT_BUILDER_VERSION}
    if isinstance(env, dict) and env.get("route_context") == "text":
        content["route_pass_builder_version"] = ROUTE_PASS_BUILDER_VERSION
    if decoding is not None:
        content["decoding"] = plain(decoding)
    if prompt is not None:
        content["prompt"] = prompt
    return content


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else platform.processor(), else ''."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


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
                   "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "cpu": _cpu_name(),
                   "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return json.loads(json.dumps(record, default=str))


def sft_stage_config(sft_cfg: Any) -> dict[str, Any]:
    """The ``sft`` config as the cache key hashes it: a plain dict, without ``grounding_mix`` or ``route_mix`` when
    they are 0 and without ``lr_schedule`` when it is ``constant`` (those build exactly what the stage built before
    the keys existed, so those caches stay valid), and without ``stages`` (``sft_stage_configs``) or
    ``start_from_env`` / ``start_from_experiment`` (the stage is keyed by the warm start it starts from, through
    the policy config)."""
    plain = OmegaConf.to_container(sft_cfg, resolve=True) if OmegaConf.is_config(sft_cfg) else dict(sft_cfg)
    for key in ("grounding_mix", "route_mix"):
        if not plain.get(key):
            plain.pop(key, None)
    if plain.get("lr_schedule", "constant") == "constant":
        plain.pop("lr_schedule", None)
    plain.pop("stages", None)  # each later stage is keyed on its own, by its predecessor's checkpoint
    # with start_from_* the first stage is keyed by the other job's warm start, as policy.path keys it
    plain.pop("start_from_env", None)
    plain.pop("start_from_experiment", None)
    return plain


def sft_stage_configs(sft_cfg: Any) -> list[dict[str, Any]]:
    """The warm start's stages in order, each as the plain ``sft`` config it trains with (without
    ``stages``): the config itself, then ``sft.stages[i]`` set over it (not over the stage before) for each later
    stage, typed by the ``SFTConfig`` schema as a command-line override would be ("2" -> 2, 1 -> 1.0), so a
    stage keys its cache as the equivalent chained job does. Stage i > 0 starts from stage i - 1's checkpoint
    with a fresh optimizer, as a job with ``policy.path`` pointing at that checkpoint and these sft keys would
    (rlkit.backends.native keys its cache the same way, so the chained jobs' caches and the one job's are the
    same entries). Keys and values are checked by rlkit.config.check_sft_stage before any work.

    Raises: omegaconf.errors.ValidationError on a value of the wrong type (check_sft_stage reports it first).
    """
    base = OmegaConf.to_container(sft_cfg, resolve=True) if OmegaConf.is_config(sft_cfg) else dict(sft_cfg)
    stages = [OmegaConf.to_container(s, resolve=True) if OmegaConf.is_config(s) else dict(s)
              for s in base.pop("stages", None) or []]
    typed = OmegaConf.merge(OmegaConf.structured(SFTConfig), base)
    out = [base]
    for stage in stages:
        merged = OmegaConf.to_container(OmegaConf.merge(typed, stage), resolve=True)
        merged.pop("stages", None)
        out.append(merged)
    return out


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


def longest_demonstration(env_spec: EnvSpec, tokenizer: Any, seeds: Iterable[int],
                          stop: Iterable[str] = ()) -> tuple[int, int | None]:
    """The most tokens a policy must generate in one turn to write the env's solver demonstration of
    any of ``seeds``: ``(tokens, seed)``; ``(0, None)`` if the env has no ``demonstration``.

    A turn's text counts as ``tokenizer`` (the policy's, a transformers tokenizer) encodes it, plus one
    end-of-turn token unless the text ends with one of the ``stop`` strings (generation ends there
    without it). Compared with ``rollout.max_new_tokens``, it says whether a right answer fits in a turn.
    """
    stop = tuple(stop)
    worst: tuple[int, int | None] = (0, None)
    env = env_spec.make()
    if not callable(getattr(env, "demonstration", None)):
        return 0, None
    for seed in seeds:
        for text in env.demonstration(seed):
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + (0 if stop and text.endswith(stop) else 1)
            worst = max(worst, (n, seed), key=lambda w: w[0])
    return worst


def demonstration_trajectory(env_spec: EnvSpec, policy: Any, seed: int) -> Trajectory | None:
    """Replay the env's solver demonstration for ``seed`` and encode it as a token trajectory.

    Returns None when the demonstration does not solve the task within the env's budget (e.g. a
    training maze whose shortest path is longer than the step budget): such tasks are skipped.
    """
    chat, tok = policy.chat, policy.tokenizer
    env = env_spec.make()
    texts = env.demonstration(seed)
    obs = env.reset(seed)
    ids: list[int] = []
    mask: list[int] = []
    images: list[Any] = []
    tt = chat.user_turn(obs.text, obs.images, system=env.system_prompt, first=True)
    for turn, text in enumerate(texts):
        ids += tt.input_ids
        mask += [0] * len(tt.input_ids)
        images += tt.image_inputs
        completion = chat.completion_ids(text)  # text tokens + <|im_end|>
        ids += completion
        mask += [1] * len(completion)
        end = chat.turn_end_ids("stop")
        ids += end
        mask += [0] * len(end)
        out = env.step(text)
        if out.done or out.observation is None or turn + 1 >= env_spec.max_turns:
            break
        tt = chat.user_turn(out.observation.text, out.observation.images, system=None, first=False)
    record = Episode(seed=seed, turns=[], terminated=True, truncated=False, success=bool(env.success()))
    if not record.success:
        return None
    if route_in_text(env_spec):
        return _route_pass_demonstration(env_spec, policy, texts[0], tt, record)
    return Trajectory(ids, mask, [0.0] * len(ids), images, record, group=0, policy_version=-1)


def _route_pass_demonstration(env_spec: EnvSpec, policy: Any, text: str, first_turn: Any, record: Episode) -> Trajectory:
    """A single-turn demonstration ``text`` (notes, ``env_spec.route_opening``, route) in the route pass's two
    sequences, as rlkit.rollout samples them: the picture's prompt then the notes and the opening (loss on both),
    and as its continuation the text prompt (``route_prompt``), the notes and the opening (loss 0: the first
    sequence writes them), then the route (loss on it).

    Raises: ValueError if ``text`` has no opening, or the opening does not end at a token boundary."""
    from types import SimpleNamespace

    chat, tok, opening = policy.chat, policy.tokenizer, env_spec.route_opening
    at = text.find(opening)
    if at < 0:
        raise ValueError(f"the demonstration {text[:40]!r}... has no {opening!r} to end its first pass at")
    completion = chat.completion_ids(text)
    k = _tokens_covering(tok, completion, at + len(opening))
    end = chat.turn_end_ids("stop", opening)
    ids = list(first_turn.input_ids) + completion[:k] + end
    mask = [0] * len(first_turn.input_ids) + [1] * k + [0] * len(end)
    example = SimpleNamespace(notes=text[: at + len(opening)], answer=text[at + len(opening):])
    continuation = encode_route_example(policy, route_prompt(env_spec, policy), example)
    continuation.episode = record
    return Trajectory(ids, mask, [0.0] * len(ids), list(first_turn.image_inputs), record, group=0, policy_version=-1,
                      continuation=continuation)


def _tokens_covering(tok: Any, token_ids: list[int], n_chars: int) -> int:
    """How many of ``token_ids`` spell exactly the first ``n_chars`` characters of their text.
    Raises: ValueError when character ``n_chars`` falls inside a token."""
    count, length = 0, 0
    while length < n_chars and count < len(token_ids):
        length += len(tok.decode([token_ids[count]]))
        count += 1
    if length != n_chars:
        raise ValueError(f"character {n_chars} of the answer falls inside a token: the two passes cannot be split there")
    return count


def demonstration_trajectories(env_spec: EnvSpec, policy: Any, seeds: Iterable[int]) -> list[Trajectory]:
    """``demonstration_trajectory`` of each seed, in order, leaving out the seeds whose demonstration
    does not solve the task within the env's budget (so the list may be shorter than ``seeds``)."""
    return [d for d in (demonstration_trajectory(env_spec, policy, s) for s in seeds) if d is not None]


def batch_shares_prefix(policy: Any) -> bool:
    """Whether a supervised batch runs the shared-prefix forward (rlkit.policy.logprobs): every
    demonstration is encoded with ``group=0``, so the batch's common prefix (the system prompt, ~90
    of ~210 tokens for the VisGym maze) is computed once. Exact within float32 rounding; off where the
    model does not support it (gradient checkpointing)."""
    from rlkit.policy.logprobs import shared_prefix_unsupported

    return shared_prefix_unsupported(policy.model) is None


def demonstration_nll(policy: Any, demonstrations: list[Trajectory], shared_prefix: bool | None = None) -> torch.Tensor:
    """Teacher-forced negative log-likelihood of demonstrations under the policy, with gradient.

    Args: demonstrations (n trajectories, ``demonstration_trajectory``; loss mask 1 on the demonstrated
        tokens), shared_prefix: run the batch's common prefix once (``batch_shares_prefix``; None = when
        the model supports it). Logprobs of the untempered policy (temperature 1).
    Returns: scalar, the mean over every demonstrated token of the batch (nats per token).
    Raises: ValueError for an empty list.
    """
    if not demonstrations:
        raise ValueError("demonstration_nll needs at least one demonstration")
    demonstrations = with_continuations(demonstrations)[0]  # a route pass's second sequence (rlkit.rollout)
    if shared_prefix is None:
        shared_prefix = batch_shares_prefix(policy)
    logprobs, _ = policy.logprobs(demonstrations, temperature=1.0, with_entropy=False,
                                  shared_prefix=shared_prefix)  # [n, T]
    mask = torch.zeros_like(logprobs)
    for i, t in enumerate(demonstrations):
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)


def batch_nll(policy: Any, parts: list[list[Trajectory]], shared_prefix: bool | None = None) -> torch.Tensor:
    """``demonstration_nll`` of the trajectories of every part together (the mean over all their demonstrated
    tokens), each part in its own forward: parts whose prompts differ (demonstrations with a picture, route
    questions on text alone, whose prompts all share one prefix) would each lose their shared prefix in one
    batch, and pad to the longest of the other: measured 1.67 s for 8 demonstrations and 56 route questions in
    one forward, 0.88 s in two. Empty parts are skipped.
    Returns: a scalar tensor with gradient, nats per demonstrated token. Raises: ValueError if every part is empty."""
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return demonstration_nll(policy, parts[0] if parts else [], shared_prefix=shared_prefix)
    tokens = [float(sum(t.num_policy_tokens for t in p)) for p in parts]
    total = sum(tokens) or 1.0
    return sum(demonstration_nll(policy, p, shared_prefix=shared_prefix) * (n / total) for p, n in zip(parts, tokens))


_LOG_HALF = math.log(0.5)  # a token with logprob above this is the greedy (argmax) choice


def demonstration_metrics(policy: Any, trajectories: list[Trajectory], batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced fit of the policy to held-out demonstrations.

    Args:
        policy: the Policy. trajectories: demonstrations (``demonstration_trajectory``), loss mask 1
            on the demonstrated tokens. batch_size: sequences per forward.

    Returns:
        {"loss": mean negative logprob per demonstrated token (nats),
         "token_accuracy": share of demonstrated tokens with probability > 1/2 (so the greedy choice),
         "first_token_accuracy": the same for the first token where the demonstrations of
         different tasks disagree (for plan-mode mazes: the first move), NaN when they never do}.
        Demonstrations with a route pass (``continuation``): loss and token accuracy over the tokens of both
        sequences, first_token_accuracy over the routes (the first move again).
        A policy that ignores its observation shows a first_token_accuracy near the frequency of
        the most common first answer, however low its loss.

    Raises: ValueError for an empty list.
    """
    if not trajectories:
        raise ValueError("demonstration_metrics needs at least one demonstration")
    routes = [t.continuation for t in trajectories if t.continuation is not None]
    if routes:  # route passes (rlkit.rollout): loss and accuracy over both sequences, the first move in the routes
        both = with_continuations(trajectories)[0]
        firsts, seconds = both[: len(trajectories)], both[len(trajectories):]
        fit, route_fit = (demonstration_metrics(policy, part, batch_size) for part in (firsts, seconds))
        n1, n2 = (sum(t.num_policy_tokens for t in part) for part in (firsts, seconds))
        share = n2 / max(n1 + n2, 1)
        return {"loss": fit["loss"] * (1 - share) + route_fit["loss"] * share,
                "token_accuracy": fit["token_accuracy"] * (1 - share) + route_fit["token_accuracy"] * share,
                "first_token_accuracy": route_fit["first_token_accuracy"]}
    targets = [[t.input_ids[j] for j, m in enumerate(t.loss_mask) if m] for t in trajectories]
    # first position (in demonstrated tokens) where the demonstrations disagree
    first_diff = next((k for k in range(min(map(len, targets)))
                       if len({tg[k] for tg in targets}) > 1), None)
    nll, hits, n_tok, first_hits = 0.0, 0, 0, 0
    with torch.no_grad():
        for i in range(0, len(trajectories), batch_size):
            chunk = trajectories[i : i + batch_size]
            logprobs, _ = policy.logprobs(chunk, temperature=1.0, with_entropy=False)  # [n, T]
            for row, t in zip(logprobs, chunk):
                idx = torch.tensor([j for j, m in enumerate(t.loss_mask) if m], dtype=torch.long)
                lp = row[idx].float()
                nll -= float(lp.sum())
                hits += int((lp > _LOG_HALF).sum())
                n_tok += len(idx)
                if first_diff is not None:
                    first_hits += int(lp[first_diff] > _LOG_HALF)
    return {"loss": nll / max(n_tok, 1), "token_accuracy": hits / max(n_tok, 1),
            "first_token_accuracy": first_hits / len(trajectories) if first_diff is not None else float("nan")}


#: A build saves its progress (``partial_dir``) this often, in steps, and at every validation check.
PARTIAL_EVERY = 50


def partial_dir(out_dir: Path) -> Path:
    """Where the build of ``out_dir`` keeps its progress until it is done (a sibling folder)."""
    return out_dir.with_name(out_dir.name + ".partial")


def _save_partial(folder: Path, state: dict[str, Any]) -> None:
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


def _load_partial(folder: Path, keys: Iterable[str] = _PARTIAL_KEYS, stage: str = "sft") -> dict[str, Any] | None:
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


def _restore_training_state(state: dict[str, Any], policy: Any, opt: Any, sched: Any, sampler: TaskSampler) -> None:
    """Load what every resumable build saves (weights, AdamW, lr schedule, torch RNG, task sampler) from
    ``state`` (``_load_partial``) into the live objects."""
    policy.model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    sampler.load_state_dict(state["sampler"])


def train_sft(
    env_spec: EnvSpec,
    policy: Any,
    engine: Any,
    cfg: SFTConfig,
    greedy: Any,
    out_dir: Path,
    progress: Any = None,
    grounding_tasks: Iterable[str] = (),
    on_resume: Callable[[int], None] | None = None,
    build: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the full policy weights on demonstrations; save to ``out_dir`` atomically.

    With ``cfg.grounding_mix`` = N > 0, N grounding questions (``env_spec.grounding_example`` on tasks
    drawn from ``grounding_tasks``, training mazes only) join every batch (rlkit.grounding.encode_example).
    With ``cfg.route_mix`` = M > 0, M route questions on text alone (``env_spec.route_example``, no image; loss
    on the route after ``plan_map``'s notes: ``encode_route_example``) join every batch as well.

    A build that stops before it is done (killed, a crash, a lost machine) resumes where it left off: every
    ``PARTIAL_EVERY`` steps and at each validation check it saves its weights, AdamW and lr-schedule state,
    task samplers, random generators and history to ``partial_dir(out_dir)``, and a later call with the same
    ``out_dir`` (the same cache key: the same config and base) loads them and continues, so the finished
    checkpoint is the one an uninterrupted build writes (bit for bit on the same machine and thread count).
    The folder is removed once ``out_dir`` is saved; a save that cannot be read (cut short, another version's
    fields) is removed with a warning, and the build starts over. ``on_resume(step)`` is called when a build
    resumes.

    Returns: a summary dict (steps, val_success, wall_time_s, num_demos; resumed_at: the steps it resumed
    from, when it did; build: ``build_record(build)``), also written to ``out_dir/sft_summary.json``.
    Raises: RuntimeError if the demonstrations do not solve their tasks; ValueError if grounding_mix > 0
    and the env has no grounding questions or ``grounding_tasks`` is empty (the grounding stage itself
    need not run: its ``grounding.curriculum`` names the tasks), or if route_mix > 0 and the env has no route
    questions or another output format than ``plan_map`` (``route_mix_problem``).
    """
    grounding_tasks = list(grounding_tasks)
    if cfg.grounding_mix > 0 and (not hasattr(env_spec, "grounding_example") or not grounding_tasks):
        raise ValueError(f"sft.grounding_mix={cfg.grounding_mix} needs grounding questions: an env with "
                         f"grounding_example (this one: {type(env_spec).__name__}) and a task list "
                         "(grounding.curriculum); or set sft.grounding_mix=0")
    route_mix = int(getattr(cfg, "route_mix", 0) or 0)
    route_problem = route_mix_problem(env_spec, route_mix)
    if route_problem:
        raise ValueError(route_problem)
    t0 = time.time()
    gen = torch.Generator().manual_seed(cfg.seed)
    sampler = training_sampler(env_spec, cfg.seed)
    val_seeds = sampler.sample(cfg.val_tasks)
    streaming = cfg.num_demos == 0
    demos: list[Trajectory] = []
    num_drawn = 0

    def draw(n: int) -> list[Trajectory]:
        nonlocal num_drawn
        out: list[Trajectory] = []
        for _ in range(100):  # a few draws are skipped (shortest path longer than the budget)
            seeds = sampler.sample(n - len(out))
            num_drawn += len(seeds)
            out += demonstration_trajectories(env_spec, policy, seeds)
            if len(out) >= n:
                return out
        raise RuntimeError(
            f"almost none of {num_drawn} demonstrations solves its task within the env's budget; "
            f"raise env.max_turns or check the env's demonstration()"
        )

    if not streaming:
        demos = draw(cfg.num_demos)
        log.info("sft: %d demonstrations (%d tasks drawn)", len(demos), num_drawn)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    lr_factor = warmup_schedule(cfg.lr_schedule, cfg.warmup_steps, cfg.max_steps,
                                "sft.lr_schedule")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    val_success, step, history = 0.0, 0, []
    val_demos = demonstration_trajectories(env_spec, policy, val_seeds)
    order: list[int] = []
    share = batch_shares_prefix(policy)
    g_sampler = g_rng = None
    if cfg.grounding_mix > 0:
        from rlkit.grounding import draw_examples, encode_example

        g_sampler, g_rng = TaskSampler(cfg.seed + 1, env_spec.is_eval_seed), np.random.default_rng(cfg.seed + 1)
    r_rng = np.random.default_rng(cfg.seed + 2) if route_mix else None
    r_prompt = route_prompt(env_spec, policy) if route_mix else None
    partial, elapsed, resumed_at = partial_dir(out_dir), 0.0, []
    st = _load_partial(partial)
    if st is not None:  # an earlier build of this stage stopped: go on from its last save
        _restore_training_state(st, policy, opt, sched, sampler)
        gen.set_state(st["generator"])
        if g_sampler is not None:
            g_sampler.load_state_dict(st["grounding_sampler"])
            g_rng.bit_generator.state = st["grounding_rng"]
        if r_rng is not None:
            r_rng.bit_generator.state = st["route_rng"]
        step, history, order, num_drawn = st["step"], st["history"], st["order"], st["num_drawn"]
        val_success, elapsed, resumed_at = st["val_success"], st["wall_time_s"], [*st["resumed_at"], st["step"]]
        log.info("sft: resuming %s at step %d", out_dir, step)
        if on_resume is not None:
            on_resume(step)

    def save_progress() -> None:
        _save_partial(partial, {
            "model": policy.model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "generator": gen.get_state(), "torch_rng": torch.get_rng_state(), "sampler": sampler.state_dict(),
            "grounding_sampler": None if g_sampler is None else g_sampler.state_dict(),
            "grounding_rng": None if g_rng is None else g_rng.bit_generator.state,
            "route_rng": None if r_rng is None else r_rng.bit_generator.state,
            "step": step, "history": history, "order": order, "num_drawn": num_drawn, "val_success": val_success,
            "wall_time_s": elapsed + time.time() - t0, "resumed_at": resumed_at})

    while step < cfg.max_steps:
        if streaming:  # a fresh batch of tasks every step: no demonstration is seen twice
            batch = draw(cfg.batch_size)
        else:
            if len(order) < cfg.batch_size:
                order += torch.randperm(len(demos), generator=gen).tolist()
            batch, order = [demos[i] for i in order[: cfg.batch_size]], order[cfg.batch_size :]
        if cfg.grounding_mix > 0:  # the grounding questions beside the demonstrations (sft.grounding_mix)
            batch = batch + [encode_example(policy, ex).trajectory
                             for ex in draw_examples(env_spec, g_sampler, grounding_tasks, cfg.grounding_mix, g_rng)]
        routes = [encode_route_example(policy, r_prompt, env_spec.route_example(r_rng)) for _ in range(route_mix)]
        # route passes (env.route_context=text): the demonstrations' second sequences run with the route questions,
        # whose text prompt they share
        routes += [t.continuation for t in batch if t.continuation is not None]
        batch = [replace(t, continuation=None) if t.continuation is not None else t for t in batch]
        loss = batch_nll(policy, [batch, routes], shared_prefix=share)
        loss.backward()
        loss = loss.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        lr = opt.param_groups[0]["lr"]  # this step's lr (sft.lr_schedule)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        done = False
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            metrics, _, _ = evaluate(env_spec, policy, engine, val_seeds, greedy, policy_version=-1)
            val_success = metrics["eval/success_rate"]
            fit = demonstration_metrics(policy, val_demos) if val_demos else {}
            history.append({"step": step, "loss": float(loss), "lr": lr, "val_success": val_success,
                            "val_distinct_outputs": metrics["eval/distinct_outputs"],
                            **{f"val_{k}": v for k, v in fit.items()}})
            log.debug("sft step %d: %s", step, history[-1])
            done = val_success >= cfg.target_success
        if progress is not None:  # after the check, so the line shows this step's val success
            progress(step, cfg.max_steps, loss.item(), val_success if history else None)
        if done:
            break
        if step < cfg.max_steps and (step % PARTIAL_EVERY == 0 or step % cfg.eval_every == 0):
            save_progress()
    summary = {"steps": step, "val_success": val_success, "num_demos": len(demos) if not streaming else step * cfg.batch_size,
               "num_tasks_drawn": num_drawn,
               "wall_time_s": elapsed + time.time() - t0, "history": history}
    if resumed_at:
        summary["resumed_at"] = resumed_at
    summary["build"] = build_record(build, policy)
    save_stage(policy, out_dir, "sft_summary.json", summary)
    shutil.rmtree(partial, ignore_errors=True)
    return summary


def route_mix_problem(env_spec: EnvSpec, route_mix: float, key: str = "sft.route_mix") -> str | None:
    """Why ``key=route_mix`` (``sft.route_mix``, or ``algorithm.route_coef``) cannot run on ``env_spec`` (an env
    without route questions, or one whose output format has no notes to route from), or None when it can (or is 0)."""
    if not route_mix:
        return None
    if not callable(getattr(env_spec, "route_example", None)):
        return (f"{key}={route_mix} needs route questions on text: an env with route_example (this one: "
                f"{type(env_spec).__name__}); or set {key}=0")
    if getattr(env_spec, "parser", "plan_map") != "plan_map":
        return (f"{key}={route_mix} teaches the route after plan_map's notes (the walls and both ends); this "
                f"env writes env.parser={env_spec.parser}. Set env.parser=plan_map (and rollout.max_new_tokens=64), "
                f"or {key}=0")
    return None


def route_prompt(env_spec: EnvSpec, policy: Any) -> Any:
    """The opening turn of a route question: the env's system prompt and first user text, without the picture
    (``TurnTokens``: input_ids [T] and no image inputs; the same for every question, so built once). Needs an env
    with ``train_seed_stream`` (the first training task supplies the user text)."""
    env = env_spec.make()
    obs = env.reset(next(iter(env_spec.train_seed_stream(0))))
    return policy.chat.user_turn(obs.text, [], system=env.system_prompt, first=True)


def draw_route_questions(env_spec: EnvSpec, policy: Any, seed: int, step: int, n: int) -> list[Trajectory]:
    """The ``algorithm.route_coef`` term's ``n`` route questions of GRPO step ``step`` (``encode_route_example`` of
    ``env_spec.route_example``), drawn from a generator seeded by the run's ``seed`` and the step: a resumed run, and
    every backend, trains on the questions it would have. Returns n text-only trajectories (loss on the route).
    Raises: ValueError from ``route_example`` when the env cannot write route questions (a parser other than
    plan_map)."""
    prompt, rng = route_prompt(env_spec, policy), np.random.default_rng([int(seed), int(step), 29])
    return [encode_route_example(policy, prompt, env_spec.route_example(rng)) for _ in range(n)]


def encode_route_example(policy: Any, prompt: Any, example: Any) -> Trajectory:
    """A route question (``envs.visgym.routes.RouteExample``) as a one-turn trajectory with no image: ``prompt``
    (``route_prompt``), then the assistant's ``notes + answer`` as the policy would write them (its tokens, then
    ``<|im_end|>``). The loss mask is 0 on the notes, which stand in for what the policy reads in a picture, and
    1 on the route and the end of the turn: the question teaches the step from notes to route only.

    Raises: ValueError if the notes do not end at a token boundary (their tokens would carry route text)."""
    chat, tok = policy.chat, policy.tokenizer
    completion = chat.completion_ids(example.notes + example.answer)
    n_notes, length = 0, 0
    while length < len(example.notes):
        length += len(tok.decode([completion[n_notes]]))
        n_notes += 1
    if length != len(example.notes):
        raise ValueError(f"the notes {example.notes[-12:]!r} end inside a token of the route {example.answer[:12]!r}")
    end = chat.turn_end_ids("stop")
    ids = list(prompt.input_ids) + completion + list(end)
    mask = [0] * (len(prompt.input_ids) + n_notes) + [1] * (len(completion) - n_notes) + [0] * len(end)
    record = Episode(seed=-1, turns=[], terminated=True, truncated=False, success=True)
    return Trajectory(ids, mask, [0.0] * len(ids), [], record, group=0, policy_version=-1)


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
