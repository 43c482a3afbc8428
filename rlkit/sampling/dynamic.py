"""DAPO dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): keep the groups whose rewards differ; while fewer
than tasks_per_step are kept, roll out new tasks (at most ``max_rounds`` more rounds, and at most
(max_rounds + 1) x tasks_per_step tasks in all). With ``adaptive_batch`` a round draws ``round_size`` tasks,
sized from the share of informative groups the previous step found (DAPO's generation batch larger than its
training batch; never fewer than tasks_per_step): one larger generate call instead of several."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from rlkit.algorithms.grpo import zero_variance_groups

#: Each extra round samples with the step's seed + this x its round number (apart from every other step's seed).
ROUND_SEED_STRIDE = 7919


def informative_groups(outs: list[Any], group_size: int) -> list[int]:
    """Indices of the groups (``group_size`` reward outputs each, contiguous) whose rewards differ."""
    r = torch.tensor([o.total for o in outs], dtype=torch.float32)  # [N]
    return [i for i, z in enumerate(zero_variance_groups(r, group_size).tolist()) if not z]


def round_size(missing: int, drawn: int, informative_counts: tuple[int, int], max_rounds: int,
               tasks_per_step: int) -> int:
    """Tasks the next adaptive round draws: enough to find ``missing`` informative groups if they are as common
    as in the previous step (``informative_counts`` = (informative, sampled) groups, (1, 1) at the start; the
    share floored at 1 / (max_rounds + 1)), at least tasks_per_step (a plain round) and at most what the step's
    budget of (max_rounds + 1) x tasks_per_step tasks leaves after ``drawn``."""
    rounds, b = max_rounds + 1, tasks_per_step
    found, sampled = informative_counts
    # ceil(missing / share) in integers: share = found / sampled, or 1 / rounds when that is smaller
    need = -(-missing * sampled // found) if found * rounds >= sampled else missing * rounds
    return max(1, min(rounds * b - drawn, max(b, need)))


def dynamic_sampling(step: int, sampling: Any, trajs: list[Any], rewards_out: list[Any], *, group_size: int,
                     tasks_per_step: int, max_rounds: int, next_round: Callable[..., tuple[list[Any], list[Any], Any]],
                     draw_round: Callable[[int, int], list[int] | None],
                     ) -> tuple[list[Any], torch.Tensor, list[Any], list[Any], dict[str, float], tuple[int, int]]:
    """More rounds after the first (``trajs``, ``rewards_out``) until tasks_per_step informative groups are found.

    ``next_round(step, sampling, seeds)``: one more rollout round -> (trajectories, reward outputs, extra);
    ``draw_round(drawn_groups, missing)``: the next round's task seeds (adaptive) or None (tasks_per_step new tasks).

    Returns: (kept trajectories: at most tasks_per_step groups in sampling order, the first tasks_per_step
    groups of round 1 when no group differs; their rewards [N']; every sampled trajectory and its reward output,
    for the reward/* and env/* metrics, which describe the policy and not the filter; dynamic/{rounds,
    informative_groups, sampled_groups} metrics; (informative, sampled) groups, which size the next step's
    adaptive round).
    """
    g = group_size
    budget = (max_rounds + 1) * tasks_per_step
    all_trajs, all_out = list(trajs), list(rewards_out)
    rounds = 1
    while ((missing := tasks_per_step - len(informative_groups(all_out, g))) > 0
           and rounds <= max_rounds and len(all_trajs) // g < budget):
        seeds = draw_round(len(all_trajs) // g, missing)
        more, more_out, _ = next_round(step, replace(sampling, seed=sampling.seed + ROUND_SEED_STRIDE * rounds), seeds)
        offset = len(all_trajs) // g
        for t in more:
            t.group += offset
        all_trajs += more
        all_out += more_out
        rounds += 1
    found = informative_groups(all_out, g)
    keep = found[:tasks_per_step]
    metrics = {"dynamic/rounds": float(rounds), "dynamic/informative_groups": float(len(found)),
               "dynamic/sampled_groups": float(len(all_trajs) // g)}
    if not keep:  # nothing to learn from: the round-1 batch, all advantages 0, so the policy-gradient term is 0
        keep = list(range(min(len(trajs) // g, tasks_per_step)))
    kept = [all_trajs[k * g + j] for k in keep for j in range(g)]
    rewards = torch.tensor([all_out[k * g + j].total for k in keep for j in range(g)], dtype=torch.float32)  # [N']
    return kept, rewards, all_trajs, all_out, metrics, (len(found), len(all_trajs) // g)
