"""Sampling logprobs (engine) == training logprobs (compute_logprobs) on multi-turn, multi-image data."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rlkit.policy import PromptInput, SamplingParams, compute_logprobs, make_engine, sequence_batch
from rlkit.policy.batching import mrope_position_ids
from rlkit.policy.logprobs import tempered_log_probs

from .conftest import maze_image, perturb_lora


@dataclass
class _Traj:  # the fields rlkit.rollout.Trajectory carries
    input_ids: list
    loss_mask: list
    sampling_logprobs: list
    image_inputs: list


def _two_turn_trajectories(policy, sampling, k=3):
    """k episodes: prompt with image -> sample -> turn end -> user turn with a new image -> sample."""
    chat, eng = policy.chat, make_engine(policy)
    trajs = []
    for e in range(k):
        t1 = chat.user_turn("Find the exit." + " Go on." * e, [maze_image(10 + e)], system="You solve mazes.", first=True)
        ids, mask, lps, imgs = list(t1.input_ids), [0] * len(t1.input_ids), [0.0] * len(t1.input_ids), list(t1.image_inputs)
        for turn in range(2):
            c = eng.generate([PromptInput(ids, **chat.concat_images(imgs))], sampling)[0][0]
            ids += c.token_ids
            mask += [1] * len(c.token_ids)
            lps += c.logprobs
            end = chat.turn_end_ids(c.finish_reason)
            ids += end
            mask += [0] * len(end)
            lps += [0.0] * len(end)
            if turn == 0:
                t2 = chat.user_turn(f"You moved. Turn {turn + 2}.", [maze_image(20 + e)], first=False)
                ids += t2.input_ids
                mask += [0] * len(t2.input_ids)
                lps += [0.0] * len(t2.input_ids)
                imgs += t2.image_inputs
        trajs.append(_Traj(ids, mask, lps, imgs))
    return trajs


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=1),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=10, seed=2),
        SamplingParams(temperature=0.0, max_new_tokens=10),
    ],
    ids=["t1", "t0.7-topp-topk", "greedy"],
)
def test_engine_and_training_logprobs_agree(make_policy, sampling):
    policy = make_policy()
    perturb_lora(policy.model, seed=11, scale=0.05)
    trajs = _two_turn_trajectories(policy, sampling)
    assert len({len(t.input_ids) for t in trajs}) > 1  # padded batch
    assert all(len(t.image_inputs) == 2 for t in trajs)
    policy.model.train()  # the update runs in train mode; LoRA dropout 0 keeps it the same function
    logprobs, entropy = policy.logprobs(trajs, temperature=sampling.temperature)  # [N, T]
    assert logprobs.dtype == torch.float32 and logprobs.shape == (3, max(len(t.input_ids) for t in trajs))
    assert logprobs.requires_grad
    worst = 0.0
    for i, t in enumerate(trajs):
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        train = logprobs[i, : len(t.input_ids)][m]
        sample = torch.tensor(t.sampling_logprobs)[m]
        worst = max(worst, (train - sample).abs().max().item())
        assert torch.all(logprobs[i, len(t.input_ids):] == 0) and logprobs[i, 0] == 0
    assert worst <= 1e-4, worst
    assert torch.isfinite(logprobs).all() and torch.isfinite(entropy).all() and (entropy >= 0).all()


def test_entropy_and_mask_semantics(make_policy):
    policy = make_policy()
    tt = policy.chat.user_turn("hello", [maze_image(1)])
    seq = PromptInput(tt.input_ids + policy.chat.completion_ids("left"), **policy.chat.concat_images(tt.image_inputs))
    with torch.no_grad():
        lp, ent = compute_logprobs(policy.model, [seq], 0.8, policy.banned_token_ids)
        b = sequence_batch(policy.model, [seq])
        logits = policy.model(**b.model_inputs()).logits[0]
    banned = torch.zeros(logits.shape[-1], dtype=torch.bool)
    banned[policy.banned_token_ids] = True
    ref = tempered_log_probs(logits, banned, 0.8)  # [T, V]
    t = len(seq.input_ids) - 1
    assert abs(lp[0, t] - ref[t - 1, seq.input_ids[t]]) < 1e-6
    p = ref[t - 1].exp()
    assert abs(ent[0, t] - (-(p[~banned] * ref[t - 1][~banned]).sum())) < 1e-5
    img_pos = [i for i, x in enumerate(seq.input_ids) if x == policy.chat.image_pad_id]
    assert torch.all(lp[0, img_pos] == 0)  # banned targets (prompt-only tokens) get 0, not -inf


def test_padded_positions_equal_unpadded(make_policy):
    policy = make_policy()
    chat = policy.chat
    a = chat.user_turn("short", [maze_image(0)])
    b = chat.user_turn("a much longer message " * 3, [maze_image(1), maze_image(2)], system="sys")
    seqs = [PromptInput(t.input_ids, **chat.concat_images(t.image_inputs)) for t in (a, b)]
    for side in ("left", "right"):
        batch = sequence_batch(policy.model, seqs, padding_side=side)
        for i, s in enumerate(seqs):
            alone = sequence_batch(policy.model, [s])
            real = batch.attention_mask[i].bool()
            assert torch.equal(batch.position_ids[:, i, real], alone.position_ids[:, 0])
    pos, nxt = mrope_position_ids(policy.model, batch.input_ids, batch.attention_mask, batch.image_grid_thw)
    assert nxt.tolist() == [int(pos[:, i].max()) + 1 for i in range(2)]
    # image tokens get 2D positions: the h and w rows differ inside an image
    img = batch.input_ids[0] == chat.image_pad_id
    assert not torch.equal(pos[1, 0, img], pos[2, 0, img])
