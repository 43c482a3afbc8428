"""The valid values of every typed config field (``RANGES``) and the checks that apply them before any work:
``check_ranges`` over a composed train config, ``check_sft_stage`` over one later warm-start stage (sft.stages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.config.schema import SFTConfig


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

#: Valid values of every typed numeric or enumerated config field, by dotted key (rlkit.config.schema's
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
