"""rlkit.grounding: encoding, exact-match scoring, and a short run that reads (beats its blind control)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from envs.visgym.spec import VisGymMaze
from rlkit.config import GroundingConfig
from rlkit.grounding import accuracy_table, encode_example, exact_match, format_table, train_grounding


@pytest.fixture
def full_policy(small_ckpt):
    from rlkit.policy import load_policy

    return load_policy(name="grounding_test", path=str(small_ckpt), device="cpu", lora={"enabled": False})


def test_encoded_answer_is_the_loss_masked_span(full_policy):
    ex = VisGymMaze().grounding_example(11, "agent", np.random.default_rng(0))
    item = encode_example(full_policy, ex)
    ids, mask = item.trajectory.input_ids, item.trajectory.loss_mask
    answer_ids = [i for i, m in zip(ids, mask) if m]
    assert full_policy.tokenizer.decode(answer_ids[:-1]) == ex.answer  # the answer, then <|im_end|>
    assert full_policy.tokenizer.convert_ids_to_tokens(answer_ids[-1]) == "<|im_end|>"
    assert len(item.trajectory.image_inputs) == 1 and item.answer_len == len(answer_ids)


def test_exact_match_is_greedy_decoding(full_policy):
    """exact_match (one teacher-forced forward) says True exactly for what greedy generation writes."""
    from rlkit.grounding import GroundingItem
    from rlkit.policy.engine import PromptInput, SamplingParams, make_engine
    from rlkit.rollout import Trajectory
    from rlkit.types import Episode

    env = VisGymMaze()
    rng = np.random.default_rng(3)
    examples = [env.grounding_example(s, t, rng) for s, t in zip(range(20, 28), ["agent", "cell"] * 4)]
    chat = full_policy.chat
    turns = [chat.user_turn(ex.question, [ex.image], system=None, first=True) for ex in examples]
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=6, n=1, seed=0)
    outs = make_engine(full_policy).generate(
        [PromptInput(input_ids=t.input_ids, **chat.concat_images(t.image_inputs)) for t in turns], greedy)

    def item(turn, answer_ids):
        ids = list(turn.input_ids) + list(answer_ids)
        mask = [0] * len(turn.input_ids) + [1] * len(answer_ids)
        ep = Episode(seed=0, turns=[], terminated=True, truncated=False, success=True)
        return GroundingItem(Trajectory(ids, mask, [0.0] * len(ids), list(turn.image_inputs), ep, 0, -1),
                             "agent", False, len(answer_ids))

    sampled = [out[0].token_ids for out in outs]
    assert all(exact_match(full_policy, [item(t, a) for t, a in zip(turns, sampled)]))
    vocab = full_policy.tokenizer
    other = vocab.convert_tokens_to_ids("a")
    changed = [[a[0] + 1 if a[0] + 1 != other else a[0] + 2] + a[1:] for a in sampled]  # first token not the argmax
    assert not any(exact_match(full_policy, [item(t, a) for t, a in zip(turns, changed)]))
    last_changed = [a[:-1] + [a[-1] + 1] for a in sampled]  # only the last token wrong
    assert not any(exact_match(full_policy, [item(t, a) for t, a in zip(turns, last_changed)]))


def test_accuracy_table_groups_tasks_and_wall_bits():
    class It:
        def __init__(self, task, wall_bit):
            self.task, self.wall_bit = task, wall_bit

    items = [It("cell", True), It("cell", False), It("agent", False), It("cell", True)]
    table = accuracy_table(items, [True, False, True, False])
    assert table == {"agent": 1.0, "all": 0.5, "cell": pytest.approx(1 / 3), "wall_bits": 0.5}
    assert "wall_bits" in format_table({"image": table, "blind": table})


def test_unknown_task_is_refused(full_policy):
    with pytest.raises(ValueError, match="unknown"):
        train_grounding(VisGymMaze(), full_policy, GroundingConfig(curriculum=[["agent"], ["colour"]], max_steps=1))


GROUNDING_SIZES = dict(text_hidden=96, text_layers=2, text_heads=3, text_kv_heads=1, head_dim=32,
                       text_intermediate=256, vision_hidden=32, vision_depth=1, vision_heads=1,
                       vision_intermediate=64, deepstack_indexes=[0])


def test_short_grounding_run_reads_the_image(tmp_path):
    """Where is the blue dot? Trained on real images the policy answers held-out mazes; its blind
    control (same model, steps and questions, one fixed image) can only guess among ~40 free cells."""
    from rlkit.policy import load_policy

    cfg = GroundingConfig(curriculum=[["agent"]], max_steps=STEPS, batch_size=16, lr=3e-3, eval_every=STEPS,
                          val_questions=64, target_accuracy=2.0)
    results = {}
    for arm in ("image", "blind"):
        torch.manual_seed(0)
        policy = load_policy(tiny=GROUNDING_SIZES, lora={"enabled": False}, cache_dir=str(tmp_path), seed=0)
        results[arm] = train_grounding(VisGymMaze(), policy, cfg, out_dir=tmp_path / arm if arm == "image" else None,
                                       blind=(arm == "blind"))
    image, blind = results["image"]["final"]["agent"], results["blind"]["final"]["agent"]
    assert blind <= 0.1, results["blind"]
    assert image >= blind + 0.3, (image, blind)
    saved = json.loads((tmp_path / "image" / "grounding_summary.json").read_text())
    assert saved["final"]["agent"] == image and (tmp_path / "image" / "config.json").is_file()


STEPS = 100
