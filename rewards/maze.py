"""Maze rewards: upstream VisGym success and a shaped research variant."""

from __future__ import annotations

from rewards.base import last_info
from rlkit.types import Episode, RewardOutput


class MazeExit:
    """1.0 if the episode succeeded (the agent stopped on the goal: upstream VisGym maze_2d
    success, ``Episode.success``), else 0.0. Component: ``maze_exit``."""

    name = "maze_exit"
    info_keys: tuple[str, ...] = ()  # reads Episode.success only: fits any env

    def __repr__(self) -> str:
        return "MazeExit()"

    def __call__(self, episode: Episode) -> RewardOutput:
        total = 1.0 if episode.success else 0.0
        return RewardOutput(total=total, components={self.name: total})


class ShapedDistance:
    """Success plus partial credit for getting closer (research reward, not upstream).

    total = 1.0 on success, else ``partial_credit * progress`` with
    ``progress = clip(1 - d_end / d_start, 0, 1)``, where d_start / d_end are the shortest-path
    distances (moves) to the goal at the start and at the end of the episode, read from the last
    turn's ``info["start_bfs_distance"]`` and ``info["bfs_distance"]`` (envs.visgym reports both).
    An episode with no turn gets 0. Components: ``shaped_distance``, ``progress``, ``bfs_distance``.

    Args:
        partial_credit: the most a failed episode can get (0 <= partial_credit < 1, default 0.5).

    Raises:
        ValueError: bad ``partial_credit``; on call, an env that does not report the distances.
    """

    name = "shaped_distance"
    info_keys: tuple[str, ...] = ("bfs_distance", "start_bfs_distance")

    def __init__(self, partial_credit: float = 0.5):
        if not 0.0 <= float(partial_credit) < 1.0:
            raise ValueError(f"partial_credit must be in [0, 1), got {partial_credit!r}")
        self.partial_credit = float(partial_credit)

    def __repr__(self) -> str:
        return f"ShapedDistance(partial_credit={self.partial_credit})"

    def __call__(self, episode: Episode) -> RewardOutput:
        if not episode.turns:
            return RewardOutput(0.0, {self.name: 0.0, "progress": 0.0})
        d_end = float(last_info(episode, "bfs_distance", self.name))
        d_start = float(last_info(episode, "start_bfs_distance", self.name))
        progress = 1.0 if d_start <= 0 else min(1.0, max(0.0, 1.0 - d_end / d_start))
        total = 1.0 if episode.success else self.partial_credit * progress
        return RewardOutput(total, {self.name: total, "progress": progress, "bfs_distance": d_end})
