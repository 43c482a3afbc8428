"""Rewards on real VisGym maze episodes (the env's info feeds format and shaped rewards)."""

import pytest

from envs.visgym import VisGymMaze
from rewards import FormatReward, MazeExit, ShapedDistance, WeightedSum
from rlkit.types import Episode, Turn


def _episode(spec, seed, texts):
    env = spec.make()
    env.reset(seed)
    turns = []
    for text in texts[: spec.max_turns]:
        out = env.step(text)
        turns.append(Turn(text, out.reward, out.done, out.info))
        if out.done:
            break
    done = bool(turns and turns[-1].done)
    return Episode(seed, turns, terminated=done, truncated=not done, success=env.success())


def test_rewards_on_solver_and_broken_episodes():
    spec = VisGymMaze(mode="interactive", parser="tuple", max_turns=18)
    demo = spec.demonstration(0)  # 12 moves + stop
    solved = _episode(spec, 0, ["garbage"] + demo)
    assert MazeExit()(solved).total == 1.0
    assert FormatReward()(solved).total == 13 / 14
    assert ShapedDistance()(solved).total == 1.0
    half = _episode(spec, 0, demo[:6] + ["('stop', 'stop')"])
    assert MazeExit()(half).total == 0.0
    assert ShapedDistance(0.5)(half).total == pytest.approx(0.25)  # 6 of 12 moves done
    w = WeightedSum({"maze_exit": 0.8, "format": 0.2})
    assert w(half).total == pytest.approx(0.2) and w(solved).total == pytest.approx(0.8 + 0.2 * 13 / 14)


def test_plan_mode_rewards():
    spec = VisGymMaze(mode="plan", parser="plan", max_turns=18)
    ok = _episode(spec, 3, spec.demonstration(3))
    bad = _episode(spec, 3, ["I cannot see the maze"])
    assert MazeExit()(ok).total == 1.0 and FormatReward()(ok).total == 1.0
    assert MazeExit()(bad).total == 0.0 and FormatReward()(bad).total == 0.0
    assert ShapedDistance()(bad).total == 0.0
