"""algorithm.mask_unexecuted: a plan's tokens after the move that hit a wall leave the loss."""

import pytest

from envs.visgym import VisGymMaze
from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams
from rlkit.policy.engine import Completion
from rlkit.rollout import rollout, tokens_from
from rlkit.update import mask_unexecuted

# 7x7 seed 0 (drawn in tests/envs/test_visgym_episode.py): start (5, 1), goal (1, 5), route right right up up
# right right up up. BUMP's 5th move, the third up from (5, 3), runs into the wall at (2, 3).
BUMP = "<answer>right right up up up right stop</answer>"
BUMP_CELLS = "<answer>5,1 right 5,2 right 5,3 up 4,3 up 3,3 up 2,3 right stop</answer>"
GOOD = "<answer>right right up up right right up up stop</answer>"
SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=64, seed=0)  # FixedEngine ignores it but for n


class FixedEngine:
    """Answers every prompt with ``sampling.n`` copies of one text, tokenised by the policy's tokenizer."""

    def __init__(self, texts, tokenizer):
        self.texts, self.tokenizer = list(texts), tokenizer

    def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            text = self.texts.pop(0)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append([Completion(ids, [-1.0] * len(ids), text, "stop", "</answer>") for _ in range(sampling.n)])
        return out


@pytest.mark.parametrize("parser,text,bump_word_end", [("plan", BUMP, "up up up"), ("plan_cells", BUMP_CELLS, "up 3,3 up")])
def test_tokens_after_the_bumping_move_are_masked(policy, parser, text, bump_word_end):
    spec = VisGymMaze(variant="small", mode="plan", parser=parser, max_turns=17, wall_move="fail")
    tok = policy.chat.tokenizer
    trajs = rollout(spec, policy, FixedEngine([text, GOOD], tok), seeds=[0, 0], group_size=2,
                    sampling=SAMPLE, policy_version=0)
    bumped, solved = trajs[0], trajs[2]
    info = bumped.episode.turns[0].info
    assert info["hit_wall"] and info["actions_executed"] == 5 and not bumped.episode.success
    acted = text[: info["unexecuted_from"]]
    assert acted.endswith(bump_word_end)  # the offset falls right after the bumping move's word
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    k = info["unexecuted_tokens"]
    assert 0 < k < len(ids) and tok.decode(ids[: len(ids) - k]) == acted
    assert "unexecuted_from" not in solved.episode.turns[0].info and solved.episode.success
    before = [list(t.loss_mask) for t in trajs]
    assert mask_unexecuted(trajs) == 2 * k  # both samples of the bumped group
    for t, old in zip(trajs, before):
        changed = [i for i, (a, b) in enumerate(zip(old, t.loss_mask)) if a != b]
        if t.episode.success:
            assert changed == []
        else:
            policy_pos = [i for i, m in enumerate(old) if m]
            assert changed == policy_pos[-k:]  # exactly the last k sampled tokens
            kept = [t.input_ids[i] for i in policy_pos[:-k]]
            assert tok.decode(kept) == acted
    assert mask_unexecuted(trajs) == 0  # applied once: a second call masks nothing more


def test_tokens_from_counts_trailing_tokens(policy):
    tok = policy.chat.tokenizer
    text = "<answer>right up stop</answer>"
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    assert tokens_from(tok, ids, 0) == len(ids)
    assert tokens_from(tok, ids, len(text)) == 0
    n = tokens_from(tok, ids, len("<answer>right up"))
    assert tok.decode(ids[len(ids) - n :]) == " stop</answer>"


def test_the_option_is_off_by_default_and_refused_by_skyrl():
    from rlkit.backends.skyrl.compile import _check_unsupported
    from rlkit.config import EvalConfig, SFTConfig, TrainerConfig

    assert AlgorithmConfig().mask_unexecuted is False
    for on, refused in ((False, False), (True, True)):
        problems: list[str] = []
        _check_unsupported(AlgorithmConfig(mask_unexecuted=on), TrainerConfig(), SFTConfig(enabled=False), EvalConfig(),
                           steps=1, group_size=2, problems=problems)
        assert any("mask_unexecuted" in p for p in problems) is refused, problems
