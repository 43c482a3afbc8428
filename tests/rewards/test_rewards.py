"""Reward plug-ins on hand-made episodes and the guard (every conf/reward/*.yaml: test_reward_configs.py)."""

import math
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rewards import (
    ExactAnswer,
    FailureCounter,
    FormatReward,
    GuardedReward,
    MazeExit,
    RewardError,
    RewardTimeoutError,
    ShapedDistance,
    WeightedSum,
    safe_call,
)
from rlkit.run import instantiate_reward
from rlkit.types import Episode, RewardOutput, Turn

CONF_REWARD = Path(__file__).resolve().parents[2] / "conf" / "reward"


def turn(parse_ok=True, bfs=3, start=12, done=False, reward=0.0, answer=None):
    # the keys of both kinds of env: a maze's distances (envs.visgym) and a question's answers (envs.shapes)
    info = {"parse_ok": parse_ok, "bfs_distance": bfs, "start_bfs_distance": start, "answer": answer, "expected": "red"}
    return Turn(action_text="x", env_reward=reward, done=done, info=info)


def episode(turns, success=False, seed=7):
    terminated = bool(turns and turns[-1].done)
    return Episode(seed=seed, turns=turns, terminated=terminated, truncated=not terminated, success=success)


SOLVED = episode([turn(bfs=1), turn(bfs=0), turn(bfs=0, done=True, reward=1.0, answer="red")], success=True)
HALFWAY = episode([turn(False, bfs=12), turn(True, bfs=6), turn(False, bfs=6), turn(True, bfs=6, answer="blue")])
EMPTY = episode([])


def test_maze_exit():
    r = MazeExit()
    assert r.name == "maze_exit"
    assert r(SOLVED) == RewardOutput(1.0, {"maze_exit": 1.0})
    assert r(HALFWAY).total == 0.0 and r(EMPTY).total == 0.0


def test_format():
    r = FormatReward()
    assert r.name == "format"
    assert r(SOLVED).total == 1.0
    assert r(HALFWAY).total == 0.5 and r(HALFWAY).components == {"format": 0.5}
    assert r(EMPTY).total == 0.0
    bad = episode([Turn("x", 0.0, False, info={})])
    with pytest.raises(ValueError, match="parse_ok.*seed 7"):
        r(bad)


def test_exact_answer():
    r = ExactAnswer()
    assert r.name == "exact_answer"
    assert r(SOLVED) == RewardOutput(1.0, {"exact_answer": 1.0})  # last turn: "red" == "red"
    assert r(HALFWAY).total == 0.0  # "blue" != "red"
    assert r(episode([turn(answer=None)])).total == 0.0  # nothing parsed: never equal, even to a None expected
    assert r(episode([Turn("x", 0.0, True, info={"answer": None, "expected": None})])).total == 0.0
    assert r(episode([Turn("x", 0.0, True, info={"answer": "Red", "expected": "red"})])).total == 0.0  # exact
    assert r(EMPTY).total == 0.0
    with pytest.raises(ValueError, match="'expected'.*seed 7"):
        r(episode([Turn("x", 0.0, True, info={"answer": "red"})]))
    assert WeightedSum({"exact_answer": 0.8, "format": 0.2})(HALFWAY).total == pytest.approx(0.2 * 0.5)


def test_shaped_distance():
    r = ShapedDistance(partial_credit=0.5)
    assert r.name == "shaped_distance"
    assert r(SOLVED).total == 1.0
    out = r(HALFWAY)  # 12 -> 6: half the way
    assert out.total == pytest.approx(0.25) and out.components["progress"] == pytest.approx(0.5)
    assert out.components["bfs_distance"] == 6
    worse = episode([turn(bfs=14, start=12)])
    assert r(worse).total == 0.0
    assert r(EMPTY).total == 0.0
    with pytest.raises(ValueError, match="bfs_distance"):
        r(episode([Turn("x", 0.0, False, info={"parse_ok": True})]))
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ValueError, match="partial_credit"):
            ShapedDistance(partial_credit=bad)


def test_weighted_sum():
    r = WeightedSum({"maze_exit": 0.8, "format": 0.2})
    assert r.name == "weighted"
    out = r(HALFWAY)
    assert out.total == pytest.approx(0.1)
    assert out.components == {"maze_exit": 0.0, "format": 0.5, "weighted": pytest.approx(0.1)}
    assert r(SOLVED).total == pytest.approx(1.0)
    # explicit instances, nested components reported as name/component
    r2 = WeightedSum({"shaped_distance": 1.0, "format": 0.5}, rewards={"shaped_distance": ShapedDistance(0.2)})
    out2 = r2(HALFWAY)
    assert out2.total == pytest.approx(0.2 * 0.5 + 0.5 * 0.5)
    assert out2.components["shaped_distance/progress"] == pytest.approx(0.5)
    assert "shaped_distance/shaped_distance" not in out2.components
    with pytest.raises(ValueError, match="unknown reward 'exit'"):
        WeightedSum({"exit": 1.0})
    with pytest.raises(ValueError, match="no weight"):
        WeightedSum({"format": 1.0}, rewards={"maze_exit": MazeExit()})
    with pytest.raises(ValueError, match="finite"):
        WeightedSum({"format": math.nan})
    with pytest.raises(ValueError, match="at least one"):
        WeightedSum({})


class Boom:
    name = "boom"

    def __call__(self, episode):
        raise KeyError("missing")


class Slow:
    name = "slow"

    def __call__(self, episode):
        time.sleep(0.05)
        return RewardOutput(1.0)


def test_safe_call_errors_name_reward_and_seed():
    assert safe_call(MazeExit(), SOLVED).total == 1.0
    with pytest.raises(RewardError, match="reward 'boom' on episode seed 7 raised KeyError") as exc:
        safe_call(Boom(), SOLVED)
    assert isinstance(exc.value.__cause__, KeyError)
    with pytest.raises(RewardTimeoutError, match="'slow' on episode seed 7 did not return within its limit of 0.001 s"):
        safe_call(Slow(), SOLVED, timeout_s=0.001)
    assert safe_call(Slow(), SOLVED, timeout_s=10).total == 1.0
    with pytest.raises(RewardError, match="non-finite"):
        safe_call(lambda e: RewardOutput(math.inf), SOLVED)
    with pytest.raises(RewardError, match="expected RewardOutput"):
        safe_call(lambda e: 1.0, SOLVED)
    with pytest.raises(ValueError, match="on_error"):
        safe_call(MazeExit(), SOLVED, on_error="ignore")
    with pytest.raises(ValueError, match="timeout_s"):
        safe_call(MazeExit(), SOLVED, timeout_s=0)


def test_safe_call_zero_counts_failures_thread_safely():
    failures = FailureCounter()
    out = safe_call(Boom(), SOLVED, on_error="zero", failures=failures)
    assert out.total == 0.0 and failures.count == 1 and "boom" in failures.last_error
    guarded = GuardedReward(Boom(), on_error="zero")
    assert guarded.name == "boom"
    threads = [threading.Thread(target=lambda: [guarded(SOLVED) for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert guarded.failures.count == 200
    assert GuardedReward(MazeExit())(SOLVED).total == 1.0
    with pytest.raises(RewardError):
        GuardedReward(Boom())(SOLVED)


def test_expected_reward_configs():
    assert {p.stem for p in CONF_REWARD.glob("*.yaml")} >= {"maze_exit", "maze_exit_format", "shaped", "exact_answer"}
    weighted = instantiate_reward(OmegaConf.load(CONF_REWARD / "maze_exit_format.yaml"))
    assert weighted(HALFWAY).total == pytest.approx(0.2 * 0.5)
