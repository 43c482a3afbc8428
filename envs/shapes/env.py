"""The shapes env for rlkit: a picture of coloured shapes, a question only the picture answers, one word back.

Written from ``rlkit/types.py`` alone, as a worked example of a second env (single-turn, ``max_turns`` 1):

- ``ShapesEpisode`` (``rlkit.types.EpisodeEnv``): ``reset(seed)`` shows task ``seed``'s picture and its
  question; ``step(text)`` reads the first ``<answer>...</answer>`` block of the policy's text and ends
  the episode. The answer is checked exactly: the block's content, stripped of surrounding whitespace,
  must be one of the colour words (lower case); anything else is a malformed output (``parse_ok`` False,
  reward 0), never an exception.
- ``ShapesEnv`` (``rlkit.types.EnvSpec``, what ``conf/env/shapes.yaml`` instantiates): the factory, the
  fixed evaluation set (seeds ``0 .. eval_size-1``) and the training exclusion (those seeds, and any other
  seed that draws the same picture and question), plus the optional capabilities ``demonstration``,
  ``stop_strings``, ``task_key`` and ``render_trajectory``.

Per-turn ``StepOutput.info`` (JSON-serialisable): ``parse_ok`` (bool), ``success`` (bool), ``answer``
(the parsed colour word, or None), ``expected`` (the right word), ``question`` and ``feedback`` (str).
The reward ``rewards.ExactAnswer`` (conf/reward/exact_answer.yaml) scores ``answer == expected``.
"""

from __future__ import annotations

import re
from typing import Any

from PIL import Image, ImageDraw

from envs.shapes.task import COLOURS, draw_task, render
from rlkit.types import Observation, StepOutput

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_ANSWER_BLOCK = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)

SYSTEM_PROMPT = (
    "Look at the picture of coloured shapes and answer the question with one colour word, "
    f"one of {', '.join(COLOURS)}, in an answer block, e.g. {ANSWER_OPEN}red{ANSWER_CLOSE}."
)


def parse_answer(text: Any) -> tuple[str | None, str]:
    """``(colour, "")`` for a text whose first answer block holds exactly a colour word (surrounding
    whitespace ignored), else ``(None, reason)``. Never raises (a non-string is a malformed output)."""
    if not isinstance(text, str):
        return None, f"the output is not text ({type(text).__name__})"
    m = _ANSWER_BLOCK.search(text)
    if m is None:
        return None, f"no {ANSWER_OPEN}...{ANSWER_CLOSE} block"
    word = m.group(1).strip()
    if word not in COLOURS:
        return None, f"{word[:40]!r} is not one of {', '.join(COLOURS)}"
    return word, ""


class ShapesEpisode:
    """One episode on one task (``rlkit.types.EpisodeEnv``). Single-turn: ``step`` ends it."""

    system_prompt: str | None = SYSTEM_PROMPT

    def __init__(self, num_shapes: int = 1, image_size: int = 56) -> None:
        self.num_shapes = int(num_shapes)
        self.image_size = int(image_size)
        self._task = None
        self._done = False
        self._success = False

    def reset(self, seed: int) -> Observation:
        """Start task ``seed``: its picture (RGB, image_size px square) and its question."""
        self._task = draw_task(seed, self.num_shapes, self.image_size)
        self._done = self._success = False
        return Observation(text=self._task.question, images=[render(self._task)])

    def step(self, action_text: str) -> StepOutput:
        """Check the policy's answer; the episode is then done (observation None). Reward 1.0 for the right
        colour word, else 0.0. A malformed output is a wrong answer with ``parse_ok`` False.

        Raises:
            RuntimeError: called before ``reset`` or after the episode is done (a harness error, not the policy's).
        """
        if self._task is None:
            raise RuntimeError("ShapesEpisode.step() called before reset()")
        if self._done:
            raise RuntimeError("ShapesEpisode.step() called after the episode is done; call reset()")
        word, reason = parse_answer(action_text)
        self._done = True
        self._success = word == self._task.answer
        if word is None:
            feedback = f"Unreadable answer: {reason}."
        else:
            feedback = "Correct." if self._success else f"Wrong: the {self._task.asked.kind} is {self._task.answer}."
        info = {"parse_ok": word is not None, "success": self._success, "answer": word,
                "expected": self._task.answer, "question": self._task.question, "feedback": feedback}
        return StepOutput(observation=None, reward=float(self._success), done=True, info=info)

    def success(self) -> bool:
        """True once the episode's answer was the right colour word."""
        return self._success


class ShapesEnv:
    """The shapes env spec (``rlkit.types.EnvSpec``; ``conf/env/shapes.yaml``).

    Args:
        num_shapes: shapes per picture, 1..3, of distinct kinds and colours (2: the question's shape must be
            told from another one of another colour; a policy that reads colours but not shapes gets 50%).
        image_size: the picture's side in px (56: 7x7 image tokens for the tiny policy, 8 px each).
        eval_size: the evaluation set is seeds ``0 .. eval_size-1`` (a multiple of 4 keeps its answers uniform).

    Raises:
        ValueError: a bad num_shapes / image_size (see ``draw_task``) or eval_size < 1.
    """

    max_turns = 1
    stop_strings: tuple[str, ...] = (ANSWER_CLOSE,)

    def __init__(self, num_shapes: int = 1, image_size: int = 56, eval_size: int = 64) -> None:
        if int(eval_size) < 1:
            raise ValueError(f"env.eval_size must be >= 1, got {eval_size!r}")
        draw_task(0, num_shapes, image_size)  # refuses bad arguments here, not at the first episode
        self.num_shapes = int(num_shapes)
        self.image_size = int(image_size)
        self.eval_size = int(eval_size)
        self.eval_set_name = f"shapes{self.num_shapes}_{self.eval_size}"
        self._eval_keys = frozenset(self.task_key(s) for s in range(self.eval_size))

    def __repr__(self) -> str:
        return f"ShapesEnv(num_shapes={self.num_shapes}, image_size={self.image_size}, eval_size={self.eval_size})"

    # -- EnvSpec ----------------------------------------------------------------------------------

    def make(self) -> ShapesEpisode:
        """A fresh episode env."""
        return ShapesEpisode(self.num_shapes, self.image_size)

    def eval_seeds(self) -> list[int]:
        """The fixed evaluation set: seeds 0 .. eval_size-1 (with 64: 16 of each answer)."""
        return list(range(self.eval_size))

    def is_eval_seed(self, seed: int) -> bool:
        """True if training must skip ``seed``: an evaluation seed, or one that draws an evaluation task
        (the same picture and question)."""
        seed = int(seed)
        return 0 <= seed < self.eval_size or self.task_key(seed) in self._eval_keys

    # -- optional capabilities ----------------------------------------------------------------------

    def task_key(self, seed: int) -> bytes:
        """The identity of task ``seed`` (its shapes, colours, places and sizes)."""
        return draw_task(seed, self.num_shapes, self.image_size).key()

    def demonstration(self, seed: int) -> list[str]:
        """The right answer text of task ``seed`` for its one policy turn, e.g. ``["<answer>red</answer>"]``."""
        return [f"{ANSWER_OPEN}{draw_task(seed, self.num_shapes, self.image_size).answer}{ANSWER_CLOSE}"]

    def render_trajectory(self, seed: int, infos: list[dict]) -> Image.Image:
        """Task ``seed``'s picture, 4x enlarged, framed green if the episode (per-turn ``infos``) answered
        right, red otherwise, with the given answer written below. RGB, (4 * image_size) x (4 * image_size + 16) px."""
        task = draw_task(seed, self.num_shapes, self.image_size)
        big = render(task).resize((4 * task.image_size,) * 2, Image.NEAREST)
        out = Image.new("RGB", (big.width, big.height + 16), (255, 255, 255))
        out.paste(big, (0, 0))
        d = ImageDraw.Draw(out)
        ok = bool(infos and infos[-1].get("success"))
        d.rectangle((0, 0, big.width - 1, big.height - 1), outline=(40, 180, 60) if ok else (220, 40, 40), width=3)
        said = infos[-1].get("answer") if infos else None
        d.text((4, big.height + 2), f"{task.question} {said or '?'} ({task.answer})", fill=(0, 0, 0))
        return out
