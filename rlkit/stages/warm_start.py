"""The one-time builds before GRPO, as a pipeline: the grounding stage, then the SFT warm start's stages.

``plan_warm_start`` turns a job's config into the list of jobs whose builds it needs, innermost first: with
``sft.start_from_env`` / ``sft.start_from_experiment`` the warm start trains on from another job's warm start
(a chain such as 7x7 -> 9x9 -> 7x7), so that job comes first. Every job of the plan is checked before anything
is built (its config, its grounding tasks, that its solver's answers fit a rollout turn). ``build_warm_start``
then builds the plan in order, each job starting from the checkpoint of the one before: the result is the
warm start of the last job, the one GRPO starts from. Each build is cached (rlkit.stages.cache): a job whose
inputs did not change reuses its entry.

A job's first SFT stage starts from its grounded base (``grounded_base``: a tiny policy grounded on the env's
questions, when ``grounding.enabled``), or from the previous job's warm start; with ``sft.stages`` each later
stage trains on from the stage before. Every stage is keyed as the job ``policy.path=<its start> ~policy.tiny``
would key it (``chained_policy``), so the chain's caches and the chained jobs' caches are the same entries.

The builds run alone in this process, before any rollout or trainer worker starts.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rlkit import resume
from rlkit.cache_dir import legacy_cache_note
from rlkit.config import GroundingConfig, SFTConfig, compat_table, stop_strings
from rlkit.errors import ConfigError
from rlkit.plugins import compose_train, instantiate_plugin
from rlkit.stages.cache import FileLock, cache_key_inputs, cache_key_of, partial_dir, prompt_fingerprint
from rlkit.stages.grounding import format_table, grounding_tasks, train_grounding
from rlkit.stages.sft import longest_demonstration, sft_stage_config, sft_stage_configs, train_sft
from rlkit.types import SupportsEvalHoldout, SupportsGroundingQuestions


@dataclass
class WarmStartJob:
    """One job of a warm-start plan: its composed config, its env spec and what its builds read of them.

    ``source``: the override naming it (``env=<name>`` / ``experiment=<name>``; "" for the job itself).
    ``start_from``: the override of the job whose warm start it trains on from (None: its own grounded base).
    """

    cfg: DictConfig
    env_spec: Any
    source: str = ""
    start_from: str | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    eval_seeds: list[int] = field(default_factory=list)

    @property
    def sft(self) -> SFTConfig:
        return SFTConfig(**OmegaConf.to_container(self.cfg.sft, resolve=True))

    @property
    def label(self) -> str:
        return f" of {self.source}" if self.source else ""


def start_from(sft: Any) -> str | None:
    """The override naming the job whose warm start this one starts from (``env=<name>`` for
    ``sft.start_from_env``, ``experiment=<name>`` for ``sft.start_from_experiment``), or None."""
    if sft.get("start_from_env"):
        return f"env={sft.get('start_from_env')}"
    if sft.get("start_from_experiment"):
        return f"experiment={sft.get('start_from_experiment')}"
    return None


def grounding_key_config(grounding: Any) -> dict[str, Any]:
    """The ``grounding`` config as the build keys hash it: the shape it had when the stage ran in phases
    (conf/compat.yaml ``grounding_key``: ``tasks`` as the one phase, and the keys the phases had), so builds made
    before keep their keys."""
    plain = OmegaConf.to_container(grounding, resolve=True) if OmegaConf.is_config(grounding) else dict(grounding)
    legacy = compat_table("grounding_key")
    tasks = plain.pop("tasks", None)
    return {**plain, legacy["phases_key"]: [list(tasks or [])], **legacy["extra"]}


def grounding_task_list(job: WarmStartJob) -> list[str]:
    """The grounding tasks the job's builds ask (rlkit.stages.grounding.grounding_tasks). Raises ValueError."""
    return grounding_tasks(job.env_spec, job.cfg.grounding.get("tasks"))


def grounding_problem(job: WarmStartJob) -> str | None:
    """What is wrong with ``grounding.tasks`` where a build of ``job`` will read it (its grounding stage, or the
    warm start's ``sft.grounding_mix``), or None."""
    cfg = job.cfg
    grounds = cfg.grounding.enabled and cfg.policy.get("path") is None and not (cfg.sft.enabled and job.start_from)
    stages = sft_stage_configs(cfg.sft) if cfg.sft.enabled else []
    mixes = isinstance(job.env_spec, SupportsGroundingQuestions) and any(int(st.get("grounding_mix") or 0) > 0
                                                                        for st in stages)
    if not (grounds or mixes):
        return None
    try:
        grounding_task_list(job)
    except ValueError as e:
        return str(e) if grounds else f"{e} (read by sft.grounding_mix: fix it, or set sft.grounding_mix=0)"
    return None


def tokenizer_before_builds(policy: Any) -> Any:
    """The policy's tokenizer without its weights, for ``check_answer_fits`` before any build: the checkpoint
    folder at ``policy.path``, the tokenizer the tiny build of ``policy.tiny`` gets (deterministic), or None."""
    path = policy.get("path")
    if path:
        return path
    tiny = policy.get("tiny")
    if tiny is None:
        return None
    from rlkit.policy.tiny import TinyVLSizes
    from rlkit.policy.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer(tiny.get("vocab_size") or TinyVLSizes.vocab_size)


def check_answer_fits(job: WarmStartJob, tokenizer: Any) -> None:
    """Raise ConfigError when the solver's answer to an evaluation task needs more tokens in one turn than
    ``rollout.max_new_tokens``: such an answer would be cut, so the task would count as failed however well the
    policy learned it. ``tokenizer``: the policy's, or a checkpoint folder to load it from; None or a hub name
    skips the check."""
    if isinstance(tokenizer, (str, os.PathLike)):
        if not Path(tokenizer).is_dir():
            return
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    if tokenizer is None:
        return
    need, seed = longest_demonstration(job.env_spec, tokenizer, job.eval_seeds, job.stop or ())
    have = int(job.cfg.rollout.max_new_tokens)
    if need > have:
        raise ConfigError(f"rollout.max_new_tokens={have} cuts answers: the solver's answer to evaluation task "
                          f"{seed} is {need} tokens in the env's answer format; "
                          f"set rollout.max_new_tokens={need} or more")


def make_job(cfg: DictConfig, env_spec: Any, source: str = "") -> WarmStartJob:
    """A plan's job for a composed config and its env spec."""
    return WarmStartJob(cfg, env_spec, source, start_from(cfg.sft) if cfg.sft.enabled else None,
                        stop_strings(cfg.rollout, env_spec), list(env_spec.eval_seeds()))


def plan_warm_start(job: WarmStartJob, validate: Any, say: Any) -> list[WarmStartJob]:
    """The jobs whose builds ``job``'s warm start needs, innermost first, ``job`` last; each checked before any
    build (``validate(cfg)``: the recipe's config check; its grounding tasks; its answers fit a turn).

    A source job (``sft.start_from_env=<name>``: that env's config, grounding stage and image size with this job's
    policy; ``sft.start_from_experiment=<name>``: that job's whole config) builds into this job's cache. A source
    that evaluates on the outermost job's evaluation set holds out what that job holds out (``env.holdout``).

    Raises: ConfigError when a source is this job's env, has no warm start (sft.enabled=false), the chain comes
    back to a job already in it, an experiment's ``policy.tiny`` differs from this job's (it would change
    nothing), or a job of the chain refuses its config (the message names the chain).
    """
    chain, plan = [job], [job]
    outer = job
    # what decides the held-out set (rlkit.types.SupportsEvalHoldout; nothing for an env without it)
    keys = tuple(outer.env_spec.eval_holdout_keys) if isinstance(outer.env_spec, SupportsEvalHoldout) else ()
    holdout = (outer.env_spec.eval_set_name, {k: outer.cfg.env.get(k) for k in keys})
    names: list[str] = []
    while chain[-1].start_from:
        inner, source = chain[-1], chain[-1].start_from
        if source in names:
            raise ConfigError(f"sft.start_from_*: the warm starts chain {' -> '.join([*names, source])} comes back "
                              f"to {source}, whose warm start would have to start from itself; end the chain at a "
                              "job with sft.start_from_env and sft.start_from_experiment null")
        names.append(source)
        group, name = source.split("=", 1)
        other = compose_train([source])
        other_spec = instantiate_plugin(other.env, "env")
        differ = {k: v for k, v in holdout[1].items() if other.env.get(k) != v}
        if holdout[0] is not None and other_spec.eval_set_name == holdout[0] and differ:
            with open_dict(other):
                for k, v in differ.items():
                    other.env[k] = v
            other_spec = instantiate_plugin(other.env, "env")
            shown = " ".join(f"env.{k}={v}" for k, v in differ.items())
            say(f"SFT warm start: {source} evaluates on {holdout[0]} too, so its stages hold out what this job "
                f"does ({shown})")
        try:  # the link from `inner` to `source`: refused in `inner`'s words, prefixed with the chain to `inner`
            _check_link(inner.cfg, other, source)
        except ConfigError as e:
            if len(names) == 1:
                raise
            raise ConfigError(f"in the warm start this job starts from ({' -> '.join(names[:-1])}): {e}") from e
        with open_dict(other):
            other.paths.output_dir = str(outer.cfg.paths.output_dir)
            other.paths.cache_dir = str(outer.cfg.paths.cache_dir)
            other.trainer.quiet = bool(outer.cfg.trainer.quiet)
        chain.append(make_job(other, other_spec, source))
        say(f"SFT warm start: first the warm start of {source} (sft.start_from_{group})")
        try:
            validate(other)
            problem = grounding_problem(chain[-1])
            if problem:
                raise ConfigError(problem)
            check_answer_fits(chain[-1], tokenizer_before_builds(other.policy))
        except ConfigError as e:
            raise ConfigError(f"in the warm start this job starts from ({' -> '.join(names)}): {e}") from e
        plan.insert(0, chain[-1])
    return plan


def _check_link(inner: DictConfig, other: DictConfig, source: str) -> None:
    """Check that the job ``inner`` may start from the warm start of ``other`` (composed from ``source``), and give
    ``other`` the policy that builds it: ``inner``'s at ``other``'s image size for ``env=``, its own for
    ``experiment=``. Raises: ConfigError when ``source`` is ``inner``'s env, has no warm start, or ``inner``'s
    ``policy.tiny`` would change nothing."""
    group, name = source.split("=", 1)
    if group == "env" and (OmegaConf.to_container(other.env, resolve=True)
                           == OmegaConf.to_container(inner.env, resolve=True)):
        raise ConfigError(f"sft.start_from_env={name} is this job's env: a warm start cannot start from "
                          "itself; name another env (e.g. a smaller maze), or null")
    if not other.sft.enabled:
        raise ConfigError(f"sft.start_from_{group}={name}: the job {source} has no warm start to start from "
                          "(its sft.enabled=false); name another one, or null")
    if group == "env":  # the inner job's policy at that env's image size (conf/image_grid/)
        policy = OmegaConf.to_container(inner.policy, resolve=True)
        if policy.get("tiny") and OmegaConf.select(other, "policy.tiny") is not None:
            for k in ("image_min_pixels", "image_max_pixels"):
                policy["tiny"][k] = other.policy.tiny[k]
        with open_dict(other):
            other.policy = policy
    else:  # that job's own policy: an override of this job's policy.tiny would build nothing
        _check_same_tiny(inner, other, source)


def _check_same_tiny(mine_cfg: DictConfig, other: DictConfig, source: str) -> None:
    """Refuse this job's ``policy.tiny`` when it differs from ``other``'s in more than the image size: the warm
    start is built by ``other``'s policy, so such an override would change nothing. Raises: ConfigError."""
    mine, theirs = (OmegaConf.to_container(c.policy, resolve=True).get("tiny") or {} for c in (mine_cfg, other))
    differ = sorted(k for k in set(mine) | set(theirs) if not k.startswith("image_") and mine.get(k) != theirs.get(k))
    if mine and differ:
        raise ConfigError(f"sft.start_from_experiment: {source} builds the warm start this job starts from with its "
                          "own policy, so this job's " + ", ".join(f"policy.tiny.{k}={mine.get(k)}" for k in differ)
                          + " would change nothing (that job has " + ", ".join(f"{theirs.get(k)}" for k in differ)
                          + "); drop the override, or set it in that experiment's config")


def chained_policy(job: WarmStartJob, path: str | Path) -> dict[str, Any]:
    """The policy config of a job that starts from the checkpoint at ``path`` (``policy.path=<path>
    ~policy.tiny``), as a warm-start stage from it is keyed and loaded. When the job starts from another job's
    warm start it also sets ``image_max_pixels`` to this env's: that checkpoint carries the other job's size."""
    policy = OmegaConf.to_container(job.cfg.policy, resolve=True)
    tiny = policy.pop("tiny", None) or {}
    policy["path"] = str(path)
    if job.start_from and policy.get("image_max_pixels") is None:
        policy["image_max_pixels"] = tiny.get("image_max_pixels")
    return policy


def _with_mixed_tasks(job: WarmStartJob, key: dict[str, Any]) -> dict[str, Any]:
    """A warm-start stage's cache key plus the grounding tasks it mixes in, when it mixes some and they are not
    the tasks of every build before this key existed (conf/compat.yaml ``grounding_key.mix_tasks_unkeyed``)."""
    if int(key.get("grounding_mix") or 0) <= 0 or not isinstance(job.env_spec, SupportsGroundingQuestions):
        return key
    tasks = grounding_task_list(job)
    return key if tasks == compat_table("grounding_key")["mix_tasks_unkeyed"] else {**key, "grounding_mix_tasks": tasks}


def grounded_base(job: WarmStartJob, progress: Any) -> str | None:
    """Path of the job's visually grounded base checkpoint (rlkit.stages.grounding), built when missing.

    None when grounding is off or the policy is not a tiny build (a pretrained checkpoint already reads images).
    Cached under ``paths.cache_dir/grounding/<key>``, built under a file lock and saved atomically.
    """
    cfg = job.cfg
    if not cfg.grounding.enabled or cfg.policy.get("path") is not None:
        return None
    inputs = cache_key_inputs(grounding_key_config(cfg.grounding), cfg.env, cfg.policy)
    out_dir = Path(cfg.paths.cache_dir) / "grounding" / cache_key_of(inputs)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out_dir.with_suffix(".lock")):
        if (out_dir / "grounding_summary.json").is_file():
            summary = json.loads((out_dir / "grounding_summary.json").read_text())
            progress.say(f"grounding: reusing {out_dir} (held-out {summary['stop_metric']} accuracy "
                         f"{summary['final'][summary['stop_metric']]:.1%})")
            shutil.rmtree(partial_dir(out_dir), ignore_errors=True)  # left by a build killed as it finished
            return str(out_dir)
        progress.say(f"grounding: building {out_dir} (cached for later runs)")
        base = instantiate_plugin(cfg.policy, "policy", base_path=None, train_mode="full")
        gcfg = GroundingConfig(**OmegaConf.to_container(cfg.grounding, resolve=True))
        summary = train_grounding(job.env_spec, base, gcfg, out_dir, progress=progress.grounding,
                                  build={"stage": "grounding", "inputs": inputs},
                                  on_resume=lambda step: progress.say(
                                      f"grounding: resuming the stopped build at step {step} "
                                      f"(its progress: {partial_dir(out_dir)})"))
        progress.say(f"grounding: {summary['steps']} steps, {summary['wall_time_s']:.0f}s; held-out "
                     f"exact-match accuracy by task:\n" + format_table({"image": summary["final"]}))
        del base
    return str(out_dir)


def build_warm_start(plan: list[WarmStartJob], progress: Any) -> str:
    """Build (or reuse) the warm starts of ``plan`` (``plan_warm_start``) in order; the path of the last one's."""
    start: str | None = None
    for job in plan:
        start = _job_warm_start(job, start, progress)
    assert start is not None
    return start


def _job_warm_start(job: WarmStartJob, start: str | None, progress: Any) -> str:
    """The job's warm start: its first stage from ``start`` (the previous job's warm start) or from its grounded
    base, then each later stage (``sft.stages``) from the stage before."""
    cfg = job.cfg
    stages = sft_stage_configs(cfg.sft)
    sft_key = sft_stage_config(cfg.sft)
    # the greedy validation that decides where a stage stops decodes with these
    decoding = {"max_new_tokens": int(cfg.rollout.max_new_tokens), "stop": list(job.stop or [])}
    prompt = _prompt(job, stages[0])  # the demonstrations answer this prompt (code, not config)
    label = "" if len(stages) == 1 else f" stage 1/{len(stages)}"
    if start is not None:
        if cfg.grounding.enabled:
            progress.say(f"grounding: not run on this env; the warm start starts from the warm start of "
                         f"{job.start_from} (sft.start_from_{job.start_from.split('=')[0]})")
        policy = chained_policy(job, start)
        inputs = cache_key_inputs(_with_mixed_tasks(job, sft_key), cfg.env, policy, decoding, prompt)
        out_dir = _sft_stage(job, Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), start, job.sft,
                             progress, label=label, policy_cfg=policy,
                             build={"stage": f"sft{label}", "start": start, "inputs": inputs})
    else:
        grounded = grounded_base(job, progress)
        # a warm start from a grounded base also depends on how that base was grounded
        stage_key = _with_mixed_tasks(job, sft_key) if grounded is None else {
            "sft": sft_key, "grounding": grounding_key_config(cfg.grounding)}
        inputs = cache_key_inputs(stage_key, cfg.env, cfg.policy, decoding, prompt)
        out_dir = _sft_stage(job, Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), grounded, job.sft,
                             progress, label=label, build={"stage": f"sft{label}", "start": grounded, "inputs": inputs})
    for i, stage in enumerate(stages[1:], start=2):
        # keyed as the job `policy.path=<previous stage> ~policy.tiny sft.<stage keys>` keys its warm start
        policy = chained_policy(job, out_dir)
        inputs = cache_key_inputs(_with_mixed_tasks(job, sft_stage_config(stage)), cfg.env, policy, decoding,
                                  _prompt(job, stage))
        label = f" stage {i}/{len(stages)} (sft.stages[{i - 2}])"
        out_dir = _sft_stage(job, Path(cfg.paths.cache_dir) / "sft" / cache_key_of(inputs), str(out_dir),
                             SFTConfig(**stage), progress, label=label, policy_cfg=policy,
                             build={"stage": f"sft{label}", "start": str(out_dir), "inputs": inputs})
    return str(out_dir)


def _prompt(job: WarmStartJob, stage: dict[str, Any]) -> str:
    """The prompt fingerprint a warm-start stage is keyed by: with its recovery demonstrations' when it learns
    them (sft.recovery_share > 0), so a stage without them keys as before they existed."""
    return prompt_fingerprint(job.env_spec, recovery=bool(stage.get("recovery_share")))


def _sft_stage(job: WarmStartJob, out_dir: Path, base_path: str | None, sft_cfg: SFTConfig, progress: Any,
               label: str = "", policy_cfg: dict[str, Any] | None = None, build: dict[str, Any] | None = None) -> Path:
    """Build one warm-start stage into ``out_dir`` from ``base_path`` (None: the policy config's own weights), or
    reuse it when its summary is there; under a file lock, saved atomically. ``policy_cfg``: the policy config to
    load it with (None: the job's); ``build``: what the summary records of how it was built."""
    from rlkit.policy import SamplingParams, make_engine
    cfg = job.cfg
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out_dir.with_suffix(".lock")):
        if (out_dir / "sft_summary.json").is_file():
            summary = json.loads((out_dir / "sft_summary.json").read_text())
            progress.say(f"SFT warm start{label}: reusing {out_dir} (val success {summary['val_success']:.1%})")
            shutil.rmtree(partial_dir(out_dir), ignore_errors=True)  # left by a build killed as it finished
            return out_dir
        policy = cfg.policy if policy_cfg is None else OmegaConf.create(policy_cfg)
        base = instantiate_plugin(policy, "policy", base_path=base_path, train_mode="full")
        check_answer_fits(job, base.tokenizer)  # before minutes of supervised learning towards cut answers
        progress.say(f"SFT warm start{label}: building {out_dir} (cached for later runs)")
        engine = make_engine(base, reuse_kv=bool(cfg.rollout.reuse_kv_cache))
        greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=int(cfg.rollout.max_new_tokens),
                                n=1, seed=0, stop=job.stop)
        if sft_cfg.grounding_mix > 0 and isinstance(job.env_spec, SupportsGroundingQuestions):
            tasks = grounding_task_list(job)
        elif isinstance(job.env_spec, SupportsGroundingQuestions):  # offered, none mixed in
            tasks = list(job.env_spec.grounding_tasks)
        else:  # no questions (train_sft refuses a mix on an env without them, naming the fix)
            tasks = []
        summary = train_sft(job.env_spec, base, engine, sft_cfg, greedy, out_dir, progress=progress.sft,
                            grounding_tasks=tasks, build=build,
                            on_resume=lambda step: progress.say(f"SFT warm start{label}: resuming the stopped build at "
                                                                f"step {step} (its progress: {partial_dir(out_dir)})"))
        progress.say(f"SFT warm start{label}: {summary['steps']} steps, val success {summary['val_success']:.1%} on "
                     f"{sft_cfg.val_tasks} held-out training tasks (not the eval set), {summary['wall_time_s']:.0f}s")
        del base, engine
    return out_dir


def starting_checkpoint(job: WarmStartJob, resume_from: Path | None, build_threads: int, threads: int,
                        validate: Any, progress: Any) -> str | None:
    """The checkpoint a GRPO run starts from: the one a resumed run's adapter was trained on (rlkit.resume.
    recorded_base), else the warm start (or grounded base) ``job``'s config keys, built when missing on
    ``build_threads`` torch threads (``threads`` again after). None: the policy config's own weights."""
    cfg = job.cfg
    builds = cfg.sft.enabled or (cfg.grounding.enabled and cfg.policy.get("path") is None)
    if builds:  # answers the rollouts would cut are refused before minutes (a chain: an hour) of builds
        check_answer_fits(job, tokenizer_before_builds(cfg.policy))
    recorded = (resume.recorded_base(resume_from, cfg.paths.cache_dir, prompt_fingerprint(job.env_spec), progress.say)
                if resume_from is not None and builds else None)
    if recorded is not None:  # the adapter goes back on the weights it was trained on, whatever keys them now
        progress.say(f"resuming on the warm start the run started from: {recorded}")
        return recorded
    if builds and (note := legacy_cache_note(cfg.paths.cache_dir)):
        progress.say(note)
    torch.set_num_threads(build_threads)
    try:
        base = (build_warm_start(plan_warm_start(job, validate, progress.say), progress) if cfg.sft.enabled
                else grounded_base(job, progress))
    finally:
        torch.set_num_threads(threads)
    recorded_name = resume.adapter_base_model(resume_from) if resume_from is not None else None
    if recorded_name and base and Path(recorded_name).name != Path(base).name:
        progress.say(f"warning: the checkpoint's adapter was trained on {recorded_name}, which is gone; it resumes on "
                     f"{base}, built from today's config (other weights where the build differs)")
    return base
