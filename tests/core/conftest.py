"""Fixtures for the core loop tests: a small tiny-Qwen3-VL checkpoint and the VisGym env specs."""

import pytest
import torch

SMALL = dict(text_hidden=64, text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, text_intermediate=128,
             vision_hidden=32, vision_depth=2, vision_heads=1, vision_intermediate=64, deepstack_indexes=[1])


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory):
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("core_tiny") / "ckpt", TinyVLSizes(**SMALL), seed=0)


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
