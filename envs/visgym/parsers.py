"""Action parsers: raw model text -> ``ParsedAction`` (a sequence of ``Discrete(5)`` actions).

Chosen by name in the env config (``parser:``):

- ``tuple`` (VisGym's own format, upstream-exact): yields exactly the action upstream VisGym takes
  for the same output (commit 0289034: the harness's ``Interactor.parse_output``, then the maze env's
  ``step``), e.g. ``('move', 0)``, ``(move, 3)``, ``('stop', 'stop')``; every output on which upstream
  does nothing does not parse here. The rules are in ``UpstreamTupleParser``. Moves use the upstream
  action numbering 0 right, 1 up, 2 left, 3 down.
- ``tuple_answer``: the ``tuple`` rules applied to the content of the last ``<answer>...</answer>``
  block only (no block: does not parse).
- ``tuple_lenient`` (rlkit's earlier ``tuple``): reads more outputs than upstream does, see
  ``LenientTupleParser`` for each difference. Success measured with it is not upstream's.
- ``keyword`` (SkyRL's instruct recipe): the last ``<action>X</action>`` with X one of
  right, up, left, down, stop (case-insensitive).
- ``plan`` (single-turn plan mode, our format): a whole route as words, e.g.
  ``<answer>right right down stop</answer>``. The content of the last ``<answer>`` block is read
  (without one: the last non-empty line). Words are right, up, left, down, stop, separated by
  spaces, commas or any other non-letter characters; everything from the first ``stop`` on ends
  the plan (later text is ignored). A plan without stop is valid but never succeeds.
- ``plan_walls`` (plan mode, our format): the ``plan`` route after a transcription of the maze's
  walls, e.g. ``a#b.c#d.<answer>right right down stop</answer>`` (see ``PlanWallsParser``).

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
from envs.visgym.literal import FAIL, LiteralScanner, literal_eval_quiet
from envs.visgym.maze import MOVE_NAMES

#: The keyword, plan and tuple_lenient parsers read outputs longer than this (characters) from their
#: last MAX_CHARS characters only, which bounds parsing time on runaway generations. The tuple and
#: tuple_answer parsers read the whole output, as upstream does, in linear time (envs/visgym/literal.py).
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
    """Content of the last ``<answer>...</answer>`` block (case-insensitive), in linear time; None without one."""
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

    #: Read only the last MAX_CHARS characters (False: the parser bounds its own cost).
    truncate = True

    def parse_with_reason(self, text: str) -> tuple[ParsedAction | None, str]:
        """``(ParsedAction, "")`` or ``(None, why)``; ``why`` is a short text for the model."""
        if not isinstance(text, str):
            return None, f"expected text, got {type(text).__name__}"
        try:
            cut = max(len(text) - MAX_CHARS, 0) if self.truncate else 0
            return self._parse(text[cut:])
        except Exception as e:  # a parser bug must not kill a rollout; report it as a parse failure
            return None, f"parser error ({type(e).__name__})"

    @abstractmethod
    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        """Parse a str; may raise on a bug (``parse_with_reason`` turns that into a failure)."""


def format_tuple(actions: Sequence[int]) -> str:
    """One action in VisGym's tuple format: ``('move', d)`` or ``('stop', 'stop')``.

    Raises:
        ValueError: not exactly one action in 0..4.
    """
    if len(actions) != 1 or actions[0] not in _WORDS.values():
        raise ValueError(f"tuple format takes exactly one action 0..4, got {list(actions)}")
    return "('stop', 'stop')" if actions[0] == STOP else f"('move', {actions[0]})"


# Upstream's clean-up of an output before it looks for tuples (Interactor._normalize): code fences
# with their language tag, then any backtick, box and think markers, "Action:" labels; whitespace
# runs become one space.
_FENCE_RE = re.compile(r"```[\w-]*")
_MARKERS = ("<|begin_of_box|>", "<|end_of_box|>", "\u25c1think\u25b7", "\u25c1/think\u25b7")
_ACTION_LABEL_RE = re.compile(r"\bAction\s*:\s*", re.IGNORECASE)
_SPACES_RE = re.compile(r"\s+")
# A bare name as the first element, e.g. (move, 3): upstream quotes it before evaluating.
_BARE_NAME_RE = re.compile(r"\(\s*([A-Za-z_]\w*)(\s*,)")
# A group can evaluate to a tuple whose first element is a str only if it opens with a str literal
# (r/u prefixes allowed, parentheses around it allowed) or with a bare name and a comma (quoted).
# ``_may_be_action`` checks that without evaluating the group.
_PAREN_RUN_RE = re.compile(r"\([( ]*")
_STR_OPENING_RE = re.compile(r"[rRuU]?['\"]")
_ALNUM = frozenset(string.ascii_letters + string.digits)


def _normalize_like_upstream(text: str) -> str:
    text = _FENCE_RE.sub("", text).replace("```", "").replace("`", "")
    for marker in _MARKERS:
        text = text.replace(marker, "")
    text = _ACTION_LABEL_RE.sub(" ", text)
    return _SPACES_RE.sub(" ", text).strip()


def _paren_groups(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every balanced ``( ... )`` group (end exclusive), quotes not considered,
    sorted by start. O(len(text)): one pass with a stack of open positions; a ``(`` never closed
    opens no group, as in upstream's scan."""
    groups, stack = [], []
    for m in re.finditer(r"[()]", text):
        if m.group() == "(":
            stack.append(m.start())
        elif stack:
            groups.append((stack.pop(), m.end()))
    groups.sort()
    return groups


def _may_be_action(text: str, start: int, run_ends: dict[int, int]) -> bool:
    """Whether the group opening at ``start`` can evaluate to a tuple with a str first element:
    its opening run of ``(`` and spaces ends at a string literal, or it is ``( name ,``."""
    return bool(_STR_OPENING_RE.match(text, run_ends[start]) or _BARE_NAME_RE.match(text, start))


def _paren_run_ends(text: str) -> dict[int, int]:
    """For every ``(``: where the run of ``(`` and spaces it belongs to ends. O(len(text))."""
    ends = {}
    for m in _PAREN_RUN_RE.finditer(text):
        for k in range(m.start(), m.end()):
            if text[k] == "(":
                ends[k] = m.end()
    return ends


def _literal(source: str):
    """``ast.literal_eval(source)``, or ``_NOT_LITERAL`` where upstream's would raise."""
    return literal_eval_quiet(source)


_NOT_LITERAL = FAIL


class UpstreamTupleParser(_Parser):
    """``tuple``: the action upstream VisGym takes for a model output, no more, no less.

    Follows VisGym commit 0289034: ``Interactor.parse_output(output)`` (prefer="last") then
    ``RandomMaze2DEnv.step(action)``. Re-implemented from its documented behaviour, not copied:

    1. Clean-up: code fences (```` ```lang ````), backticks, ``<|begin_of_box|>``-style box and
       think markers and ``Action:`` labels (any case) are removed, whitespace runs become one space.
    2. Every balanced ``( ... )`` group of the cleaned text (brackets matched without regard to
       quotes; nested groups included) whose first element is a bare name followed by a comma gets
       that name quoted (``(move, 3)`` -> ``('move', 3)``) and is evaluated with
       ``ast.literal_eval``. The group that starts last among those evaluating to a tuple with a
       ``str`` first element is the action text, whatever that name is.
    3. No such group: the raw output itself is evaluated (so ``'move', 0`` without brackets moves).
    4. The env acts only on a 2-tuple ``('move', d)`` with ``d`` an int (``True`` is 1) in 0..3, or
       ``('stop', s)`` with ``s`` a str of 1 to 4 ASCII letters or digits; names are case-sensitive.
       Anything else is a no-op upstream and does not parse here.

    Consequences: ``('Move', 0)``, ``('move', '1')``, ``(stop)``, ``('stop',)``, ``('stop', '')``
    and ``('move', 0) then ('note', 1)`` do nothing; ``('stop', 'go')`` stops; ``('move', 0x1)``,
    ``('move', +2)``, ``('move', 0b11)``, ``('move', (1))`` move; curly quotes cannot be evaluated.

    Deliberate differences (listed with the env's in envs/visgym/README.md): a move whose direction
    is an int outside int64 makes upstream raise (``Discrete.contains`` overflows), here it does not
    parse; ``literal_eval`` runs with warnings ignored (Python's default filters only print them).

    Cost: the whole output is read (an action after 20,000 characters of text is still found), in
    about linear time where upstream's scan is quadratic: only groups that can evaluate to an action
    tuple (they open with a string literal or a bare name and a comma) are considered, from the last
    one back; ``envs.visgym.literal.LiteralScanner`` decides what ``literal_eval`` would return for
    each with every bracket parsed once, and the group acted on is confirmed with ``literal_eval``.
    """

    name = "tuple"
    truncate = False

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        value, source = self._upstream_action(text)
        if value is _NOT_LITERAL:
            return None, "no action tuple found; reply ('move', d) with d 0..3, or ('stop', 'stop')"
        return self._act(value, source)

    @staticmethod
    def _upstream_action(text: str):
        """(value, source) of what upstream hands to the env: the last qualifying group, else the
        raw output (value ``_NOT_LITERAL`` if it does not evaluate)."""
        clean = _normalize_like_upstream(text)
        if clean:
            scanner = LiteralScanner(clean)
            run_ends = _paren_run_ends(clean)
            for start, end in reversed(_paren_groups(clean)):
                if not _may_be_action(clean, start, run_ends):
                    continue
                m = _BARE_NAME_RE.match(clean, start)
                first = (m.group(1), m.end()) if m else None
                value = scanner.group(start, end, first)
                if not (isinstance(value, tuple) and value and isinstance(value[0], str)):
                    continue
                source = clean[start:end]
                if m:
                    source = f"('{m.group(1)}'{m.group(2)}{clean[m.end():end]}"
                confirmed = _literal(source)  # upstream's own evaluation of the chosen group
                if isinstance(confirmed, tuple) and confirmed and isinstance(confirmed[0], str):
                    return confirmed, source
        return _literal(text), text

    @staticmethod
    def _act(value, source: str) -> tuple[ParsedAction | None, str]:
        shown = source if len(source) <= 60 else source[:57] + "..."
        if not isinstance(value, tuple) or len(value) != 2:
            return None, f"{shown}: an action is a 2-tuple, ('move', d) or ('stop', 'stop')"
        name, arg = value
        if name == "move":
            if isinstance(arg, int) and 0 <= arg < 4:
                return ParsedAction((int(arg),), source), ""
            return None, f"{shown}: direction must be the int 0 right, 1 up, 2 left or 3 down"
        if name == "stop":
            if isinstance(arg, str) and 1 <= len(arg) <= 4 and all(ch in _ALNUM for ch in arg):
                return ParsedAction((STOP,), source), ""
            return None, f"{shown}: stop takes a word of 1-4 letters or digits, e.g. ('stop', 'stop')"
        return None, f"unknown action {str(name)[:20]!r}; use ('move', d) or ('stop', 'stop') (lowercase)"

    def format(self, actions: Sequence[int]) -> str:
        """One action as ``('move', 0)`` / ``('stop', 'stop')`` (see ``format_tuple``)."""
        return format_tuple(actions)


class AnswerTupleParser(UpstreamTupleParser):
    """``tuple_answer``: ``UpstreamTupleParser``'s rules on the content of the last
    ``<answer>...</answer>`` block (case-insensitive tags); no block: does not parse.

    (Upstream's harness with ``elicit_verbalization`` instead reads the first ``<answer>`` block and
    the whole output when there is none; this parser is rlkit's stricter format.)
    """

    name = "tuple_answer"

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
        block = _last_answer_block(text)
        if block is None:
            return None, "no <answer>...</answer> block"
        return super()._parse(block)

    def format(self, actions: Sequence[int]) -> str:
        """One action as ``<answer>('move', 0)</answer>``. Raises ValueError unless exactly one action."""
        return f"<answer>{format_tuple(actions)}</answer>"


class LenientTupleParser(_Parser):
    """``tuple_lenient``: the VisGym tuple format read leniently (rlkit's ``tuple`` before it followed
    upstream exactly). Kept for policies that were trained or evaluated with it.

    The last innermost ``( ... )`` group whose first element (quotes stripped) is ``move`` or
    ``stop`` wins, even if its argument is invalid (then the output does not parse); only the last
    ``MAX_CHARS`` characters are read. Where upstream VisGym (``UpstreamTupleParser``) differs:

    - a later group whose name is not move/stop (``('move', 0) then ('note', 1)``) is skipped here
      (moves); upstream takes it as the action and does nothing;
    - names in any case (``('Move', 0)``, ``('STOP', 'STOP')``) act here; upstream does nothing;
    - a quoted direction (``('move', '1')``) moves here; upstream does nothing;
    - ``(stop)``, ``('stop',)``, ``('stop', '')`` stop here; upstream does nothing;
    - stop takes only ``'stop'`` here, so ``('stop', 'go')`` does not parse; upstream stops on any
      1-4 character letters/digits argument;
    - Python literals (``('move', True)``, ``0x1``, ``+2``, ``0b11``, ``(1)``) do not parse here;
      upstream evaluates them;
    - curly quotes (``(\u2018move\u2019, 0)``) are stripped here; upstream cannot evaluate them;
    - an action followed by more than ``MAX_CHARS`` characters is not seen here.
    """

    name = "tuple_lenient"

    def _parse(self, text: str) -> tuple[ParsedAction | None, str]:
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
        """One action as ``('move', 0)`` / ``('stop', 'stop')`` (see ``format_tuple``)."""
        return format_tuple(actions)


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
        if block is None:  # the last non-empty line, backticks dropped
            lines = [ln for ln in text.replace("`", "").splitlines() if ln.strip()]
            if not lines:
                return None, "empty output; expected e.g. <answer>right down stop</answer>"
            block = lines[-1]
        actions: list[int] = []
        for m in _TOKEN_RE.finditer(block):
            word = m.group().lower()
            if word not in _WORDS:
                return None, f"unknown word {m.group()[:20]!r} in plan; use right, up, left, down, stop"
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


class PlanWallsParser(PlanParser):
    """Plan format after a transcription of the walls: ``a#b.c#d.<answer>right down stop</answer>``.

    Before its route the policy writes every wall bit of the maze (the passages between adjacent rooms,
    in reading order) as its letter label and ``#`` (wall) or ``.`` (open): the answer of the grounding
    stage's ``walls`` question (envs/visgym/grounding.py ``walls_answer``). The transcription is the
    policy's own notes, a scratchpad read from the picture before it plans: the route then asks which
    passage next to the agent is open, a lookup by label in text, instead of a lookup in the image at
    every move. Only the route is executed and rewarded; a wrong transcription is not an error. 12 bits
    in 7x7 cost 24 tokens of the tiny tokenizer, so a 9-step plan is ~39 tokens instead of ~15; the
    longest evaluation answer is 47 tokens in 7x7 (the default ``rollout.max_new_tokens`` 48 fits it) and
    71 in 9x9 (a run refuses a ``max_new_tokens`` that would cut one). Measured on 7x7 (docs/experiments.md,
    session 16): the tiny policy transcribes every evaluation maze exactly and still fails routes, so the
    errors left are planning, not reading.

    Parsing is ``plan``'s: the last ``<answer>`` block (the transcription comes before it), else the last
    non-empty line.
    """

    name = "plan_walls"

    def format(self, actions: Sequence[int], walls: str | None = None) -> str:
        """A transcription then a route: ``a#b.<answer>right stop</answer>``.

        Raises:
            ValueError: an action not in 0..4, or ``walls`` missing.
        """
        if walls is None:
            raise ValueError("plan_walls needs the walls transcription (envs.visgym.grounding.walls_answer)")
        return f"{walls}{super().format(actions)}"


#: Parser names accepted by ``make_parser`` (and by the env config key ``parser``).
PARSER_NAMES: tuple[str, ...] = ("tuple", "tuple_answer", "tuple_lenient", "keyword", "plan", "plan_walls")

_PARSERS = {
    "tuple": UpstreamTupleParser,
    "tuple_answer": AnswerTupleParser,
    "tuple_lenient": LenientTupleParser,
    "keyword": KeywordParser,
    "plan": PlanParser,
    "plan_walls": PlanWallsParser,
}


def make_parser(name: str) -> _Parser:
    """The parser called ``name`` (one of ``PARSER_NAMES``; see the module docstring).

    Raises:
        ValueError: unknown name.
    """
    if name not in _PARSERS:
        raise ValueError(f"unknown action parser {name!r}; choose one of {list(PARSER_NAMES)}")
    return _PARSERS[name]()
