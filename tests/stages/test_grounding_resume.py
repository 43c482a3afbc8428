"""A grounding build that stops part-way resumes from its last save and ends where an uninterrupted one does."""

import json

import pytest
import torch

import rlkit.stages.grounding as grounding_mod
from envs.visgym.spec import VisGymMaze
from rlkit.config import GroundingConfig
from rlkit.policy import load_policy
from rlkit.stages.cache import partial_dir
from tests.conftest import TEST_DTYPE

# two tasks drawn at random (the question draws' generator is part of the saved state); warmup spans the stop,
# so the lr schedule's state counts too
CFG = GroundingConfig(tasks=["agent", "walls"], target_accuracy=1.0, max_steps=6, batch_size=2, lr=1e-3,
                      warmup_steps=5, val_questions=4, eval_every=3)


def _build(small_ckpt, out_dir, **kw):
    policy = load_policy(name="grounding_resume_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                         lora={"enabled": False})
    return policy, grounding_mod.train_grounding(VisGymMaze(), policy, CFG, out_dir=out_dir, **kw)


def test_a_stopped_grounding_build_resumes_to_the_uninterrupted_builds_weights(small_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(grounding_mod, "PARTIAL_EVERY", 2)
    whole, whole_summary = _build(small_ckpt, tmp_path / "whole")
    assert whole_summary["tasks"] == ["agent", "walls"] and not partial_dir(tmp_path / "whole").exists()

    real, calls = grounding_mod.draw_examples, []

    def dies_at_step_6(*args, **kwargs):
        calls.append(1)
        if len(calls) == 7:  # the held-out questions, then one draw a step: stopped while drawing step 6
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(grounding_mod, "draw_examples", dies_at_step_6)
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        _build(small_ckpt, out)
    assert not out.exists()  # nothing half-built where the cache looks
    saved = torch.load(partial_dir(out) / "state.pt", weights_only=False)
    assert saved["step"] == 4 and len(saved["history"]) == 1  # saves every 2 steps; the check after step 3 in it

    monkeypatch.setattr(grounding_mod, "draw_examples", real)
    resumed = []
    policy, summary = _build(small_ckpt, out, on_resume=resumed.append)
    assert resumed == [4] and summary["resumed_at"] == [4]
    assert summary["steps"] == 6 and summary["tasks"] == ["agent", "walls"]
    assert summary["history"] == [{**h, "wall_time_s": summary["history"][i]["wall_time_s"]}
                                  for i, h in enumerate(whole_summary["history"])]
    mine, theirs = policy.model.state_dict(), whole.model.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)  # the same weights, bit for bit
    assert json.loads((out / "grounding_summary.json").read_text())["resumed_at"] == [4]
    assert not partial_dir(out).exists()  # removed once the stage is saved


def test_an_unreadable_grounding_save_is_removed_and_the_build_starts_over(small_ckpt, tmp_path, caplog):
    out = tmp_path / "stopped"
    partial_dir(out).mkdir(parents=True)
    torch.save({"step": 3}, partial_dir(out) / "state.pt")  # another version's fields
    resumed = []
    _, summary = _build(small_ckpt, out, on_resume=resumed.append)
    assert resumed == [] and "resumed_at" not in summary and summary["steps"] == 6
    assert "grounding: the saved progress" in caplog.text and "no model, optimizer" in caplog.text
    assert not partial_dir(out).exists()


def test_the_blind_control_saves_no_progress(small_ckpt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    policy = load_policy(name="grounding_resume_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                         lora={"enabled": False})
    grounding_mod.train_grounding(VisGymMaze(), policy, GroundingConfig(**{**CFG.__dict__, "max_steps": 2}),
                                  blind=True)
    assert list(tmp_path.iterdir()) == []
