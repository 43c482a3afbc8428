"""sft.route_mix: route questions on text join every warm-start batch, the loss on the route after the notes only."""

import re

import pytest

import rlkit.sft as sft_mod
from envs.visgym.spec import VisGymMaze
from rlkit.config import SFTConfig
from rlkit.policy import SamplingParams, make_engine


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64, n=1, seed=0)


def test_each_batch_gets_route_questions_with_the_loss_on_the_route_only(full_policy, nll_batches, tmp_path):
    env = VisGymMaze(variant="small", mode="plan", parser="plan_map", max_turns=17, wall_move="fail")
    batches = nll_batches
    cfg = SFTConfig(num_demos=0, max_steps=2, batch_size=3, warmup_steps=0, val_tasks=2, eval_every=100, route_mix=2)
    sft_mod.train_sft(env, full_policy, make_engine(full_policy), cfg, GREEDY, tmp_path / "out")
    tok, chat = full_policy.tokenizer, full_policy.chat
    # each step: its 3 demonstrations in one forward, its 2 route questions in another (sft.batch_nll)
    assert [len(b) for b in batches] == [3, 2, 3, 2]
    batches = [batches[0] + batches[1], batches[2] + batches[3]]
    for batch in batches:
        assert all(t.image_inputs for t in batch[:3]) and not any(t.image_inputs for t in batch[3:])  # routes: text alone
        for t in batch[3:]:
            text = tok.decode(t.input_ids)
            assert "<|image_pad|>" not in text and env.make().system_prompt.split(".")[0] in text
            learned = tok.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m])
            # the loss is on the route and the end of the turn; the notes before it (walls, both ends) are context
            assert learned.startswith("<answer>") and learned.endswith("stop</answer><|im_end|>"), learned
            notes = tok.decode(t.input_ids[: t.loss_mask.index(1)]).rsplit("assistant\n", 1)[1]
            assert re.fullmatch(r"(?:[a-l][#.]){12} [1-5],[1-5] to [1-5],[1-5]", notes), notes  # context, not learned
    # a fresh maze each question, each step
    notes = [tok.decode(t.input_ids) for b in batches for t in b[3:]]
    assert len(set(notes)) == 4


def test_route_mix_is_refused_with_the_fix_where_there_are_no_notes(full_policy, tmp_path):
    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    with pytest.raises(ValueError, match="env.parser=plan_map"):
        sft_mod.train_sft(env, full_policy, make_engine(full_policy), SFTConfig(route_mix=4), GREEDY, tmp_path)

    class NoRoutes:  # an env without route_example
        is_eval_seed = staticmethod(lambda seed: False)

    with pytest.raises(ValueError, match="route_example .this one: NoRoutes"):
        sft_mod.train_sft(NoRoutes(), full_policy, make_engine(full_policy), SFTConfig(route_mix=4), GREEDY, tmp_path)


def test_batch_nll_is_the_token_mean_of_one_forward_over_all_parts(full_policy):
    """Two forwards, one loss: the parts' NLLs weighted by their demonstrated tokens are the mean over every token,
    as one forward over the whole batch gives it (here without the shared prefix, which the parts would not share)."""
    import numpy as np
    import torch

    env = VisGymMaze(variant="small", mode="plan", parser="plan_map", max_turns=17, wall_move="fail")
    demos = sft_mod.demonstration_trajectories(env, full_policy, [5, 6, 7])
    prompt, rng = sft_mod.route_prompt(env, full_policy), np.random.default_rng(0)
    routes = [sft_mod.encode_route_example(full_policy, prompt, env.route_example(rng)) for _ in range(4)]
    with torch.no_grad():
        whole = sft_mod.demonstration_nll(full_policy, demos + routes, shared_prefix=False)
        parts = sft_mod.batch_nll(full_policy, [demos, routes], shared_prefix=False)
        alone = sft_mod.demonstration_nll(full_policy, routes, shared_prefix=False)
    assert abs(whole.item() - parts.item()) < 2e-3 * whole.item() and abs(parts.item() - alone.item()) > 1e-2
    assert sft_mod.batch_nll(full_policy, [[], routes], shared_prefix=False).item() == pytest.approx(alone.item())
    with pytest.raises(ValueError):
        sft_mod.batch_nll(full_policy, [[], []])
