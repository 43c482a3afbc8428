"""Action parsers: raw model text -> ``ParsedAction`` (a sequence of ``Discrete(5)`` actions).

Chosen by name in the env config (``parser:``):

- ``tuple`` (VisGym's own format): the last balanced ``( ... )`` group whose first element is an
  action name, e.g. ``('move', 0)``, ``(move, 3)``, ``('stop', 'stop')``. Quotes are optional,
  code fences and backticks are ignored. Moves use the upstream action numbering 0 right, 1 up,
  2 left, 3 down.
- ``tuple_answer``: the same, but only inside the last ``<answer>...</answer>`` block.
- ``keyword`` (SkyRL's instruct recipe): the last ``<action>X</action>`` with X one of
  right, up, left, down, stop (case-insensitive).
- ``plan`` (single-turn plan mode, our format): a whole route as words, e.g.
  ``<answer>right right down stop</answer>``. The content of the last ``<answer>`` block is read
  (without one: the last non-empty line). Words are right, up, left, down, stop, separated by
  spaces, commas or any other non-letter characters; everything from the first ``stop`` on ends
  the plan (later text is ignored). A plan without stop is valid but never succeeds.

Every parser has ``parse(text) -> ParsedAction | None`` and ``parse_with_reason(text) ->
(ParsedAction | None, reason)``; neither raises, whatever the input (empty, huge, unbalanced
brackets, unicode, several tuples, non-str). ``format(actions)`` writes actions in the parser's
format (used for SFT demonstrations).
"""

from __future__ import annotations

import re
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from envs.visgym.gym_env import STOP
from envs.visgym.maze import MOVE_NAMES

#: Outputs longer than this (characters) are read from their last MAX_CHARS characters only, which
#: bounds parsing time on runaway generations; every format reads the last action anyway.
MAX_CHARS = 20_000

#: Longest fragment of the model's output quoted back in a parse-failure reason (characters), so
#: a runaway output cannot blow up the next user turn.
MAX_ECHO = 60

_WORDS = {name: i for i, name in enumerate(MOVE_NAMES)} | {"stop": STOP}
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_QUOTES = "'\"`\u2018\u2019\u201c\u201d"
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GROUP_RE = re.compile(r"\(([^()]*)\)")
_ACTION_TAG_RE = re.compile(r"<action>([^<]{0,100})</action>", re.IGNORECASE)
# Plan words are letter runs; separators are whitespace and the punctuation below; anything else
# (digits, other symbols, non-ASCII letters) forms a token that is not a plan word.
_TOKEN_RE = re.compile(r"[A-Za-z]+|[^\sA-Za-z,;:.\-_>|/()\[\]'\"\u2192]+")


@dataclass(frozen=True)
class ParsedAction:
    """A parsed model output.

    actions: ``Discrete(5)`` indices in order (0..3 move in action directions 0 right, 1 up,
        2 left, 3 down; 4 stop). One element for the per-turn parsers, the whole route for ``plan``.
    text: the fragment of the output that was read.
    """

    actions: tuple[int, ...]
    text: str


def _echo(fragment: str) -> str:
    """``fragment`` cut to MAX_ECHO characters (with "..." when cut), for a failure reason."""
    return fragment if len(fragment) <= MAX_ECHO else fragment[: MAX_ECHO - 3] + "..."


def describe_action(action: int) -> str:
    """Short name of a ``Discrete(5)`` action: "move right", ..., "stop"."""
    return "stop" if action == STOP else f"move {MOVE_NAMES[action]}"


def _last_answer_block(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` block (case-insensitive), in linear time."""
    lower = text.translate(_ASCII_LOWER)  # keeps indices (str.lower() may change the length)
    end = lower.rfind("</answer>")
    if end < 0:
        return None
    start = lower.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


class _Parser(ABC):
    name = ""

    def parse(self, text: str) -> ParsedAction | None:
        """The action(s) in ``text``, or None if it does not parse. Never raises."""
        return self.parse_with_reason(text)[0]

    def parse_with_reason(self, text: str) -> tuple[ParsedAction | None, str]:
        """``(ParsedAction, "")`` or ``(None, why)``; ``why`` is a short text for the model."""
        if not isinstance(text, str):
            return None, f"expected text, got {type(text).__name__}"
        try:
            return self._parse(text[-MAX_CHARS:])
        except Exception as e:  # a parser bug must not kill a rollout; report it as a parse failure
            return None, f"parser error ({type(e).__name__})"

    @abstractmethod
    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        """Parse a str; may raise on a bug (``parse_with_reason`` turns that into a failure)."""


class TupleParser(_Parser):
    """VisGym tuple format: ``('move', d)`` with d in 0..3, or ``('stop', 'stop')``.

    The last innermost ``( ... )`` group whose first element (quotes stripped) is a known action
    name wins, even if its argument is invalid (then the output does not parse). ``(stop)`` and
    ``('stop',)`` are accepted for stop. With ``answer_only`` only the last ``<answer>`` block is read.
    """

    def __init__(self, answer_only: bool = False):
        self.answer_only = answer_only
        self.name = "tuple_answer" if answer_only else "tuple"

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        if self.answer_only:
            block = _last_answer_block(text)
            if block is None:
                return None, "no <answer>...</answer> block"
            text = block
        text = text.replace("`", "")
        unknown = None
        for m in reversed(list(_GROUP_RE.finditer(text))):
            parts = [p.strip().strip(_QUOTES).strip() for p in m.group(1).split(",")]
            head = parts[0]
            if not _NAME_RE.match(head):
                continue
            name = head.lower()
            if name not in ("move", "stop"):
                unknown = unknown or head
                continue
            args = [p for p in parts[1:] if p != ""] if name == "stop" else parts[1:]
            if name == "stop":
                if all(a.lower() == "stop" for a in args) and len(args) <= 1:
                    return ParsedAction((STOP,), m.group(0)), ""
                return None, f"{_echo(m.group(0))}: stop takes no argument but 'stop'"
            if len(args) == 1 and re.fullmatch(r"[0-3]", args[0]):
                return ParsedAction((int(args[0]),), m.group(0)), ""
            return None, f"{_echo(m.group(0))}: direction must be 0 right, 1 up, 2 left or 3 down"
        if unknown is not None:
            return None, f"unknown action {unknown[:20]!r}; use ('move', d) or ('stop', 'stop')"
        return None, "no ('move', d) or ('stop', 'stop') found"

    def format(self, actions: Sequence[int]) -> str:
        """One action as the model should write it, e.g. ``('move', 0)``; ``<answer>``-wrapped
        for ``tuple_answer``.

        Raises:
            ValueError: not exactly one action in 0..4.
        """
        if len(actions) != 1 or actions[0] not in _WORDS.values():
            raise ValueError(f"tuple format takes exactly one action 0..4, got {list(actions)}")
        a = actions[0]
        out = "('stop', 'stop')" if a == STOP else f"('move', {a})"
        return f"<answer>{out}</answer>" if self.answer_only else out


class KeywordParser(_Parser):
    """SkyRL instruct-recipe format: the last ``<action>right|up|left|down|stop</action>``."""

    name = "keyword"

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        unknown = None
        for m in reversed(list(_ACTION_TAG_RE.finditer(text))):
            word = m.group(1).strip().lower()
            if word in _WORDS:
                return ParsedAction((_WORDS[word],), m.group(0)), ""
            unknown = unknown or m.group(1).strip()
        if unknown is not None:
            return None, f"unknown action {unknown[:20]!r}; use right, up, left, down or stop"
        return None, "no <action>...</action> tag"

    def format(self, actions: Sequence[int]) -> str:
        """One action as ``<action>right</action>``. Raises ValueError unless exactly one action."""
        if len(actions) != 1 or actions[0] not in _WORDS.values():
            raise ValueError(f"keyword format takes exactly one action 0..4, got {list(actions)}")
        word = "stop" if actions[0] == STOP else MOVE_NAMES[actions[0]]
        return f"<action>{word}</action>"


class PlanParser(_Parser):
    """Plan format: ``<answer>right right down ... stop</answer>`` (see module docstring)."""

    name = "plan"

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        block = _last_answer_block(text)
        if block is None:
            lines = [ln for ln in text.replace("`", "").splitlines() if ln.strip()]
            if not lines:
                return None, "empty output; expected e.g. <answer>right down stop</answer>"
            block = lines[-1]
        actions: list[int] = []
        for tok in _TOKEN_RE.findall(block):
            word = tok.lower()
            if word not in _WORDS:
                return None, f"unknown word {tok[:20]!r} in plan; use right, up, left, down, stop"
            actions.append(_WORDS[word])
            if word == "stop":
                break
        if not actions:
            return None, "empty plan; expected e.g. <answer>right down stop</answer>"
        return ParsedAction(tuple(actions), block.strip()[:200]), ""

    def format(self, actions: Sequence[int]) -> str:
        """A route as ``<answer>right down stop</answer>``. Raises ValueError on an action not in 0..4."""
        if not actions or any(a not in _WORDS.values() for a in actions):
            raise ValueError(f"plan takes actions in 0..4, got {list(actions)}")
        words = ["stop" if a == STOP else MOVE_NAMES[a] for a in actions]
        return f"<answer>{' '.join(words)}</answer>"


#: Parser names accepted by ``make_parser`` (and by the env config key ``parser``).
PARSER_NAMES: tuple[str, ...] = ("tuple", "tuple_answer", "keyword", "plan")


def make_parser(name: str) -> TupleParser | KeywordParser | PlanParser:
    """The parser called ``name`` (tuple, tuple_answer, keyword, plan).

    Raises:
        ValueError: unknown name.
    """
    if name == "tuple":
        return TupleParser()
    if name == "tuple_answer":
        return TupleParser(answer_only=True)
    if name == "keyword":
        return KeywordParser()
    if name == "plan":
        return PlanParser()
    raise ValueError(f"unknown action parser {name!r}; choose one of {list(PARSER_NAMES)}")
