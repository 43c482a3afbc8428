"""Typed schemas of the config groups the GRPO loop reads field by field.

Registered in Hydra's ConfigStore as the base of conf/train.yaml (``rlkit_train_schema``), so a
typo in any of these groups (``algorithm.eps_clip_hihg=0.3``) or an unknown top-level key fails at
compose time with Hydra's error. Plug-in groups (env, reward, policy, logger, backend) are
instantiated from their ``_target_``; their keys are constructor arguments, so an unknown key fails
with a TypeError naming it when the run starts (``rlkit.plugins.instantiate_plugin``). The sampling
strategy is named by ``_target_`` too, and checked before any build (rlkit.sampling.strategies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from rlkit.cache_dir import register_resolver
from rlkit.types import SupportsStopStrings



def _conf_dir() -> Path:
    """rlkit's config folder: ``rlkit/conf`` (in a checkout a link to the repository's conf/; in an installed wheel
    the copy it carries as package data), else the checkout's conf/ itself (a checkout without the link, e.g. on a
    file system without symbolic links). The package's own comes first, so an installed rlkit never reads a
    ``conf/`` some other package left beside it in site-packages."""
    here = Path(__file__).resolve().parent
    for cand in (here / "conf", here.parent / "conf"):
        if (cand / "train.yaml").is_file():
            return cand
    return here / "conf"


#: The folder of conf/train.yaml and its groups, for ``python train.py`` in a checkout and ``rlkit-train`` from an
#: installed wheel alike (rlkit.train's Hydra app, rlkit.plugins' compose outside a job).
CONF_DIR = _conf_dir()

#: conf/compat.yaml: how the config of a checkpoint written by an earlier rlkit is read (keys added, renamed and
#: removed since), for resume and the warm-start cache keys. Loaded once, as plain dicts.
COMPAT_FILE = CONF_DIR / "compat.yaml"


def compat_table(section: str) -> dict[str, Any]:
    """One section of conf/compat.yaml (``added``, ``renamed``, ``renamed_one_phase``, ``removed``,
    ``grounding_key``) as a dict. Raises: OSError when the file is missing (it ships with rlkit)."""
    import yaml

    return dict((yaml.safe_load(COMPAT_FILE.read_text()) or {}).get(section) or {})


#: Keys added after checkpoints existed, with the value that does what runs did before (conf/compat.yaml).
KEYS_ADDED_LATER: dict[str, Any] = compat_table("added")


@dataclass
class AlgorithmConfig:
    """GRPO hyperparameters (rlkit/algorithms/grpo.py documents the math and its sources).

    Batch geometry: a step samples ``tasks_per_step`` tasks x ``group_size`` samples = N sequences.
    The update makes ``update_epochs`` passes; each pass splits the N sequences into mini-batches of
    ``mini_batch_size`` sequences (one optimizer step each; with the shared-prefix update, whole
    groups packed up to ``mini_batch_size``), each computed in micro-batches of ``micro_batch_size``
    sequences (gradient accumulation).
    """

    name: str = "grpo"
    norm_adv_by_std: bool = True  # False = Dr. GRPO
    adv_eps: float = 1e-6
    filter_zero_variance_groups: bool = False  # DAPO dynamic-sampling style: drop groups with no signal
    # DAPO overlong filtering (Yu et al. 2025, section 3.4; SkyRL's generator.apply_overlong_filtering):
    # trajectories with a turn cut at rollout.max_new_tokens (no end-of-turn token) are left out of the
    # update's loss. Their rewards still count in their group's advantages and in the logged metrics.
    overlong_filtering: bool = False
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28  # DAPO clip-higher
    clip_ratio_c: Optional[float] = None  # dual clip; None = off
    loss_reduction: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum
    kl_coef: float = 0.0  # KL-to-reference loss coefficient; 0 = reference never computed
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    update_epochs: int = 1
    mini_batch_size: Optional[int] = None  # None = the whole step's batch (one optimizer step per epoch)
    micro_batch_size: int = 8
    # Shared-prefix update (native backends): the samples of a group in one micro-batch run their
    # common prompt (image + text) once and share its KV cache; same logprobs, loss and gradients as the
    # full-sequence forward within float32 rounding (rlkit.update). SkyRL computes its own forward.
    shared_prefix: bool = True
    # Identical samples run once (native backends), weighted by their number (rlkit.update.identical_samples);
    # same loss and gradients within float rounding. SkyRL computes its own forward.
    dedup_identical_samples: bool = True
    max_grad_norm: float = 1.0  # 0 = no clipping (the norm is still logged)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule for the GRPO update (the base lr is the top-level ``lr``)."""

    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    warmup_steps: int = 0  # GRPO steps of linear warmup
    lr_schedule: str = "constant"  # constant | cosine (to 0 at ``steps``; rlkit.algorithms.schedules)


@dataclass
class AuxLossConfig:
    """Auxiliary supervised terms of the GRPO update (conf/aux_loss/; rlkit.algorithms.nll.AuxTerm).

    ``demo_coef`` > 0: the demonstration loss on the tasks RL cannot reach (after ReLIFT, Ma et al. 2025,
    "Learning What Reinforcement Learning Can't"): each step, the tasks whose group had at most
    ``demo_max_successes`` successes (0: the all-fail ones) get the env's solver demonstration
    (rlkit.types.SupportsDemonstrations), and demo_coef x its mean NLL per token joins the update's first
    optimizer step; at most ``demo_max_tasks`` a step. Native backends only.
    """

    demo_coef: float = 0.0
    demo_max_tasks: int = 16
    demo_max_successes: int = 0


@dataclass
class RolloutConfig:
    """Sampling for training rollouts and greedy evaluation (units: tokens)."""

    temperature: float = 0.7  # conf/train.yaml's CPU default (the tiny policy's recipe); SkyRL's examples use 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 48  # per policy turn
    eval_temperature: float = 0.0  # 0 = greedy
    # strings that end a policy turn as soon as its text contains one (as vLLM's `stop`; the turn is then
    # closed with the end-of-turn token, loss mask 0). null = the env's (EnvSpec.stop_strings, e.g. VisGym's
    # "</answer>"); [] = only the end-of-turn token ends a turn.
    stop: Optional[list[str]] = None
    # multi-turn episodes keep their KV cache (and image encodings) across turns and prefill only the
    # new user turn (native backends; same tokens and logprobs as re-prefilling, rlkit.policy.engine;
    # under backend=skyrl vLLM caches prefixes itself). May change on resume.
    reuse_kv_cache: bool = True
    # who samples the rollouts and greedy evaluations of the native backends: rlkit (rlkit.policy.engine, in the policy's
    # process) | vllm (vLLM's CPU engine in a process of its own from .venv-vllm, the adapter hot-swapped in at every
    # version; rlkit.policy.vllm_engine). backend=skyrl samples with SkyRL's own vLLM engines whatever this says.
    engine: str = "rlkit"


def stop_strings(rollout: Any, env_spec: Any) -> tuple[str, ...]:
    """The stop strings of a run: ``rollout.stop``, or, when that is null, the env's ``stop_strings``
    (rlkit.types.SupportsStopStrings; none, ``()``, for an env without them)."""
    stop = rollout.get("stop") if hasattr(rollout, "get") else getattr(rollout, "stop", None)
    if stop is None:
        return tuple(env_spec.stop_strings) if isinstance(env_spec, SupportsStopStrings) else ()
    return tuple(stop)


@dataclass
class TrainerConfig:
    """Loop cadence, checkpoints and resume."""

    eval_interval: int = 10  # steps; 0 = only before and after training
    eval_before_train: bool = True
    ckpt_interval: int = 10  # steps; 0 = only the final checkpoint
    max_ckpts_to_keep: int = 2  # native backends: 0 = keep all; SkyRL: -1 = keep all
    export_interval: int = 0  # steps between plain-PEFT adapter exports; 0 = only at the end
    resume_mode: str = "latest"  # latest | none | from_path
    resume_path: Optional[str] = None
    overwrite: bool = False  # resume_mode=none into a dir with checkpoints
    num_threads: Optional[int] = None  # torch intra-op threads; None = 1 (tiny models; shared cores)
    # torch intra-op threads of the one-time builds (grounding stage, SFT warm start), which run alone in the
    # driver before the rollout and trainer workers start; None = $OMP_NUM_THREADS when set (the Ray launcher
    # sets it for a job to its entrypoint_num_cpus), else the cores this process may use under its cgroup's
    # CPU quota (rlkit.recipes.threads.build_threads). Training then uses num_threads. A build's numbers depend on
    # its thread count (float summation order), which its record keeps; the key does not (the same inputs).
    # A chain's stages (sft.start_from_*) are built with this job's value, whatever their own configs say.
    build_threads: Optional[int] = None
    deterministic: bool = False
    quiet: bool = False  # no progress bars (CI)
    # A worker (rollout worker, trainer rank) that dies or hangs (backend.call_timeout_s) is replaced this many
    # times in a job: the workers restart and the run goes on from its latest checkpoint, exactly (rlkit.recipes.heal).
    # 0 = stop at the first loss, saying which step a rerun resumes from. Backends with workers only.
    max_failures: int = 2
    # How long the new worker group of such a restart may wait for its resources (seconds, in all): a replacement
    # node still joining the cluster (HyperPod replaces a faulty one). Past it the run stops; a rerun resumes.
    restart_wait_s: float = 1800.0


@dataclass
class SFTConfig:
    """Supervised warm start from solver demonstrations on training seeds (never evaluation seeds).

    Trains the full weights of the base policy (the analogue of the VisGym SFT checkpoint) until the
    greedy success on ``val_tasks`` held-out training seeds reaches ``target_success`` (checked every
    ``eval_every`` optimizer steps) or ``max_steps`` is reached. The result is cached under
    ``paths.cache_dir/sft/<hash of this config, the env and the policy>`` and reused.
    """

    enabled: bool = True
    num_demos: int = 4000  # size of a fixed demonstration pool; 0 = a fresh batch of tasks every step
    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    # constant | cosine: after the warmup, a half cosine from lr to 0 at max_steps (a stop at
    # target_success before max_steps ends the stage earlier, at a higher lr)
    lr_schedule: str = "constant"
    target_success: float = 0.45
    # The stop also needs val success >= the val tasks' answer prior + this (rlkit.evaluation.answer_prior: the best
    # success one fixed answer reaches on them), so a warm start that learned an answer prior, not to read, trains
    # on. 0: target_success alone (the rule before issue 75).
    answer_prior_margin: float = 0.1
    val_tasks: int = 64
    eval_every: int = 25
    seed: int = 1234
    # N > 0: N questions of the grounding stage's tasks (grounding.tasks, e.g. walls) join
    # every batch, on their own training mazes, so the warm start keeps reading the picture instead of
    # overwriting what grounding taught (after SFT alone the policy answers no walls question). The loss is the
    # mean over all answer tokens of the batch. Needs an env with grounding questions (not the grounding stage).
    grounding_mix: int = 0
    # Share (0..1) of the demonstrations drawn as recovery demonstrations (rlkit.types.SupportsRecoveryDemonstrations):
    # the solver's episode with one mistake in it, not learned (loss mask 0), and the solver's way on from where it
    # leads, learned; the states after an error that plain demonstrations never show (DART, Laskey et al. 2017).
    # Multi-turn envs only. Each demonstration is drawn as one with this probability. 0 = off.
    recovery_share: float = 0.0
    # Later stages of the warm start, run after this one in the same job: each a mapping of sft keys
    # (max_steps, lr, lr_schedule, target_success, seed, ...) set over this config (not over the stage
    # before: a key a stage does not set has this config's value), trained from the previous stage's
    # checkpoint with a fresh AdamW and cached on its own (keyed as the job that starts from that checkpoint
    # through policy.path would key it). [] = one stage.
    stages: list[Any] = field(default_factory=list)
    # A sequence of envs (e.g. maze sizes): the name of another env config (conf/env/<name>.yaml) whose warm
    # start, as `python train.py env=<name>` builds it with this job's policy (that env's grounding stage, recipe
    # and image size included), is built or reused first; this env's warm start then starts from it instead of
    # from this env's grounding stage (which is skipped), as a job with policy.path=<that warm start> would, with
    # the image size of this env (policy.tiny.image_max_pixels). null = off. On 9x9 from the 7x7 default's warm
    # start: session 23, docs/experiments.md; conf/experiment/tiny_9x9_from_7x7.yaml.
    start_from_env: str | None = None
    # The same from another experiment's warm start: the name of an experiment config (conf/experiment/<name>.yaml)
    # whose warm start, as `python train.py experiment=<name>` builds it (that job's whole config, its policy and
    # its own sft.start_from_* included), is built or reused first; this job's warm start trains on from it at this
    # env's image size. At most one of start_from_env / start_from_experiment. null = off. 7x7 from the 9x9
    # chain's warm start: session 24, docs/experiments.md; conf/experiment/tiny_7x7_from_9x9.yaml.
    start_from_experiment: str | None = None


@dataclass
class GroundingConfig:
    """Visual grounding pretraining of a tiny base policy, before the SFT warm start (rlkit.stages.grounding).

    Trains the full weights on the env's grounding questions (training seeds only) until the
    exact-match accuracy on ``val_questions`` held-out questions about wall bits reaches
    ``target_accuracy`` (checked every ``eval_every`` steps) or after ``max_steps``. Cached under
    ``paths.cache_dir/grounding/<hash>`` and reused; the SFT warm start starts from it. Only for
    policies built from ``policy.tiny`` (a pretrained checkpoint already reads its images).
    ``tasks``: the env's grounding task names the questions are drawn from, uniformly (empty = every task
    the env offers).
    """

    enabled: bool = False
    max_steps: int = 400
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    target_accuracy: float = 0.99
    val_questions: int = 256
    eval_every: int = 25
    tasks: list[str] = field(default_factory=list)
    seed: int = 4321


@dataclass
class EvalConfig:
    """Evaluation on the env's fixed evaluation set."""

    num_tasks: Optional[int] = None  # None = the whole set (64 for visgym_easy_64); smoke uses a few
    pass_k: int = 0  # >0: also sample k times per task at rollout.temperature and report pass@k
    # >0: at every evaluation also run the policy greedily on the first N tasks the run draws for training
    # (tasks it has trained on), logged as eval_seen/*: beside eval/* it shows the generalisation gap
    seen_tasks: int = 0


@dataclass
class PathsConfig:
    output_dir: str = MISSING  # this job's folder (hydra's runtime output dir)
    cache_dir: str = MISSING  # built tiny models and SFT checkpoints, shared by jobs
    shared: str = MISSING  # shared filesystem for adapter sync (/shared on HyperPod)


@dataclass
class TrainConfig:
    """Root of conf/train.yaml. Top-level knobs are the ones people sweep."""

    seed: int = 0
    lr: float = 1e-4
    steps: int = 40
    group_size: int = 8
    tasks_per_step: int = 8
    control: Optional[str] = None  # null | fixed_image | shuffled_reward (rlkit/controls.py)
    train_tasks: Optional[int] = None  # null: a fresh training task every draw; N: a fixed pool of N (rlkit/tasks.py)
    env: Any = MISSING
    reward: Any = MISSING
    policy: Any = MISSING
    backend: Any = MISSING
    logger: Any = MISSING
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # the sampling strategy, a typed class named by ``_target_`` with only its own fields (conf/sampling/,
    # rlkit.sampling.strategies: checked by sampling_problems, built by sampling_strategy)
    sampling: Any = field(default_factory=lambda: {"_target_": "rlkit.sampling.PlainSampling"})
    aux_loss: AuxLossConfig = field(default_factory=AuxLossConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grounding: GroundingConfig = field(default_factory=GroundingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


@dataclass(frozen=True)
class Range:
    """The valid values of one typed config field (see ``RANGES``).

    lo / hi: bounds (None: unbounded); lo_open / hi_open: the bound itself is excluded. integer: the
    value must be an int. none: null is allowed (with its meaning in ``note``). also: other values
    allowed outside the bounds (e.g. -1 for top_k). choices: for strings, the allowed values. note:
    what special values mean (e.g. "0 = off").
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    none: bool = False
    also: tuple = ()
    choices: tuple = ()
    note: str = ""

    def check(self, value: Any) -> bool:
        """True when ``value`` is valid."""
        import math

        if value is None:
            return self.none
        if self.choices:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if value in self.also:
            return True
        if self.integer and not float(value).is_integer():
            return False
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        if self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)):
            return False
        return True

    def describe(self) -> str:
        """The rule in words, e.g. "must be an integer >= 0 (0 = off)"."""
        if self.choices:
            rule = "must be one of " + ", ".join(map(str, self.choices)) + (" or null" if self.none else "")
        else:
            parts = []
            if self.lo is not None:
                parts.append(f"{'>' if self.lo_open else '>='} {_num(self.lo)}")
            if self.hi is not None:
                parts.append(f"{'<' if self.hi_open else '<='} {_num(self.hi)}")
            what = "an integer " if self.integer else ""
            rule = f"must be {what}{' and '.join(parts)}".rstrip()
            if self.also:
                rule += " or " + " or ".join(_num(a) for a in self.also)
            if self.none:
                rule += " or null"
        return f"{rule} ({self.note})" if self.note else rule


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


_U32 = 2**32 - 1
_SEED = Range(0, _U32, integer=True, note="numpy and torch seeds are unsigned 32-bit")

#: Valid values of every typed numeric or enumerated config field, by dotted key (rlkit.config's
#: dataclasses plus the top-level knobs). ``check_ranges`` applies them before any work. sft.* and
#: grounding.* apply only when that stage is enabled. Backend-specific rules (trainer.max_ckpts_to_keep, SkyRL's limits)
#: live with the backend.
RANGES: dict[str, Range] = {
    "seed": _SEED,
    "lr": Range(0, lo_open=True),
    "steps": Range(0, integer=True, note="0 = only the warm start and the evaluation"),
    "group_size": Range(2, integer=True, note="GRPO scores each sample against its group's other samples"),
    "tasks_per_step": Range(1, integer=True),
    "control": Range(choices=("fixed_image", "shuffled_reward"), none=True,
                     note="null = the real run; a control cannot learn from its observations (rlkit/controls.py)"),
    "train_tasks": Range(1, integer=True, none=True,
                         note="null = a fresh training task for every draw; N = a fixed pool of N training tasks"),
    "algorithm.adv_eps": Range(0, lo_open=True, note="added to the group's reward std"),
    "algorithm.eps_clip_low": Range(0, 1, hi_open=True, note="the ratio is clipped below at 1 - eps_clip_low"),
    "algorithm.eps_clip_high": Range(0, note="the ratio is clipped above at 1 + eps_clip_high"),
    "algorithm.clip_ratio_c": Range(1, lo_open=True, none=True, note="dual clip; null = off"),
    "algorithm.loss_reduction": Range(choices=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")),
    "algorithm.kl_coef": Range(0, note="0 = no KL term, the reference is never computed"),
    "algorithm.kl_estimator": Range(choices=("k1", "k2", "k3")),
    "algorithm.entropy_coef": Range(0, note="0 = no entropy bonus"),
    "aux_loss.demo_coef": Range(0, note="0 = no demonstration loss"),
    "aux_loss.demo_max_tasks": Range(1, integer=True),
    "aux_loss.demo_max_successes": Range(0, integer=True, note="0 = only the tasks whose samples all failed"),
    "algorithm.update_epochs": Range(1, integer=True, note="passes over each step's batch"),
    "algorithm.mini_batch_size": Range(1, integer=True, none=True, note="null = the whole batch"),
    "algorithm.micro_batch_size": Range(1, integer=True),
    "algorithm.max_grad_norm": Range(0, note="0 = no clipping; the norm is still logged"),
    "optim.weight_decay": Range(0),
    "optim.warmup_steps": Range(0, integer=True, note="0 = no warmup"),
    "optim.lr_schedule": Range(choices=("constant", "cosine")),
    "sft.lr_schedule": Range(choices=("constant", "cosine")),
    "rollout.temperature": Range(0, note="0 = greedy"),
    "rollout.top_p": Range(0, 1, lo_open=True, note="1 = off"),
    "rollout.top_k": Range(0, integer=True, also=(-1,), note="0 or -1 = off"),
    "rollout.max_new_tokens": Range(1, integer=True),
    "rollout.eval_temperature": Range(0, note="0 = greedy"),
    "rollout.engine": Range(choices=("rlkit", "vllm"), note="rlkit = rlkit's own engine; vllm = vLLM's CPU engine from .venv-vllm"),
    "trainer.eval_interval": Range(0, integer=True, note="0 = only before and after training"),
    "trainer.ckpt_interval": Range(0, integer=True, note="0 = only the final checkpoint"),
    "trainer.export_interval": Range(0, integer=True, note="0 = only at the end"),
    "trainer.resume_mode": Range(choices=("latest", "none", "from_path")),
    "trainer.num_threads": Range(1, integer=True, none=True, note="null = 1"),
    "trainer.build_threads": Range(1, integer=True, none=True, note="null = $OMP_NUM_THREADS or the usable cores"),
    "trainer.max_failures": Range(0, integer=True, note="0 = stop at the first lost worker"),
    "trainer.restart_wait_s": Range(0, lo_open=True, note="seconds a restarted worker group waits for its resources"),
    "sft.num_demos": Range(0, integer=True, note="0 = a fresh batch of tasks every step"),
    "sft.max_steps": Range(1, integer=True),
    "sft.batch_size": Range(1, integer=True),
    "sft.lr": Range(0, lo_open=True),
    "sft.warmup_steps": Range(0, integer=True),
    "sft.grounding_mix": Range(0, integer=True, note="0 = off"),
    "sft.recovery_share": Range(0, 1, note="0 = off"),
    "sft.target_success": Range(0, 1),
    "sft.answer_prior_margin": Range(0, 1),
    "sft.val_tasks": Range(1, integer=True),
    "sft.eval_every": Range(1, integer=True),
    "sft.seed": _SEED,
    "grounding.max_steps": Range(1, integer=True),
    "grounding.batch_size": Range(1, integer=True),
    "grounding.lr": Range(0, lo_open=True),
    "grounding.warmup_steps": Range(0, integer=True),
    "grounding.target_accuracy": Range(0, note="above 1 = never stop early"),
    "grounding.val_questions": Range(1, integer=True),
    "grounding.eval_every": Range(1, integer=True),
    "grounding.seed": _SEED,
    "eval.num_tasks": Range(1, integer=True, none=True, note="null = the whole evaluation set"),
    "eval.pass_k": Range(0, integer=True, note="0 = off"),
    "eval.seen_tasks": Range(0, integer=True, note="0 = off"),
}


def check_ranges(cfg: Any) -> list[str]:
    """Every typed field of ``cfg`` (a composed train config) outside its ``RANGES`` rule, plus
    ``optim.adam_betas`` (two numbers in [0, 1)); one line per problem, e.g.
    ``"trainer.eval_interval=-1 must be an integer >= 0 (0 = only before and after training)"``.
    Returns [] when all are valid. sft.* and grounding.* are checked only when that stage is enabled."""
    from omegaconf import OmegaConf

    problems = []
    off = {stage for stage in ("sft", "grounding") if not OmegaConf.select(cfg, f"{stage}.enabled", default=True)}
    for key, rule in RANGES.items():
        stage = key.split(".")[0]
        if stage in off:
            continue
        value = OmegaConf.select(cfg, key, default=None)
        if not rule.check(value):
            hint = f" (or {stage}.enabled=false)" if stage in ("sft", "grounding") else ""
            problems.append(f"{key}={value!r} {rule.describe()}{hint}")
    stages = OmegaConf.select(cfg, "sft.stages", default=None) or []
    if "sft" not in off:
        problems += _cosine_problems("sft", OmegaConf.select(cfg, "sft", default=None) or {})
        problems += [p for i, stage in enumerate(stages) for p in check_sft_stage(cfg, i, stage)]
    elif stages:
        problems.append(f"sft.stages has {len(stages)} later warm-start stage(s) but sft.enabled=false skips the warm "
                        f"start: drop them (sft.stages=[]) or enable it (sft.enabled=true)")
    resume_path = OmegaConf.select(cfg, "trainer.resume_path", default=None)
    resume_mode = OmegaConf.select(cfg, "trainer.resume_mode", default=None)
    if resume_path and resume_mode != "from_path":
        problems.append(f"trainer.resume_path={resume_path!r} is only read with trainer.resume_mode=from_path (it is "
                        f"{resume_mode!r}): add trainer.resume_mode=from_path to start from that checkpoint, or drop "
                        f"trainer.resume_path")
    steps = OmegaConf.select(cfg, "steps", default=0) or 0
    warmup = OmegaConf.select(cfg, "optim.warmup_steps", default=0) or 0
    if (OmegaConf.select(cfg, "optim.lr_schedule", default=None) == "cosine" and isinstance(steps, int)
            and isinstance(warmup, int) and 0 < steps <= warmup):
        problems.append(f"optim.lr_schedule=cosine with optim.warmup_steps={warmup} >= steps={steps} never "
                        f"decays; set optim.warmup_steps below steps")
    betas = OmegaConf.select(cfg, "optim.adam_betas", default=None)
    if betas is not None:
        betas = list(betas)
        if len(betas) != 2 or not all(Range(0, 1, hi_open=True).check(b) for b in betas):
            problems.append(f"optim.adam_betas={betas} must be two numbers in [0, 1)")
    return problems


#: sft keys a later warm-start stage (sft.stages) may not set: whether there is a warm start, and its stages.
SFT_STAGE_FIXED = ("enabled", "stages", "start_from_env", "start_from_experiment")


def check_sft_stage(cfg: Any, index: int, stage: Any) -> list[str]:
    """Problems with ``sft.stages[index]`` (a mapping of sft keys set over ``sft``): a key that is not an sft key
    or may not change between stages (SFT_STAGE_FIXED), a value of the wrong type, values outside the sft.*
    ``RANGES``, and a cosine that its warmup would cover; one line each."""
    from dataclasses import fields

    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    name = f"sft.stages[{index}]"
    if not OmegaConf.is_dict(stage) and not isinstance(stage, dict):
        return [f"{name}={stage!r} must be a mapping of sft keys, e.g. {{max_steps: 600, lr_schedule: cosine}}"]
    known = {f.name for f in fields(SFTConfig)} - set(SFT_STAGE_FIXED)
    problems = [f"{name}.{k} is not a key a later stage can set (use one of: {', '.join(sorted(known))})"
                for k in stage if k not in known]
    base = OmegaConf.to_container(OmegaConf.select(cfg, "sft"), resolve=True)
    base.pop("stages", None)
    merged = OmegaConf.merge(OmegaConf.structured(SFTConfig), base)
    for k in (k for k in stage if k in known):
        try:  # typed as a command-line override of sft.<k> would be: "2" -> 2, 1 -> 1.0, "abc" refused
            merged = OmegaConf.merge(merged, {k: stage[k]})
        except ValidationError:
            problems.append(f"{name}.{k}={stage[k]!r} is not a {type(getattr(SFTConfig(), k)).__name__} "
                            f"(the type of sft.{k})")
    for key, rule in RANGES.items():
        if key.startswith("sft.") and key[4:] in stage and not rule.check(merged[key[4:]]):
            problems.append(f"{name}.{key[4:]}={merged[key[4:]]!r} {rule.describe()}")
    return problems + _cosine_problems(f"{name} (stage {index + 2})", merged)


def _cosine_problems(where: str, sft: Any) -> list[str]:
    """A cosine schedule whose warmup covers every step never decays (the lr only ramps up)."""
    if sft.get("lr_schedule") == "cosine" and sft.get("warmup_steps", 0) >= sft.get("max_steps", 1):
        return [f"{where}: lr_schedule=cosine with warmup_steps={sft['warmup_steps']} >= max_steps={sft['max_steps']} "
                f"never decays; set warmup_steps below max_steps"]
    return []


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore and add the ``${rlkit_cache_dir:}`` resolver conf/train.yaml's
    ``paths.cache_dir`` uses (rlkit.cache_dir); idempotent."""
    register_resolver()
    cs = ConfigStore.instance()
    cs.store(name="rlkit_train_schema", node=TrainConfig)


register_configs()
