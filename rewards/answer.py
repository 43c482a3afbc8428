"""Question-answering rewards: the policy's answer checked against the task's, for any env that reports both."""

from __future__ import annotations

from rewards.base import last_info
from rlkit.types import Episode, RewardOutput


class ExactAnswer:
    """1.0 if the last turn's parsed answer equals the task's expected answer, else 0.0. Component: ``exact_answer``.

    Reads ``turn.info["answer"]`` (the answer the env parsed from the policy's text; None when it could not parse
    one) and ``turn.info["expected"]`` (the right answer) of the episode's last turn, and compares them as strings,
    exactly (no case folding: the env decides what a well-formed answer is). An episode without turns gets 0.
    The env's own ``success`` is not read, so a reward and an env that disagree show up in the logs
    (``reward/exact_answer`` beside ``rollout/success``). envs.shapes reports both keys.

    Raises:
        ValueError: on call, a last turn without ``answer`` or ``expected`` in its info (names the key, the
            episode seed and the keys the env did report).
    """

    name = "exact_answer"
    info_keys: tuple[str, ...] = ("answer", "expected")

    def __repr__(self) -> str:
        return "ExactAnswer()"

    def __call__(self, episode: Episode) -> RewardOutput:
        if not episode.turns:
            return RewardOutput(0.0, {self.name: 0.0})
        answer = last_info(episode, "answer", self.name)
        expected = last_info(episode, "expected", self.name)
        total = 1.0 if answer is not None and str(answer) == str(expected) else 0.0
        return RewardOutput(total, {self.name: total})
