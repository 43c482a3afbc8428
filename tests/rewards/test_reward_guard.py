"""The reward guard enforces its time limit: a hung reward is abandoned, not waited for."""

import logging
import math
import threading
import time

import pytest
from omegaconf import OmegaConf

from rlkit.reward_guard import GuardedReward, RewardError, RewardTimeoutError, safe_call
from rlkit.run import ConfigError, instantiate_reward
from rlkit.types import Episode, RewardOutput

EP = Episode(seed=41, turns=[], terminated=True, truncated=False, success=True)
RELEASE = threading.Event()  # set at the end so the abandoned threads finish


class Hang:
    name = "hang"

    def __init__(self, hang_every=1):
        self.calls, self.hang_every = 0, hang_every

    def __call__(self, episode):
        self.calls += 1
        if self.calls % self.hang_every == 0:
            RELEASE.wait(600)  # a reward stuck on I/O or a lock
        return RewardOutput(1.0)


class Spin:
    name = "spin"

    def __call__(self, episode):
        while not RELEASE.is_set():  # a pure-Python infinite loop
            pass
        return RewardOutput(1.0)


@pytest.fixture(autouse=True, scope="module")
def _release():
    yield
    RELEASE.set()


@pytest.mark.parametrize("fn", [Hang(), Spin()], ids=["blocked", "spinning"])
def test_hung_reward_is_abandoned_with_a_clear_error(fn):
    t0 = time.perf_counter()
    with pytest.raises(RewardTimeoutError, match=rf"reward '{fn.name}' on episode seed 41 did not return within its "
                       r"limit of 0.3 s and was abandoned; fix the reward, or set reward.on_error=zero.*timeout_s"):
        GuardedReward(fn, timeout_s=0.3)(EP)
    assert time.perf_counter() - t0 < 3.0


def test_on_error_zero_counts_logs_and_goes_on(caplog):
    guarded = GuardedReward(Hang(hang_every=2), timeout_s=0.2, on_error="zero")
    with caplog.at_level(logging.WARNING, logger="rlkit.reward"):
        totals = [guarded(EP).total for _ in range(4)]  # calls 2 and 4 hang
    assert totals == [1.0, 0.0, 1.0, 0.0]  # a fresh worker after each abandoned call
    assert guarded.failures.count == 2 and "seed 41" in guarded.failures.last_error
    assert sum("counted as reward 0" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("bad", [None, "1.0", float("nan"), RewardOutput(math.inf), RewardOutput("x"), object()])
def test_garbage_is_an_error_naming_the_reward(bad):
    fn = lambda e: bad  # noqa: E731
    with pytest.raises(RewardError, match="reward '<lambda>' on episode seed 41 returned .*; fix the reward"):
        safe_call(fn, EP, timeout_s=5)
    assert safe_call(fn, EP, timeout_s=5, on_error="zero").total == 0.0


def test_guard_keys_come_from_the_reward_config():
    node = OmegaConf.create({"_target_": "rewards.MazeExit", "timeout_s": 2.5, "on_error": "zero"})
    fn = instantiate_reward(node)
    assert (fn.name, fn.timeout_s, fn.on_error) == ("maze_exit", 2.5, "zero")
    assert instantiate_reward(OmegaConf.create({"_target_": "rewards.MazeExit"})).timeout_s == 60  # the default
    for bad, match in [({"timeout_s": 0}, "timeout_s must be"), ({"timeout_s": "x"}, "timeout_s must be"),
                       ({"on_error": "ignore"}, "on_error must be")]:
        with pytest.raises(ConfigError, match=match):
            instantiate_reward(OmegaConf.create({"_target_": "rewards.MazeExit", **bad}))
