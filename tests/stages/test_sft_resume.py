"""A warm-start build that stops part-way resumes from its last save and ends where an uninterrupted one does."""

import json

import pytest
import torch

import rlkit.stages.sft as sft_mod
from envs.visgym.spec import VisGymMaze
from rlkit.config import SFTConfig
from rlkit.policy import SamplingParams, load_policy, make_engine
from tests.conftest import TEST_DTYPE


def _policy(small_ckpt):
    return load_policy(name="sft_resume_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                       lora={"enabled": False})


PLAN = dict(variant="small", mode="plan", parser="plan", max_turns=17, wall_move="fail")
# recovery demonstrations (sft.recovery_share) need turns; 12 keep most 7x7 ones (those that do not fit are skipped and
# drawn again)
INTERACTIVE = dict(variant="small", mode="interactive", parser="tuple", max_turns=12)


def _build(small_ckpt, cfg, out_dir, env=None, **kw):
    env = VisGymMaze(**(env or PLAN))
    policy = _policy(small_ckpt)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24 if env.mode == "plan" else 8, n=1, seed=0)
    summary = sft_mod.train_sft(env, policy, make_engine(policy), cfg, greedy, out_dir, grounding_tasks=["walls"], **kw)
    return policy, summary


# fresh demonstrations every step; a fixed set in shuffled epochs; fresh ones, half of them recovery demonstrations
# (the generator that draws their mistakes is saved and restored too)
@pytest.mark.parametrize("num_demos,recovery_share", [(0, 0.0), (5, 0.0), (0, 0.5)])
def test_a_stopped_build_resumes_to_the_uninterrupted_builds_weights(small_ckpt, tmp_path, monkeypatch, num_demos,
                                                                      recovery_share):
    monkeypatch.setattr(sft_mod, "PARTIAL_EVERY", 2)
    cfg = SFTConfig(num_demos=num_demos, max_steps=6, batch_size=3, warmup_steps=0, val_tasks=2, eval_every=3,
                    grounding_mix=1, lr_schedule="cosine", target_success=1.0, recovery_share=recovery_share)
    env = INTERACTIVE if recovery_share else PLAN
    whole, whole_summary = _build(small_ckpt, cfg, tmp_path / "whole", env)
    assert not sft_mod.partial_dir(tmp_path / "whole").exists()

    real, calls = sft_mod.demonstration_nll, []

    def dies_at_step_6(policy, batch, shared_prefix=None):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt  # the build is stopped during its 6th step
        return real(policy, batch, shared_prefix=shared_prefix)

    monkeypatch.setattr(sft_mod, "demonstration_nll", dies_at_step_6)
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        _build(small_ckpt, cfg, out, env)
    assert not out.exists()  # nothing half-built where the cache looks
    saved = torch.load(sft_mod.partial_dir(out) / "state.pt", weights_only=False)
    assert saved["step"] == 4  # the last save: every 2 steps and at the check after step 3

    monkeypatch.setattr(sft_mod, "demonstration_nll", real)
    resumed = []
    policy, summary = _build(small_ckpt, cfg, out, env, on_resume=resumed.append)
    assert resumed == [4] and summary["resumed_at"] == [4]
    # (as JSON: a metric two demonstrations never define is NaN, which equals nothing)
    assert summary["steps"] == 6 and json.dumps(summary["history"]) == json.dumps(whole_summary["history"])
    mine, theirs = policy.model.state_dict(), whole.model.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)  # the same weights, bit for bit
    assert json.loads((out / "sft_summary.json").read_text())["resumed_at"] == [4]
    assert not sft_mod.partial_dir(out).exists()  # removed once the stage is saved



def test_a_save_that_cannot_be_read_is_removed_and_the_build_starts_over(small_ckpt, tmp_path, caplog):
    cfg = SFTConfig(num_demos=0, max_steps=2, batch_size=3, warmup_steps=0, val_tasks=2, eval_every=2,
                    grounding_mix=1, target_success=1.0)
    whole, _ = _build(small_ckpt, cfg, tmp_path / "whole")
    out = tmp_path / "stopped"
    sft_mod.partial_dir(out).mkdir(parents=True)
    (sft_mod.partial_dir(out) / "state.pt").write_bytes(b"")  # a save cut short by a lost machine
    resumed = []
    policy, summary = _build(small_ckpt, cfg, out, on_resume=resumed.append)
    assert resumed == [] and "resumed_at" not in summary
    assert "cannot be read (EOFError" in caplog.text and "the build starts over" in caplog.text
    mine, theirs = policy.model.state_dict(), whole.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not sft_mod.partial_dir(out).exists()
