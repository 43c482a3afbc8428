"""Every conf/reward/*.yaml, played on the envs it is meant for (tests/rewards/reward_check.py), the docs' table of
shipped rewards against what ships, and the proof that a new reward is one module and one YAML."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import rewards
from rewards import WeightedSum, reward_classes
from rlkit.plugins import instantiate_reward
from tests.rewards.reward_check import (CONF, ROOT, check_reward, check_reward_config, env_episodes, envs_for,
                                        reward_yamls)

REWARD_YAMLS = reward_yamls()


@pytest.fixture(scope="module")
def envs():
    return {p.stem: env_episodes(p) for p in sorted((CONF / "env").glob("*.yaml"))}


@pytest.mark.parametrize("path", REWARD_YAMLS, ids=[p.stem for p in REWARD_YAMLS])
def test_reward_config(path, envs):
    fn = instantiate_reward(OmegaConf.load(path))
    assert fn.timeout_s == 60 and fn.on_error == "raise"
    assert check_reward_config(path, envs)


REWARD_CLASSES = reward_classes()


@pytest.mark.parametrize("name", sorted(REWARD_CLASSES))
def test_reward_class(name, envs):
    # every reward class of rewards/, with or without a YAML of its own (FormatReward has none), as WeightedSum
    # builds it by name
    assert check_reward(REWARD_CLASSES[name](), envs, name)


def test_rewards_are_played_on_the_envs_that_report_their_keys(envs):
    played = {p.stem: check_reward_config(p, envs) for p in REWARD_YAMLS}
    mazes = ["visgym", "visgym_hard", "visgym_interactive", "visgym_small"]
    assert played["shaped"] == mazes  # VisGym's distances: never fed the shapes env's infos
    assert played["exact_answer"] == ["shapes"] and played["trl_answer"] == ["shapes"]
    assert played["maze_exit"] == sorted(envs) and played["maze_exit_format"] == sorted(envs)
    assert envs["shapes"].solved.success and not envs["shapes"].malformed.success


def test_a_reward_without_info_keys_or_an_env_is_refused_with_the_fix(envs):
    class Silent:
        name = "silent"

    class Unheard:
        name, info_keys = "unheard", ("no_env_reports_this",)

    class Misplaced:
        name, info_keys, envs = "misplaced", ("answer",), ("visgym_small",)

    with pytest.raises(AssertionError, match="declares no info_keys: add a class attribute"):
        envs_for(Silent(), envs)
    with pytest.raises(AssertionError, match=r"reads info keys \['no_env_reports_this'\] that no env config reports"):
        envs_for(Unheard(), envs)
    with pytest.raises(AssertionError, match=r"reads \['answer'\], not in env visgym_small's infos"):
        envs_for(Misplaced(), envs)


def _table_rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "adding-a-reward.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \(([\w/]+\.py)\) \| ([^|]*) \|", text, re.M)
    assert rows, "no table of shipped rewards in docs/adding-a-reward.md"
    return rows


def test_docs_table_lists_what_ships():
    rows = _table_rows()
    listed_yamls = {y for _, _, cell in rows for y in re.findall(r"(\w+)\.yaml", cell)}
    assert listed_yamls == {p.stem for p in (CONF / "reward").glob("*.yaml")}
    targets = {OmegaConf.load(p)["_target_"] for p in (CONF / "reward").glob("*.yaml")}
    shipped = {cls for cls in reward_classes().values()}
    for target in targets:
        module, _, attr = target.rpartition(".")
        shipped.add(getattr(importlib.import_module(module), attr))
    assert {name for name, _, _ in rows} == {cls.__name__ for cls in shipped}
    for name, file, _ in rows:  # each class where the table says it is
        (cls,) = [c for c in shipped if c.__name__ == name]
        assert Path(sys.modules[cls.__module__].__file__).relative_to(ROOT).as_posix() == file, name


NEW_REWARD = '''"""A reward added by a test: 1.0 when the env parsed an answer at all."""

from rlkit.types import Episode, RewardOutput


class Answered:
    name = "answered"
    info_keys = ("answer",)

    def __call__(self, episode: Episode) -> RewardOutput:
        total = float(bool(episode.turns) and episode.turns[-1].info["answer"] is not None)
        return RewardOutput(total, {self.name: total})
'''

NEW_YAML = """_target_: rewards.answered.Answered
timeout_s: 60
on_error: raise
"""


def test_a_new_reward_is_one_module_and_one_yaml(tmp_path, monkeypatch, envs):
    # rewards/answered.py and conf/reward/answered.yaml, written in a tmp folder that stands in for the checkout's
    # rewards/ and conf/: no other file is touched
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "answered.py").write_text(NEW_REWARD)
    (tmp_path / "conf" / "reward").mkdir(parents=True)
    (tmp_path / "conf" / "reward" / "answered.yaml").write_text(NEW_YAML)
    monkeypatch.setattr(rewards, "__path__", [*rewards.__path__, str(tmp_path / "rewards")])
    monkeypatch.delitem(sys.modules, "rewards.answered", raising=False)
    importlib.invalidate_caches()
    try:
        found = reward_yamls(CONF, tmp_path / "conf")
        assert [p.stem for p in found] == sorted([*(p.stem for p in REWARD_YAMLS), "answered"])
        assert check_reward_config(tmp_path / "conf" / "reward" / "answered.yaml", envs) == ["shapes"]
        assert reward_classes()["answered"].__module__ == "rewards.answered"  # known by name, for WeightedSum
        assert check_reward(reward_classes()["answered"](), envs, "answered") == ["shapes"]
        mix = WeightedSum({"answered": 0.5, "exact_answer": 0.5})
        assert mix.info_keys == ("answer", "expected")
        assert mix(envs["shapes"].solved).total == 1.0 and mix(envs["shapes"].malformed).total == 0.0
    finally:
        monkeypatch.undo()
        sys.modules.pop("rewards.answered", None)
    assert "answered" not in reward_classes()
