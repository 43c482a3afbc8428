"""The demonstration term's data (ReLIFT, Ma et al. 2025, "Learning What Reinforcement Learning Can't"): which
tasks of a step get the env's solver demonstration."""

from __future__ import annotations

from typing import Any


def demonstration_tasks(trajectories: list[Any], group_size: int, max_successes: int = 0) -> list[int]:
    """Seeds of the tasks the demonstration term teaches, in order of first appearance, each once: those with a
    group whose ``group_size`` samples had at most ``max_successes`` (``aux_loss.demo_max_successes``) successes
    (``episode.success``). 0, the default, picks the all-fail tasks, the hardest ones, as ReLIFT does.

    Args: trajectories: groups contiguous (``group_size`` samples each, as rlkit.rollout returns them).
    Raises: ValueError if their number is not a multiple of group_size, or max_successes is not in
        [0, group_size).
    """
    if group_size < 1 or len(trajectories) % group_size:
        raise ValueError(f"{len(trajectories)} trajectories are not whole groups of {group_size}")
    if not 0 <= max_successes < group_size:
        raise ValueError(f"aux_loss.demo_max_successes must be in [0, group_size={group_size}), got {max_successes}")
    seeds: list[int] = []
    for k in range(0, len(trajectories), group_size):
        group = trajectories[k : k + group_size]
        seed = group[0].episode.seed
        if sum(bool(t.episode.success) for t in group) <= max_successes and seed not in seeds:
            seeds.append(seed)
    return seeds
