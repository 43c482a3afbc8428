"""Shared helpers of the reward plug-ins."""

from __future__ import annotations

from rlkit.types import Episode


def last_info(episode: Episode, key: str, reward_name: str):
    """``episode.turns[-1].info[key]``.

    Raises:
        ValueError: the episode has no turns or its last turn lacks ``key`` (names the reward,
            the key and the episode seed).
    """
    if not episode.turns:
        raise ValueError(f"reward {reward_name!r} needs at least one turn (episode seed {episode.seed})")
    info = episode.turns[-1].info
    if key not in info:
        raise ValueError(
            f"reward {reward_name!r} needs turn.info[{key!r}] from the env, which this env does not "
            f"report (episode seed {episode.seed}; info keys: {sorted(info)})"
        )
    return info[key]
