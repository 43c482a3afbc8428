"""The sampling half of one GRPO step: rollouts and their rewards (rlkit.sampling's module doc)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from rlkit.algorithms.grpo import zero_variance_groups
from rlkit.config import AuxLossConfig
from rlkit.faults import maybe_crash
from rlkit.rollout import rollout_stats
from rlkit.sampling.demos import demonstration_tasks
from rlkit.sampling.strategies import SamplingStrategy

#: The rollout of one round: (step, task seeds, SamplingParams, group size) -> (B*G trajectories, extra metrics).
RolloutFn = Callable[[int, list[int], Any, int], tuple[list[Any], dict[str, float]]]


@dataclass
class SampledBatch:
    """What one GRPO step's update trains on, before its advantages (rlkit.recipes.grpo computes those).

    trajectories: the kept groups (N = groups x G trajectories, groups contiguous); rewards [N] float32: their
    scores (RewardOutput.total), in the same order; demonstrations: the demonstration term's solver trajectories (None when aux_loss.demo_coef is 0);
    metrics: the sampling half's reward/*, env/*, dynamic/*, demo/*, sync/* and timing/* metrics.
    """

    step: int
    trajectories: list[Any]
    rewards: torch.Tensor
    demonstrations: list[Any] | None
    metrics: dict[str, float]


class StepSampler:
    """Draws each step's tasks and samples and scores them (a strategy that keeps some groups reads the scores).

    Args:
        rollout: the executor's rollout (``RolloutFn``). reward_fn: Episode -> RewardOutput (a GuardedReward).
        tasks: the run's rlkit.tasks.TaskSampler (its position is part of the checkpoint).
        demonstrations: task seeds -> the solver's demonstration trajectories (the executor's).
        sampling: the strategy (rlkit.sampling.strategies: PlainSampling | DapoSampling). aux: the demonstration
            term's settings. group_size, tasks_per_step: G and B.
        seed: the run's seed (each step samples with its own seed, seed x 1,000,003 + step, so a resumed run
            samples what it would have). progress: the console's (``phase``).
    """

    def __init__(self, *, rollout: RolloutFn, reward_fn: Any, tasks: Any, demonstrations: Callable[[list[int]], list[Any]],
                 sampling: SamplingStrategy, aux: AuxLossConfig, group_size: int, tasks_per_step: int, seed: int,
                 steps: int, base_sampling: Any, progress: Any):
        self.rollout, self.reward_fn, self.tasks, self.demos_of = rollout, reward_fn, tasks, demonstrations
        self.strategy, self.aux = sampling, aux
        self.group_size, self.tasks_per_step, self.seed, self.steps = group_size, tasks_per_step, seed, steps
        self.base_sampling, self.progress = base_sampling, progress
        #: (informative, sampled) groups of the last step with extra rounds (dapo): sizes the next adaptive round
        self.informative_counts: tuple[int, int] = (1, 1)

    # -- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The strategy's state, as trainer_state.json keeps it."""
        return {"informative_counts": list(self.informative_counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.informative_counts = tuple(state.get("informative_counts", (1, 1)))

    # -- one round
    def _round(self, step: int, sampling: Any, timing: dict[str, float], seeds: list[int] | None = None,
               ) -> tuple[list[Any], list[Any], dict[str, float]]:
        """One rollout: (trajectories, reward outputs, extra) of G samples of each task in ``seeds`` (default:
        tasks_per_step new training tasks)."""
        seeds = self.tasks.sample(self.tasks_per_step) if seeds is None else seeds
        t0 = time.time()
        with self.progress.phase("rollout", step, self.steps):
            trajs, extra = self.rollout(step, seeds, sampling, self.group_size)
        maybe_crash("rollout", step)
        timing["timing/rollout"] = timing.get("timing/rollout", 0.0) + time.time() - t0
        t1 = time.time()
        failures = getattr(self.reward_fn, "failures", None)  # a GuardedReward's (rlkit.reward_guard)
        failed_before = failures.count if failures is not None else 0
        rewards_out = [self.reward_fn(t.episode) for t in trajs]
        timing["timing/reward"] = timing.get("timing/reward", 0.0) + time.time() - t1
        if failures is not None:  # reward calls counted as 0 under reward.on_error=zero (each logged as a warning)
            timing["reward/failures"] = timing.get("reward/failures", 0.0) + failures.count - failed_before
        return trajs, rewards_out, extra

    # -- one step
    def sample(self, step: int) -> SampledBatch:
        """The sampling half of step ``step`` (1-based): its rollouts, scored. Returns a SampledBatch."""
        g, timing = self.group_size, {}
        t0 = time.time()
        sampling = replace(self.base_sampling, seed=self.seed * 1_000_003 + step)
        seeds = self.strategy.first_round(self.tasks, self.tasks_per_step, self.informative_counts)
        trajs, rewards_out, extra = self._round(step, sampling, timing, seeds)
        rewards = torch.tensor([r.total for r in rewards_out], dtype=torch.float32)  # [B*G]
        sampled, sampled_rewards, dynamic = trajs, rewards, {}
        more = self.strategy.more_rounds(step, sampling, trajs, rewards_out, group_size=g,
                                         tasks_per_step=self.tasks_per_step, tasks=self.tasks,
                                         informative_counts=self.informative_counts,
                                         next_round=lambda s, sp, seeds: self._round(s, sp, timing, seeds))
        if more is not None:  # the strategy rolled out more rounds (dapo): the kept groups, and everything sampled
            trajs, rewards, sampled, rewards_out, dynamic, self.informative_counts = more
            sampled_rewards = torch.tensor([r.total for r in rewards_out], dtype=torch.float32)
        demos = self._demonstrations(sampled, timing) if self.aux.demo_coef > 0 else None
        metrics = {
            "reward/mean": float(sampled_rewards.mean()),
            "reward/std": float(sampled_rewards.std()) if len(sampled_rewards) > 1 else 0.0,
            "reward/success_rate": sum(t.episode.success for t in sampled) / len(sampled),
            "reward/zero_variance_groups": float(zero_variance_groups(sampled_rewards, g).float().mean()),
            **_component_means(rewards_out),
            **rollout_stats(sampled),
            **timing,
            **extra,
            **dynamic,
            "timing/sampling": time.time() - t0,
        }
        return SampledBatch(step, trajs, rewards, demos, metrics)

    def _demonstrations(self, sampled: list[Any], timing: dict[str, float]) -> list[Any]:
        """The solver's demonstrations of this step's hardest tasks (at most aux_loss.demo_max_tasks); demo/tasks
        and timing/demo into ``timing``. A task whose demonstration does not solve it is left out."""
        t0 = time.time()
        seeds = demonstration_tasks(sampled, self.group_size, self.aux.demo_max_successes)[: self.aux.demo_max_tasks]
        demos = self.demos_of(seeds) if seeds else []
        timing["demo/tasks"] = float(len(demos))
        timing["timing/demo"] = time.time() - t0
        return demos


def _component_means(outs: list[Any]) -> dict[str, float]:
    """reward/<name>: the mean of each named reward component over ``outs``."""
    sums: dict[str, float] = {}
    for o in outs:
        for k, v in o.components.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return {f"reward/{k}": v / max(len(outs), 1) for k, v in sums.items()}
