"""Fixtures for the core loop tests: a small tiny-Qwen3-VL checkpoint and the VisGym env specs."""

import pytest



@pytest.fixture(scope="session")
def small_ckpt(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture
def policy(small_ckpt):
    from rlkit.policy import load_policy

    return load_policy(name="core_test", path=str(small_ckpt), device="cpu", lora={"rank": 8, "alpha": 16})


@pytest.fixture
def plan_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)


@pytest.fixture
def interactive_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=3)
