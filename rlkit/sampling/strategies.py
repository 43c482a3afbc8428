"""The sampling strategies: how a step's rollout rounds are drawn, one typed class each (conf/sampling/).

The config group ``sampling`` names its strategy by ``_target_`` and holds only that strategy's fields:

- ``PlainSampling`` (conf/sampling/plain.yaml): one round of ``tasks_per_step`` new training tasks x ``group_size``
  samples a step; no fields.
- ``DapoSampling`` (conf/sampling/dapo.yaml): DAPO dynamic sampling (Yu et al. 2025, section 3.2;
  rlkit.sampling.dynamic): keep the groups whose rewards differ and roll out up to ``max_rounds`` more rounds
  until ``tasks_per_step`` of them are found; with ``adaptive_batch`` each round is sized from the share of
  informative groups the previous step found.

``StepSampler`` (rlkit.sampling.step) asks its strategy for the first round's tasks (``first_round``) and for the
rounds after it (``more_rounds``); it never asks which strategy it holds. ``sampling_strategy`` builds one from the
config and refuses a node that mixes strategies (``sampling=plain`` with a dapo key) or a bad value, naming the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from rlkit.errors import ConfigError
from rlkit.sampling.dynamic import dynamic_sampling, round_size

#: One rollout round: (step, SamplingParams, task seeds or None for tasks_per_step new ones) -> (trajectories,
#: reward outputs, extra metrics).
RoundFn = Callable[[int, Any, "list[int] | None"], "tuple[list[Any], list[Any], dict[str, float]]"]


class SamplingStrategy(Protocol):
    """What StepSampler needs of a strategy (module doc)."""

    def first_round(self, tasks: Any, tasks_per_step: int, informative_counts: tuple[int, int]) -> list[int] | None:
        """The first round's task seeds, or None: ``tasks_per_step`` new training tasks."""
        ...

    def more_rounds(self, step: int, sampling: Any, trajs: list[Any], rewards_out: list[Any], *, group_size: int,
                    tasks_per_step: int, tasks: Any, informative_counts: tuple[int, int], next_round: RoundFn,
                    ) -> tuple[list[Any], Any, list[Any], list[Any], dict[str, float], tuple[int, int]] | None:
        """After the first round (``trajs``, ``rewards_out``): rlkit.sampling.dynamic.dynamic_sampling's result, or
        None when the first round is the step's batch."""
        ...


@dataclass
class PlainSampling:
    """One round of ``tasks_per_step`` new training tasks x ``group_size`` samples a step (conf/sampling/plain.yaml)."""

    def first_round(self, tasks: Any, tasks_per_step: int, informative_counts: tuple[int, int]) -> list[int] | None:
        """None: tasks_per_step new training tasks."""
        return None

    def more_rounds(self, step: int, sampling: Any, trajs: list[Any], rewards_out: list[Any], **_: Any) -> None:
        """None: the first round is the step's batch."""
        return None


@dataclass
class DapoSampling:
    """DAPO dynamic sampling (Yu et al. 2025, section 3.2; conf/sampling/dapo.yaml; rlkit.sampling.dynamic).

    max_rounds: extra rollout rounds a step at most (>= 1; at most (max_rounds + 1) x tasks_per_step tasks in all).
    adaptive_batch: size each round to fill the step at once, from the share of informative groups the previous step
    found (DAPO's generation batch larger than its training batch); False: each round draws tasks_per_step tasks.
    """

    max_rounds: int = 3
    adaptive_batch: bool = True

    def _draw(self, tasks: Any, tasks_per_step: int, informative_counts: tuple[int, int], drawn: int,
              missing: int) -> list[int] | None:
        """The next round's tasks when rounds are adaptive, else None (tasks_per_step new tasks)."""
        if not self.adaptive_batch:
            return None
        return tasks.sample(round_size(missing, drawn, informative_counts, self.max_rounds, tasks_per_step))

    def first_round(self, tasks: Any, tasks_per_step: int, informative_counts: tuple[int, int]) -> list[int] | None:
        """An adaptive first round (sized for tasks_per_step informative groups), else None."""
        return self._draw(tasks, tasks_per_step, informative_counts, 0, tasks_per_step)

    def more_rounds(self, step: int, sampling: Any, trajs: list[Any], rewards_out: list[Any], *, group_size: int,
                    tasks_per_step: int, tasks: Any, informative_counts: tuple[int, int], next_round: RoundFn,
                    ) -> tuple[list[Any], Any, list[Any], list[Any], dict[str, float], tuple[int, int]] | None:
        """rlkit.sampling.dynamic.dynamic_sampling over the first round (None with max_rounds 0)."""
        if self.max_rounds <= 0:
            return None
        return dynamic_sampling(
            step, sampling, trajs, rewards_out, group_size=group_size, tasks_per_step=tasks_per_step,
            max_rounds=self.max_rounds,
            draw_round=lambda drawn, missing: self._draw(tasks, tasks_per_step, informative_counts, drawn, missing),
            next_round=next_round)


#: conf/sampling/<name>.yaml -> its strategy (the ``_target_`` each option file names).
STRATEGIES: dict[str, type] = {"plain": PlainSampling, "dapo": DapoSampling}
#: The ``_target_`` of each strategy, as the option files write it.
TARGETS: dict[str, str] = {name: f"rlkit.sampling.{cls.__name__}" for name, cls in STRATEGIES.items()}


def strategy_name(node: Any) -> str | None:
    """The conf/sampling/ option (``plain`` | ``dapo``) whose ``_target_`` ``node`` names; None for another."""
    target = str(node.get("_target_", "")) if hasattr(node, "get") else ""
    for name, cls in STRATEGIES.items():
        if target in (TARGETS[name], f"{cls.__module__}.{cls.__name__}"):
            return name
    return None


def sampling_problems(node: Any) -> list[str]:
    """Every problem of a ``sampling`` config node (a mapping with ``_target_``), each naming the fix: an unknown
    ``_target_``, a key the chosen strategy does not have (``sampling=plain`` with DAPO's ``max_rounds`` /
    ``adaptive_batch``, or a typo), a value of the wrong type or range. [] when ``sampling_strategy`` builds it."""
    name = strategy_name(node)
    if name is None:
        return [f"sampling._target_={node.get('_target_') if hasattr(node, 'get') else node!r} must be one of "
                f"{', '.join(TARGETS.values())} (conf/sampling/: sampling=plain | sampling=dapo)"]
    cls = STRATEGIES[name]
    known = {f.name: f for f in dataclasses.fields(cls)}
    extra = {str(k): node[k] for k in node.keys() if k != "_target_" and k not in known}
    problems = []
    if extra:
        dapo = {f.name for f in dataclasses.fields(DapoSampling)}
        shown = " / ".join(f"sampling.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items())
        if name == "plain" and set(extra) <= dapo:
            problems.append(f"{shown} belong to DAPO dynamic sampling, which sampling=plain does not run: choose "
                            "sampling=dapo, or drop them")
        else:
            import difflib

            close = [c for k in extra for c in difflib.get_close_matches(k, list(known), n=1)]
            hint = f"did you mean {', '.join('sampling.' + c for c in close)}?" if close else \
                f"its keys: {', '.join(known) or 'none'}"
            problems.append(f"{shown}: sampling={name} has no such key ({hint})")
    if name == "dapo":
        rounds, adaptive = node.get("max_rounds", 3), node.get("adaptive_batch", True)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            problems.append(f"sampling.max_rounds={rounds!r} must be an integer >= 0 (dapo's extra rollout rounds a "
                            "step)")
        elif rounds < 1:
            problems.append("sampling=dapo with sampling.max_rounds=0 samples no extra round: set sampling.max_rounds "
                            ">= 1, or sampling=plain")
        if not isinstance(adaptive, bool):
            problems.append(f"sampling.adaptive_batch={adaptive!r} must be true or false")
    return problems


def sampling_strategy(node: Any) -> PlainSampling | DapoSampling:
    """The strategy a ``sampling`` config node names (conf/sampling/*.yaml), built with its fields.

    Raises: rlkit.errors.ConfigError listing ``sampling_problems``."""
    problems = sampling_problems(node)
    if problems:
        raise ConfigError("; ".join(problems))
    cls = STRATEGIES[strategy_name(node)]
    return cls(**{k: node[k] for k in (f.name for f in dataclasses.fields(cls)) if k in node})
