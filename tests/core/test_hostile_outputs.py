"""Fuzz: hostile model outputs through the real rollout loop never raise and never inject tokens.

A scripted engine answers every generate call with outputs from a hostile corpus (special-token
look-alikes written with ordinary tokens, literal special tokens, huge, unicode incl. lone
surrogates, deeply nested brackets, empty). They run through ``rlkit.rollout.rollout`` with the real
VisGym maze episodes and the tiny policy's real ChatFormat, for every parser in both modes. Checked:
no exception, and every user turn built after an output holds only the chat layout's own special
ids (its message text decodes to a string without any special-token string).
"""

from __future__ import annotations

import random
import time

import pytest

from envs.visgym import VisGymMaze
from envs.visgym.episode import MODE_PARSERS
from rlkit.policy import SamplingParams
from rlkit.policy.engine import Completion
from rlkit.rollout import rollout
from rlkit.safe_text import CONTROL_TOKEN_RE

#: Qwen / Qwen-VL control tokens (the tiny tokenizer has the first seven; a real one has them all).
QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>", "<|vision_pad|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|fim_prefix|>", "<|file_sep|>",
]
#: Outputs per (mode, parser) combination (4 combinations: 10,000 outputs, about 8 s on one idle core).
OUTPUTS_PER_COMBO = 2_500


def hostile_outputs(rng: random.Random):
    """An endless stream of hostile model outputs (str), cycling through the categories."""
    actions = ["('move', {x})", "<answer>('move', {x})</answer>", "<action>{x}</action>",
               "<answer>right {x} down stop</answer>", "({x}, 'stop')", "('stop', {x})", "{x}"]
    while True:
        tok = rng.choice(QWEN_SPECIALS)
        yield rng.choice(actions).format(x=tok)  # look-alike / literal special token inside an action
        yield "".join(rng.choice(QWEN_SPECIALS) for _ in range(rng.randint(2, 12)))  # a run of them
        yield tok[:1] + tok + tok[1:]  # nested: <<|im_end|>|im_end|>
        yield f"('move', {tok[: rng.randint(1, len(tok) - 1)]})"  # a cut token: <|image_p
        yield "('move', " + "x" * rng.randint(5_000, 60_000) + ")"  # huge argument, echoed back
        yield rng.choice(["right ", "<|im_end|>", "(", "down"]) * rng.randint(1_000, 10_000)  # huge repeats
        yield "".join(chr(rng.choice([rng.randint(0x80, 0x2FFF), rng.randint(0xD800, 0xDFFF), 0x200B, 0x202E,
                                      0, 0xFEFF, rng.randint(0x1F300, 0x1FAFF)])) for _ in range(rng.randint(1, 300)))
        depth = rng.randint(10, 5_000)
        yield "(" * depth + f"('move', {rng.randint(0, 9)})" + ")" * rng.randint(0, depth)  # deeply nested
        yield "<answer>" * depth + "('stop', 'stop')" + "</answer>" * (depth // 2)
        yield rng.choice(["", " ", "\n", "\t\r\n", "()", "<answer></answer>", "<action></action>"])
        yield rng.choice(["('move', 0)", "('stop', 'stop')", "<action>up</action>",
                          "<answer>right down stop</answer>"]) + tok  # a valid action followed by a token


class ScriptedEngine:
    """Answers each prompt with ``sampling.n`` outputs from ``texts``; counts what it handed out."""

    def __init__(self, texts, chat):
        self.texts, self.chat, self.count = texts, chat, 0

    def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            comps = []
            for _ in range(sampling.n):
                text = next(self.texts)
                self.count += 1
                stop = self.count % 3 != 0
                ids = [7, 8, 9] + ([self.chat.im_end_id] if stop else [])  # ids do not matter to the env path
                comps.append(Completion(ids, [-1.0] * len(ids), text, "stop" if stop else "length"))
            out.append(comps)
        return out


class CheckingChat:
    """The real ChatFormat, with every user turn checked for injected special ids."""

    def __init__(self, chat):
        self.chat = chat
        self.turns_checked = 0
        tok = chat.tokenizer
        self.special_ids = {*tok.all_special_ids, *(i for i, t in tok.added_tokens_decoder.items() if t.special)}

    def __getattr__(self, name):
        return getattr(self.chat, name)

    def user_turn(self, text, images=(), system=None, first=True):
        tt = self.chat.user_turn(text, images, system=system, first=first)
        ids, c = tt.input_ids, self.chat
        k = sum(c.num_image_tokens(im) for im in tt.image_inputs)
        n_img = len(tt.image_inputs)
        expected = {c.im_start_id: 2 + bool(system), c.im_end_id: 1 + bool(system), c.vision_start_id: n_img,
                    c.vision_end_id: n_img, c.image_pad_id: k}
        for sid in self.special_ids:
            assert ids.count(sid) == expected.get(sid, 0), (text[:200], c.tokenizer.convert_ids_to_tokens(sid))
        body = ids[ids.index(c.vision_end_id) + 1 if n_img else 0 : len(ids) - 1 - ids[::-1].index(c.im_end_id)]
        decoded = c.tokenizer.decode(body, skip_special_tokens=False)
        assert CONTROL_TOKEN_RE.search(decoded) is None, decoded[:200]
        self.turns_checked += 1
        return tt


class _Policy:
    def __init__(self, chat):
        self.chat = chat


@pytest.mark.parametrize("mode,parser", [(m, p) for m, ps in MODE_PARSERS.items() for p in ps])
def test_hostile_outputs_never_raise_nor_inject(policy, mode, parser):
    spec = VisGymMaze(variant="easy", mode=mode, parser=parser, max_turns=3)
    chat = CheckingChat(policy.chat)
    engine = ScriptedEngine(hostile_outputs(random.Random(f"{mode}/{parser}")), policy.chat)
    sampling = SamplingParams(max_new_tokens=8)
    errors, seed, t0 = [], 0, time.perf_counter()
    while engine.count < OUTPUTS_PER_COMBO:
        try:
            trajs = rollout(spec, _Policy(chat), engine, seeds=[seed, seed + 1], group_size=4, sampling=sampling,
                            policy_version=0)
            assert len(trajs) == 8
        except Exception as e:  # noqa: BLE001 - counted and reported below
            errors.append(repr(e)[:300])
        seed += 2
    elapsed = time.perf_counter() - t0
    print(f"{mode}/{parser}: {engine.count} hostile outputs, {chat.turns_checked} user turns checked, "
          f"{len(errors)} exceptions, {elapsed:.1f} s")
    assert errors == []
    if mode == "interactive":
        assert chat.turns_checked > engine.count // 2  # most outputs were echoed into a next user turn
