"""Fixtures for the core loop tests: a small tiny-Qwen3-VL checkpoint and the VisGym env specs."""

import pytest
from tests.conftest import TEST_DTYPE



@pytest.fixture(scope="session")
def small_ckpt(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture
def policy(small_ckpt):
    from rlkit.policy import load_policy

    return load_policy(name="core_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                       lora={"rank": 8, "alpha": 16})


@pytest.fixture
def full_policy(small_ckpt):
    """The small checkpoint with every weight trainable, as the one-time builds (grounding, warm start) train it."""
    from rlkit.policy import load_policy

    return load_policy(name="full_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE, lora={"enabled": False})


@pytest.fixture
def nll_batches(monkeypatch):
    """The list of every batch ``rlkit.sft.demonstration_nll`` is called with from here on, in order (the calls
    still compute their loss)."""
    import rlkit.sft as sft_mod

    batches, real = [], sft_mod.demonstration_nll

    def spy(policy, demonstrations, shared_prefix=None):
        batches.append(list(demonstrations))
        return real(policy, demonstrations, shared_prefix=shared_prefix)

    monkeypatch.setattr(sft_mod, "demonstration_nll", spy)
    return batches


@pytest.fixture
def plan_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)


@pytest.fixture
def interactive_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=3)
