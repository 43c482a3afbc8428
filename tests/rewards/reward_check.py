"""The generic reward check, shared by tests/rewards/test_reward_configs.py and the tests that add a reward of their
own (a new module and YAML in a tmp folder): every reward config is played on episodes of the envs it is meant for.

Reward classes found in the ``rewards`` package's modules (``rewards.reward_classes``), YAML or not, get the same
check built with their default arguments (as ``WeightedSum`` builds a reward it knows by name).

A reward says what it reads with a class (or instance) attribute ``info_keys``: the per-turn ``StepOutput.info``
keys it needs (``()`` for a reward that reads only ``Episode.success``). It may also name the envs it is meant for,
``envs = ("shapes", ...)`` (conf/env names); without that it is played on every env config whose episodes report all
its ``info_keys``. Each env gives three episodes: its solver's (``demonstration``) on its first training seed, one
turn of malformed text (the empty string) and one without turns. The reward must score them in [0, 1], the solved
one 1.0 and the malformed one below that.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlkit.plugins import instantiate_reward
from rlkit.reward_guard import safe_call
from rlkit.types import Episode, SupportsDemonstrations, Turn

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


@dataclass
class EnvEpisodes:
    """Episodes of one env config: ``solved`` (None without a solver), ``malformed``, ``empty``, and ``info_keys``,
    the keys every turn of them reports."""

    name: str
    solved: Episode | None
    malformed: Episode
    empty: Episode
    info_keys: frozenset[str]


def _play(spec, seed: int, texts: list[str]) -> Episode:
    env = spec.make()
    env.reset(seed)
    turns = []
    for text in texts[: spec.max_turns]:
        out = env.step(text)
        turns.append(Turn(action_text=text, env_reward=float(out.reward), done=bool(out.done), info=dict(out.info)))
        if out.done:
            break
    terminated = bool(turns and turns[-1].done)
    return Episode(seed=seed, turns=turns, terminated=terminated, truncated=not terminated, success=env.success())


def env_episodes(path: Path) -> EnvEpisodes:
    """Play the env of ``conf/env/<name>.yaml`` (``path``) as the module doc says."""
    spec = instantiate(OmegaConf.load(path))
    seed = next(s for s in itertools.count() if not spec.is_eval_seed(s))
    solved = _play(spec, seed, spec.demonstration(seed)) if isinstance(spec, SupportsDemonstrations) else None
    malformed = _play(spec, seed, [""])
    played = [e for e in (solved, malformed) if e is not None]
    keys = frozenset.intersection(*(frozenset(t.info) for e in played for t in e.turns))
    return EnvEpisodes(path.stem, solved, malformed, Episode(seed, [], False, True, False), keys)


def reward_yamls(*conf_dirs: Path) -> list[Path]:
    """Every ``reward/*.yaml`` under the given config roots (default: this checkout's conf/), sorted by name."""
    return sorted((p for d in (conf_dirs or (CONF,)) for p in (Path(d) / "reward").glob("*.yaml")),
                  key=lambda p: p.stem)


def declared(fn, attr: str):
    """``fn``'s ``info_keys`` / ``envs`` declaration (a GuardedReward is read through to the reward it wraps)."""
    return getattr(getattr(fn, "fn", fn), attr, None)


def envs_for(fn, envs: dict[str, EnvEpisodes]) -> list[EnvEpisodes]:
    """The envs a reward is meant for (module doc). Raises AssertionError naming the fix when there is none."""
    name, keys, wanted = fn.name, declared(fn, "info_keys"), declared(fn, "envs")
    assert keys is not None, (
        f"reward {name!r} declares no info_keys: add a class attribute info_keys = (...), the StepOutput.info keys "
        "it reads (() if it reads only Episode.success), so the reward tests can feed it episodes of its env"
    )
    if wanted is not None:
        unknown = sorted(set(wanted) - set(envs))
        assert not unknown, f"reward {name!r} names envs {unknown} that have no env config; known: {sorted(envs)}"
        chosen = [envs[e] for e in wanted]
        for e in chosen:
            assert set(keys) <= e.info_keys, f"reward {name!r} reads {sorted(set(keys) - e.info_keys)}, not in env {e.name}'s infos"
        return chosen
    chosen = [e for e in envs.values() if set(keys) <= e.info_keys]
    assert chosen, (
        f"reward {name!r} reads info keys {sorted(keys)} that no env config reports (env keys: "
        f"{ {e.name: sorted(e.info_keys) for e in envs.values()} }): fix info_keys or name its envs (envs = (...))"
    )
    return chosen


def check_reward(fn, envs: dict[str, EnvEpisodes], label: str) -> list[str]:
    """Play reward ``fn`` (``label`` names it in messages) on its envs' episodes; returns the names of the envs it
    was played on. Raises AssertionError naming the reward, the env and the episode that scored wrong."""
    assert isinstance(fn.name, str) and fn.name, f"{label}: the reward has no name"
    played = []
    for env in envs_for(fn, envs):
        for kind in ("solved", "malformed", "empty"):
            ep = getattr(env, kind)
            if ep is None:
                continue
            total = safe_call(fn, ep).total
            assert math.isfinite(total) and 0.0 <= total <= 1.0, f"{label} on {env.name}'s {kind} episode: {total}"
        if env.solved is not None:
            solved, junk = safe_call(fn, env.solved).total, safe_call(fn, env.malformed).total
            assert solved == 1.0, f"{label} gives {env.name}'s solved episode {solved}, not 1.0"
            assert junk < solved, f"{label} gives {env.name}'s malformed episode {junk}, as much as a solved one"
        played.append(env.name)
    return played


def check_reward_config(path: Path, envs: dict[str, EnvEpisodes]) -> list[str]:
    """``check_reward`` on the reward of ``conf/reward/<name>.yaml`` (``path``), built as the core builds it."""
    return check_reward(instantiate_reward(OmegaConf.load(path)), envs, path.stem)
