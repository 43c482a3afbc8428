"""The data contract between environments, rewards, policies and the GRPO loop.

The core (rlkit/) knows only these types. An environment package (envs/<name>/) implements
`EpisodeEnv` and `EnvSpec`; a reward function maps an `Episode` to a `RewardOutput`; the policy
package turns conversations into tokens and back. Nothing here names a particular env.

The episode protocol follows the text-environment shape used by skyrl-gym's BaseTextEnv
(init -> observation, step(model_text) -> observation, reward, done, metadata), with images added:
the policy sees, on each turn, the observation text and zero or more images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image


@dataclass
class Observation:
    """What the policy is shown on one turn, as one user message.

    text: the message text (task prompt on turn 0, feedback afterwards).
    images: PIL images attached to the message, in order, shown before the text.
    """

    text: str
    images: list[Image.Image] = field(default_factory=list)


@dataclass
class StepOutput:
    """Result of `EpisodeEnv.step`.

    observation: next user message, or None when `done`.
    reward: env reward of this step (upstream semantics; the trained reward is a `RewardFn`).
    done: the episode ended (terminated by the env). The turn budget is the harness's, not the env's.
    info: env-specific per-turn facts (JSON-serialisable). The core reads only two keys when present:
        "parse_ok" (bool, the model output parsed into a valid action) and "success" (bool).
    """

    observation: Observation | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class EpisodeEnv(Protocol):
    """A text-in, observation-out episode (one instance per concurrent episode).

    reset(seed) starts the episode on task `seed` and returns the first user message.
    step(action_text) consumes the raw model output of one turn. It must never raise on a
    malformed output: an unparsable action is a no-op with info["parse_ok"] = False.
    success() says whether the episode solved its task (used for success rate / eval).
    """

    system_prompt: str | None

    def reset(self, seed: int) -> Observation: ...

    def step(self, action_text: str) -> StepOutput: ...

    def success(self) -> bool: ...


class EnvSpec(Protocol):
    """What a conf/env/<name>.yaml instantiates (via `_target_`): a factory plus the task sets.

    max_turns: policy turns per episode (1 for single-turn envs).
    make(): a fresh EpisodeEnv.
    eval_seeds(): the fixed evaluation set (list of task seeds), e.g. visgym_easy_64 = 0..63.
    eval_set_name: its name for logs and result files.
    is_eval_seed(seed): True if training must never see this seed.

    Optional capabilities are the ``Supports*`` protocols below (stop strings, held-out keys, an action budget,
    demonstrations, grounding questions, trajectory pictures); the core asks for one only with
    ``isinstance(spec, SupportsX)`` and otherwise uses the default each protocol documents. The recipe checks,
    before any work, that the env has each one its configured stages need
    (rlkit.recipes.validation.capability_problems), and refuses with a config error naming the capability and the
    override that avoids it.
    """

    max_turns: int
    eval_set_name: str

    def make(self) -> EpisodeEnv: ...

    def eval_seeds(self) -> list[int]: ...

    def is_eval_seed(self, seed: int) -> bool: ...


@dataclass
class Turn:
    """One policy turn of an episode: the raw model text and what the env said about it."""

    action_text: str
    env_reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"  # "stop" (end-of-turn token) or "length" (max_new_tokens hit)


@dataclass
class Episode:
    """The record a reward function sees: a finished episode on one task.

    seed: the task seed. turns: the policy turns in order. terminated: the env ended it (done);
    truncated: the turn budget ran out first. success: env.success() at the end.
    """

    seed: int
    turns: list[Turn]
    terminated: bool
    truncated: bool
    success: bool

    @property
    def env_return(self) -> float:
        return float(sum(t.env_reward for t in self.turns))

    @property
    def parse_failures(self) -> int:
        return sum(1 for t in self.turns if not t.info.get("parse_ok", True))


@dataclass
class RewardOutput:
    """A scalar reward for one episode plus named components for logging (reward/<name>)."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


class RewardFn(Protocol):
    """reward(episode) -> RewardOutput. Pure: no state, no I/O. `name` is used in error messages."""

    name: str

    def __call__(self, episode: Episode) -> RewardOutput: ...


# ---------------------------------------------------------------------------------------------------------
# Optional env capabilities. An EnvSpec declares one by having its methods (structural typing: no base class
# to inherit); ``isinstance(spec, SupportsX)`` is how the core asks. Nothing else of an env is read by the core.


@runtime_checkable
class SupportsStopStrings(Protocol):
    """``stop_strings``: a tuple of strings that end a policy turn as soon as its text contains one (e.g. VisGym's
    "</answer>" for parsers that read an answer block).

    The default of ``rollout.stop`` (rlkit.config.stop_strings); without it a turn ends at the end-of-turn token
    (no stop strings, ``()``).
    """

    stop_strings: tuple[str, ...]


@runtime_checkable
class SupportsEvalHoldout(Protocol):
    """``eval_holdout_keys``: the env config keys that decide what training holds out of the evaluation set
    (VisGym: ``("holdout",)``).

    A chained warm start's job that evaluates on the same set takes this job's values of those keys
    (rlkit.stages.warm_start); without it nothing is carried over (``()``).
    """

    eval_holdout_keys: tuple[str, ...]


@runtime_checkable
class SupportsActionBudget(Protocol):
    """``action_budget``: the env's own budget of actions per episode (an int; VisGym: moves, which in plan mode
    are all given in one policy turn), recorded as the run summary's ``action_budget``; without it that is
    ``max_turns``.
    """

    action_budget: int


@runtime_checkable
class SupportsDemonstrations(Protocol):
    """A solver: ``demonstration(seed)`` -> the assistant texts of a solved episode on task ``seed``, one per
    policy turn, in the env's own output format (replayed through ``make()`` to encode it).

    Needed by the SFT warm start (``sft.enabled=true``) and the demonstration loss (``aux_loss.demo_coef > 0``).
    A demonstration that does not solve its task within ``max_turns`` is skipped by both.
    """

    def demonstration(self, seed: int) -> list[str]: ...


@runtime_checkable
class SupportsRecoveryDemonstrations(Protocol):
    """A solver that also shows a way back from a mistake: ``recovery_demonstration(seed, rng)`` -> the solver's
    episode on task ``seed`` with a mistake drawn by ``rng`` (a numpy Generator) in it and the solver's way on from
    the state it leads to, as ``[(assistant text, imitate), ...]``, one per policy turn, in the env's output format.

    The warm start (``sft.recovery_share`` > 0) replays it through ``make()`` like a demonstration and learns the
    turns with ``imitate`` True only (loss mask 0 on the others): the states after an error, which a solver's own
    episodes never reach (DART, Laskey et al. 2017). A recovery demonstration that does not solve its task within
    ``max_turns`` is skipped.
    """

    def recovery_demonstration(self, seed: int, rng: Any) -> list[tuple[str, bool]]: ...


@runtime_checkable
class SupportsGroundingQuestions(Protocol):
    """Questions about the env's pictures, for the grounding stage of a policy that cannot read them yet.

    grounding_tasks: the question kinds it offers (e.g. VisGym's "cell", "walls").
    grounding_example(seed, task, rng): one question of kind ``task`` on task ``seed``'s picture, drawn with
    the numpy Generator ``rng``; an object with ``image`` (PIL), ``question`` and ``answer`` (str) and,
    optionally, ``wall_bit`` (the question asks one bit) / ``bit_offsets`` (the answer's characters that are bits)
    for per-bit accuracy (rlkit.stages.grounding.encode_example).

    Optional: ``grounding_bits_name`` (``SupportsGroundingBitsName``), what accuracy tables call the bits the
    questions ask (default "bits").
    Needed by the grounding stage (``grounding.enabled=true`` with a tiny policy) and ``sft.grounding_mix > 0``.
    """

    grounding_tasks: Any

    def grounding_example(self, seed: int, task: str, rng: Any) -> Any: ...


@runtime_checkable
class SupportsGroundingBitsName(Protocol):
    """``grounding_bits_name``: what the grounding accuracy tables call the bits the questions ask (a str; VisGym:
    "wall_bits"); without it they say "bits" (rlkit.stages.grounding.bits_name)."""

    grounding_bits_name: str


@runtime_checkable
class SupportsTrajectoryRender(Protocol):
    """``render_trajectory(seed, infos)`` -> a PIL image of an episode on task ``seed`` from its per-turn
    ``StepOutput.info`` dicts, in order, for evaluation tables and reports (rlkit.report.episodes); without
    it they show the episode's first observation image."""

    def render_trajectory(self, seed: int, infos: list[dict[str, Any]]) -> Image.Image: ...
