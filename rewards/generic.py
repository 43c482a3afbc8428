"""Env-independent rewards: output format and weighted sums of other rewards."""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
from collections.abc import Mapping

from rlkit.types import Episode, RewardFn, RewardOutput


class FormatReward:
    """Share of the episode's turns whose output parsed into a valid action
    (``turn.info["parse_ok"]``); 0.0 for an episode without turns. Component: ``format``.

    Raises:
        ValueError: a turn without ``info["parse_ok"]`` (the env does not report it).
    """

    name = "format"
    info_keys: tuple[str, ...] = ("parse_ok",)

    def __repr__(self) -> str:
        return "FormatReward()"

    def __call__(self, episode: Episode) -> RewardOutput:
        if not episode.turns:
            return RewardOutput(0.0, {self.name: 0.0})
        ok = 0
        for i, turn in enumerate(episode.turns):
            if "parse_ok" not in turn.info:
                raise ValueError(
                    f"reward 'format' needs turn.info['parse_ok']; turn {i} of episode seed "
                    f"{episode.seed} has none"
                )
            ok += bool(turn.info["parse_ok"])
        total = ok / len(episode.turns)
        return RewardOutput(total, {self.name: total})


def reward_classes(package: str = "rewards") -> dict[str, type]:
    """The reward plug-ins of a package, found by reading its modules: nothing to register.

    A reward class is a class defined in one of ``package``'s modules (``<package>/<module>.py``, imported here)
    with a class attribute ``name`` (a non-empty str) and a ``__call__``; a class re-exported from elsewhere counts
    where it is defined. Classes whose name is set per instance (``WeightedSum``, ``TRLReward``) are not listed:
    they cannot be built from a name alone.

    Returns: ``{name: class}``.
    Raises:
        ImportError: ``package`` or one of its modules does not import (the module's own error).
        ValueError: two classes share a ``name`` (names both and their modules: rename one).
    """
    pkg = importlib.import_module(package)
    found: dict[str, type] = {}
    for mod in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
        module = importlib.import_module(f"{package}.{mod.name}")
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == module.__name__):
                continue
            name = vars(cls).get("name")
            if not isinstance(name, str) or not name or "__call__" not in dir(cls):
                continue
            other = found.setdefault(name, cls)
            if other is not cls:
                raise ValueError(
                    f"rewards {other.__module__}.{other.__qualname__} and {cls.__module__}.{cls.__qualname__} "
                    f"share the name {name!r}: reward names are logged as reward/<name> and looked up by "
                    "WeightedSum, so rename one"
                )
    return found


def builtin_rewards() -> dict[str, type]:
    """Reward plug-ins known by name (for ``WeightedSum`` weights without an explicit instance): every reward
    class in the ``rewards`` package's modules (``reward_classes``), so a new module there is known by adding it."""
    return reward_classes("rewards")


class WeightedSum:
    """A weighted sum of named reward plug-ins, e.g. SkyRL's SFT-recipe reward
    ``0.8 * maze_exit + 0.2 * format``.

    Args:
        weights: reward name -> weight (finite floats).
        rewards: optional reward name -> RewardFn instance (e.g. a configured ``ShapedDistance``);
            names not given here are built from ``builtin_rewards()`` with default arguments.
        name: this reward's name (default "weighted").

    ``info_keys``: the per-turn info keys its terms read (the union of theirs, in order).

    Output: ``total = sum(weight * reward.total)``; components: each sub-reward's unweighted total
    under its name, plus its own components as ``<name>/<component>`` when they say more.

    Raises:
        ValueError: empty or non-finite weights, an unknown reward name, or ``rewards`` entries
            without a weight.
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        rewards: Mapping[str, RewardFn] | None = None,
        name: str = "weighted",
    ):
        weights = {str(k): float(v) for k, v in dict(weights).items()}
        if not weights:
            raise ValueError("WeightedSum needs at least one weight")
        bad = {k: v for k, v in weights.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"WeightedSum weights must be finite, got {bad}")
        given = dict(rewards or {})
        extra = sorted(set(given) - set(weights))
        if extra:
            raise ValueError(f"WeightedSum: rewards {extra} have no weight; weights has {sorted(weights)}")
        known = builtin_rewards()
        self.terms: dict[str, tuple[float, RewardFn]] = {}
        for key, w in weights.items():
            if key in given:
                fn = given[key]
            elif key in known:
                fn = known[key]()
            else:
                raise ValueError(
                    f"WeightedSum: unknown reward {key!r}; built-in names are {sorted(known)}, "
                    "or pass an instance under `rewards`"
                )
            self.terms[key] = (w, fn)
        self.name = name
        keys: dict[str, None] = {}
        for _, fn in self.terms.values():
            keys.update(dict.fromkeys(getattr(fn, "info_keys", ())))
        self.info_keys: tuple[str, ...] = tuple(keys)

    def __repr__(self) -> str:
        terms = ", ".join(f"{w} * {fn!r}" for w, fn in self.terms.values())
        return f"WeightedSum({terms})"

    def __call__(self, episode: Episode) -> RewardOutput:
        total = 0.0
        components: dict[str, float] = {}
        for key, (w, fn) in self.terms.items():
            out = fn(episode)
            total += w * out.total
            components[key] = out.total
            for sub, value in out.components.items():
                if sub != key and sub != getattr(fn, "name", key):
                    components[f"{key}/{sub}"] = value
        components[self.name] = total
        return RewardOutput(total, components)
