"""Verifiable reward plug-ins: pure callables ``reward(episode) -> RewardOutput`` with a ``name`` and the
``info_keys`` they read. A new reward is its module here and its conf/reward/<name>.yaml (``_target_:
rewards.<module>.<Class>``), with no list to add it to: ``reward_classes`` reads the modules, and the tests check
docs/adding-a-reward.md's table against them. This summary of the shipped ones is not read by anything:

    MazeExit          maze_exit        1.0 if the agent stopped on the goal (upstream success)
    FormatReward      format           share of turns whose output parsed
    WeightedSum       weighted         weighted sum of named rewards (e.g. 0.8 maze_exit + 0.2 format)
    ShapedDistance    shaped_distance  success, else partial credit for BFS progress to the goal
    ExactAnswer       exact_answer     1.0 if the parsed answer equals the expected one (question-answering envs)
    TRLReward         (the function's) a TRL-style batched reward function (rewards/trl_style.py)
    safe_call / GuardedReward          errors naming the reward and episode seed, or counted zeros
"""

from rewards.answer import ExactAnswer
from rewards.generic import FormatReward, WeightedSum, builtin_rewards, reward_classes
from rewards.guard import (
    FailureCounter,
    GuardedReward,
    RewardError,
    RewardTimeoutError,
    safe_call,
)
from rewards.maze import MazeExit, ShapedDistance

__all__ = [
    "ExactAnswer",
    "FailureCounter",
    "FormatReward",
    "GuardedReward",
    "MazeExit",
    "RewardError",
    "RewardTimeoutError",
    "ShapedDistance",
    "WeightedSum",
    "builtin_rewards",
    "reward_classes",
    "safe_call",
]
