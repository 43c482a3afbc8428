"""sft.grounding_mix: grounding questions join every warm-start batch, on training mazes only."""

import re

import pytest

import rlkit.stages.sft as sft_mod
from envs.visgym.spec import VisGymMaze
from rlkit.config import SFTConfig
from rlkit.policy import SamplingParams, make_engine


def test_each_batch_gets_its_grounding_questions(full_policy, nll_batches, tmp_path):
    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17, wall_move="fail")
    batches = nll_batches
    cfg = SFTConfig(num_demos=0, max_steps=2, batch_size=3, warmup_steps=0, val_tasks=2, eval_every=100,
                    grounding_mix=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, n=1, seed=0)
    sft_mod.train_sft(env, full_policy, make_engine(full_policy), cfg, greedy, tmp_path / "out",
                      grounding_tasks=["walls"])
    assert len(batches) == 2
    tok = full_policy.tokenizer
    for batch in batches:
        assert len(batch) == 5  # 3 demonstrations + 2 grounding questions
        answers = [tok.decode([i for i, m in zip(t.input_ids, t.loss_mask) if m][:-1]) for t in batch]
        assert all(a.startswith("<answer>") for a in answers[:3]), answers
        assert all(re.fullmatch(r"(?:[a-l][#.]){12}", a) for a in answers[3:]), answers  # 7x7: 12 wall bits
        assert not any(env.is_eval_seed(t.episode.seed) for t in batch)  # never an evaluation maze
    assert batches[0][3].episode.seed != batches[1][3].episode.seed  # fresh mazes every step


def test_grounding_mix_without_questions_is_refused_with_the_fix(full_policy, tmp_path):
    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, n=1, seed=0)
    with pytest.raises(ValueError, match="sft.grounding_mix=0"):
        sft_mod.train_sft(env, full_policy, make_engine(full_policy), SFTConfig(grounding_mix=4), greedy, tmp_path)

    class NoQuestions:  # an env without grounding_example
        is_eval_seed = staticmethod(lambda seed: False)

    with pytest.raises(ValueError, match="grounding_example .this one: NoQuestions"):
        sft_mod.train_sft(NoQuestions(), full_policy, make_engine(full_policy), SFTConfig(grounding_mix=4), greedy,
                          tmp_path, grounding_tasks=["walls"])
