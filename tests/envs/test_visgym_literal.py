"""``parser: tuple`` at bounded cost: the literal scanner agrees with ``ast.literal_eval`` on every
bracket group, the parser with a plain (quadratic) reading of upstream's rules, on random texts;
nested runaway outputs parse in linear time."""

from __future__ import annotations

import random
import re
import time

import pytest

from envs.visgym import make_parser
from envs.visgym.literal import FAIL, LiteralScanner, literal_eval_quiet
from envs.visgym.parsers import _normalize_like_upstream, _paren_groups

# Pieces of Python literal syntax and of model outputs, glued at random.
PIECES = [
    "'''", '"""', "''", "\\'", "(", ")", "(", ")", "'", '"', "move", "stop", "Move", ",", ",", " ",
    "0", "1", "3", "True", "None", "set", "[", "]", "{", "}", ":", "+", "-", "2j", "1.5", "x", "#",
    "\\", "b'", "f'", "0x1", "...", "(move, ", "('move', ", "('stop', 'go')", "'a'", '"s"', "u'",
    "r'", "1e", "_", "()", "set()", "-1", "1_0", "\uff53\uff45\uff54", "b'x'", "'\\N{x}'", "'\\d'",
    "{1: 2}", "[1]", "1e+5j", "0o7", "00", "01", "`", "```py", "Action:", "\n", "\t", "\u2018",
    "(stop, ", "'stop'", "<|begin_of_box|>", "\u00e9", "1j", "-0", "+2",
]


def _random_texts(n: int, seed: int, max_pieces: int = 30) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, max_pieces))) for _ in range(n)]


def test_scanner_agrees_with_literal_eval_on_every_group():
    groups = 0
    for text in _random_texts(8000, seed=11, max_pieces=20):
        clean = _normalize_like_upstream(text)
        scanner = LiteralScanner(clean)
        for start, end in reversed(_paren_groups(clean)):
            ours, python = scanner.group(start, end), literal_eval_quiet(clean[start:end])
            if ours is FAIL or python is FAIL:
                assert ours is python, f"{clean[start:end]!r}: scanner {ours!r}, literal_eval {python!r}"
            else:
                assert type(ours) is type(python) and ours == python, clean[start:end]
            groups += 1
    assert groups > 3000


def _plain_upstream_action(text: str) -> int | None:
    """Upstream's harness + env read plainly, at upstream's (quadratic) cost: every ``(`` matched by
    counting brackets, a bare first name quoted, ``literal_eval``, the last tuple whose first
    element is a str; without one the raw output; then the env's rules for move and stop."""
    clean = _normalize_like_upstream(text)
    chosen = None
    for i, ch in enumerate(clean):
        if ch != "(":
            continue
        depth = 0
        for j in range(i, len(clean)):
            depth += {"(": 1, ")": -1}.get(clean[j], 0)
            if depth == 0:
                break
        else:
            continue
        group = clean[i : j + 1]
        m = re.match(r"\(\s*([A-Za-z_]\w*)(\s*,)", group)
        if m:
            group = f"('{m.group(1)}'{m.group(2)}{group[m.end():]}"
        value = literal_eval_quiet(group)
        if isinstance(value, tuple) and value and isinstance(value[0], str):
            chosen = value
    value = chosen if chosen is not None else literal_eval_quiet(text)
    if not isinstance(value, tuple) or len(value) != 2:
        return None
    name, arg = value
    if name == "move" and isinstance(arg, int) and 0 <= arg < 4:
        return int(arg)
    if name == "stop" and isinstance(arg, str) and 1 <= len(arg) <= 4 and all(c.isascii() and c.isalnum() for c in arg):
        return 4
    return None


def test_tuple_parser_agrees_with_a_plain_reading_of_upstream():
    parser = make_parser("tuple")
    acting = 0
    for text in _random_texts(4000, seed=5):
        parsed = parser.parse(text)
        expected = _plain_upstream_action(text)
        assert (parsed.actions[0] if parsed else None) == expected, repr(text)
        acting += expected is not None
    assert acting > 400  # the random texts do act often enough to compare actions


RUNAWAY = {
    "nested, failing inside": lambda k: "('a', " * k + "x y" + ")" * k,
    "nested bare names": lambda k: "(move, " * k + "1 1" + ")" * k,
    "parens inside strings": lambda k: "('(', " * k + "1 1" + ")" * k,
    "nested, valid": lambda k: "('a', " * k + ")" * k,
    "deep parentheses": lambda k: "( " * (3 * k) + "1" + " )" * (3 * k),
    "deep parentheses, string inside": lambda k: "(" * (3 * k) + "'a'" + ")" * (3 * k),
}


@pytest.mark.parametrize("name", sorted(RUNAWAY))
def test_runaway_outputs_parse_in_linear_time(name):
    """A 120,000-character runaway output of 20,000 nested groups. Evaluating each group with
    literal_eval, as upstream does, is quadratic (6 s here for the first case even when only groups
    that open with a string are evaluated); the tuple parser takes about 0.3 s."""
    text = RUNAWAY[name](20_000)
    assert len(text) >= 120_000
    parser = make_parser("tuple")
    t0 = time.perf_counter()
    parsed, reason = parser.parse_with_reason(text)
    elapsed = time.perf_counter() - t0
    assert parsed is None and reason
    assert elapsed < 5.0, f"{name}: {elapsed:.1f} s"


def test_action_after_long_text_and_long_action_groups():
    parser = make_parser("tuple")
    assert parser.parse("('move', 2)" + " (x)" * 10_000).actions == (2,)
    assert parser.parse("('move', " + "0" * 30_000 + ")").actions == (0,)  # a long spelling of 0
    assert parser.parse("('stop', " + "'' " * 10_000 + "'go')").actions == (4,)


def test_literal_eval_quiet_swaps_warning_filters_under_its_lock(monkeypatch):
    """catch_warnings is process-wide state; concurrent parsers (rlkit/serve/play.py) must take turns in it."""
    import warnings

    from envs.visgym import literal

    seen = []
    real = warnings.catch_warnings

    class Recording(real):
        def __enter__(self):
            seen.append(literal._WARNINGS_LOCK.locked())
            return super().__enter__()

    monkeypatch.setattr(literal.warnings, "catch_warnings", Recording)
    before = list(warnings.filters)
    assert literal_eval_quiet("('\\d', 1)") == ("\\d", 1)  # an invalid escape: a warning, ignored
    assert seen == [True] and not literal._WARNINGS_LOCK.locked()
    assert warnings.filters == before
