"""The warmup + constant/cosine lr multiplier shared by the GRPO update and the SFT warm start."""

import math

import pytest

from rlkit.algorithms.schedules import warmup_schedule
from tests.conftest import TEST_DTYPE


def test_constant_after_a_linear_warmup():
    f = warmup_schedule("constant", 4, 100)
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(500) == 1.0


def test_cosine_reaches_half_at_the_midpoint_and_zero_at_total_steps():
    f = warmup_schedule("cosine", 10, 110)
    assert f(9) == 1.0  # last warmup step
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.5)
    assert f(35) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert f(110) == pytest.approx(0.0, abs=1e-12)
    assert f(200) == pytest.approx(0.0, abs=1e-12)  # stays at 0 past the end


def test_unknown_schedule_names_the_key():
    with pytest.raises(ValueError, match=r"sft\.lr_schedule='linear'.*constant or cosine"):
        warmup_schedule("linear", 0, 10, "sft.lr_schedule")


def test_the_warm_start_decays_its_lr_on_sft_lr_schedule_cosine(small_ckpt, tmp_path):
    """train_sft steps its optimizer on the schedule: the lr of each step, logged in the stage's history."""
    from envs.visgym.spec import VisGymMaze
    from rlkit.config import SFTConfig
    from rlkit.policy import SamplingParams, load_policy, make_engine
    from rlkit.stages.sft import train_sft

    policy = load_policy(name="sft_cosine_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                         lora={"enabled": False})
    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, n=1, seed=0)
    cfg = SFTConfig(num_demos=0, max_steps=5, batch_size=2, lr=1e-3, warmup_steps=1, lr_schedule="cosine",
                    val_tasks=1, eval_every=1, target_success=1.1)
    summary = train_sft(env, policy, make_engine(policy), cfg, greedy, tmp_path / "out")
    lrs = [h["lr"] for h in summary["history"]]
    # step 0 warms up; steps 1-4 follow the half cosine that reaches 0 after the last step (step 5 = max_steps)
    assert lrs == pytest.approx([1e-3] + [1e-3 * 0.5 * (1 + math.cos(math.pi * (k - 1) / 4)) for k in range(1, 5)])
    assert summary["steps"] == 5 and lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 3 / 4)))
