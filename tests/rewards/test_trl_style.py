"""TRL-style batched reward functions as rlkit rewards (rewards/trl_style.py, conf/reward/trl_answer.yaml)."""

import math

import pytest
from omegaconf import OmegaConf

from rewards.trl_style import TRLReward, answer_block_match, resolve_function
from rlkit.plugins import instantiate_reward
from rlkit.reward_guard import RewardError
from rlkit.types import Episode, Turn
from tests.rewards.reward_check import CONF


def ep(*texts, seed=3, **info):
    turns = [Turn(action_text=t, env_reward=0.0, done=i == len(texts) - 1, info=dict(info)) for i, t in enumerate(texts)]
    return Episode(seed=seed, turns=turns, terminated=True, truncated=False, success=False)


def test_answer_block_match_is_a_trl_reward_function():
    # TRL calls it with keyword lists, one entry per completion; None where it does not apply
    assert answer_block_match(prompts=["q"] * 4, completions=["<answer> red </answer>", "red", "<answer>blue</answer>",
                                                              "<answer>red</answer>"],
                              solution=["red", "red", "red", None]) == [1.0, 0.0, 0.0, None]
    conv = [[{"role": "assistant", "content": "<answer>3</answer>"}]]
    assert answer_block_match(prompts=[[]], completions=conv, solution=[3]) == [1.0]


def test_the_wrapper_passes_trl_arguments_from_the_episode():
    seen = {}

    def spy(prompts, completions, solution, **kwargs):
        seen.update(prompts=prompts, completions=completions, solution=solution, extra=kwargs)
        return [0.25]

    r = TRLReward(spy, columns={"solution": "expected"}, prompt_key="question")
    assert r.name == "spy" and r.info_keys == ("expected", "question")
    out = r(ep("first", "second", expected="red", question="What colour?"))
    assert out.total == 0.25 and out.components == {"spy": 0.25, "applicable": 1.0}
    assert seen == {"prompts": ["What colour?"], "completions": ["first\nsecond"], "solution": ["red"], "extra": {}}
    TRLReward(spy, columns={"solution": "expected"}, prompt_key="question", conversational=True)(
        ep("a", "b", expected=1, question="Q"))
    assert seen["prompts"] == [[{"role": "user", "content": "Q"}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]]
    assert TRLReward(spy)(Episode(1, [], False, True, False)).total == 0.0  # no turns: no call, 0


def infinite(prompts, completions, **kwargs):
    return [math.inf]


def test_none_bool_and_bad_returns():
    assert TRLReward(lambda prompts, completions, **kw: [None], none_as=0.1, name="na")(ep("x")).components == {
        "na": 0.1, "applicable": 0.0}
    assert TRLReward(lambda prompts, completions, **kw: [True], name="b")(ep("x")).total == 1.0
    with pytest.raises(ValueError, match=r"returned \[0.5, 0.5\] for a batch of one completion"):
        TRLReward(lambda prompts, completions, **kw: [0.5, 0.5], name="two")(ep("x"))
    with pytest.raises(ValueError, match=r"returned \['high'\]: expected a float or None"):
        TRLReward(lambda prompts, completions, **kw: ["high"], name="word")(ep("x"))
    with pytest.raises(ValueError, match=r"needs turn.info\['expected'\].*seed 3"):
        TRLReward(answer_block_match, columns={"solution": "expected"})(ep("x"))
    # through the guard, as the core runs it: a function that raises (math.sqrt takes no prompts=) or returns a
    # non-finite value stops the run with the reward's name and the episode seed
    guarded = instantiate_reward(OmegaConf.create({"_target_": "rewards.trl_style.TRLReward",
                                                   "func": "math.sqrt", "name": "sqrt"}))
    with pytest.raises(RewardError, match="'sqrt' on episode seed 3"):
        guarded(ep("x"))
    with pytest.raises(RewardError, match="non-finite"):
        instantiate_reward(OmegaConf.create({"_target_": "rewards.trl_style.TRLReward", "func": "tests.rewards."
                                             "test_trl_style.infinite"}))(ep("x"))


def test_bad_settings_name_the_fix():
    assert resolve_function("rewards.trl_style.answer_block_match") is answer_block_match
    assert resolve_function(math.floor) is math.floor
    with pytest.raises(ValueError, match="reward.func must be an import path 'package.module.name'"):
        TRLReward("answer_block_match")
    with pytest.raises(ValueError, match="module 'no_such_pkg' does not import.*PYTHONPATH"):
        TRLReward("no_such_pkg.f")
    with pytest.raises(ValueError, match="module 'rewards.trl_style' has no 'nope'"):
        TRLReward("rewards.trl_style.nope")
    with pytest.raises(ValueError, match="reward.func 'rewards.trl_style.re' is a module, not a function"):
        TRLReward("rewards.trl_style.re")
    with pytest.raises(ValueError, match=r"may not name \['completions'\]"):
        TRLReward(answer_block_match, columns={"completions": "answer"})
    with pytest.raises(ValueError, match="none_as must be a finite number"):
        TRLReward(answer_block_match, none_as=math.nan)


def test_the_shipped_yaml_scores_shapes_answers():
    r = instantiate_reward(OmegaConf.load(CONF / "reward" / "trl_answer.yaml"))
    assert r.name == "answer_block_match"
    assert r(ep("<answer>red</answer>", expected="red", question="What colour is the circle?")).total == 1.0
    assert r(ep("<answer>blue</answer>", expected="red", question="q")).total == 0.0


def test_trl_functions_weighted_together_from_one_yaml_node():
    node = OmegaConf.create({
        "_target_": "rewards.WeightedSum", "weights": {"answer": 0.75, "said": 0.25},
        "rewards": {"answer": {"_target_": "rewards.trl_style.TRLReward", "func": "rewards.trl_style.answer_block_match",
                               "columns": {"solution": "expected"}},
                    "said": {"_target_": "rewards.trl_style.TRLReward", "func": "tests.rewards.test_trl_style.said"}}})
    r = instantiate_reward(node)
    assert r(ep("<answer>red</answer>", expected="red")).total == 1.0
    assert r(ep("<answer>blue</answer>", expected="red")).total == 0.25
    assert r(ep("", expected="red")).total == 0.0


def said(prompts, completions, **kwargs):
    return [float(bool(c.strip())) for c in completions]
