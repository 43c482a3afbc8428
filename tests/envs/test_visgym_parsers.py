"""Table-driven tests of the action parsers, including hostile model outputs."""

import pytest

from envs.visgym import PARSER_NAMES, make_parser
from envs.visgym.parsers import MAX_CHARS

R, U, L, D, S = 0, 1, 2, 3, 4

# parser: tuple follows upstream VisGym exactly (Interactor.parse_output, then the env's step); the
# recorded upstream actions for 326 outputs are checked in test_visgym_parity.py.
TUPLE_CASES = [
    ("('move', 0)", (R,)),
    ("(move, 3)", (D,)),
    ('("move", 1)', (U,)),
    ("('stop', 'stop')", (S,)),
    ("I go right: ('move', 0)", (R,)),
    ("('move', 0) then ('move', 1)", (U,)),  # the last tuple wins
    ("```python\n('move', 2)\n```", (L,)),  # code fences ignored
    ("`('move', 3)`", (D,)),  # backticks ignored
    ("Action: ('move', 1)", (U,)),
    ("<answer>('move', 3)</answer>", (D,)),
    ("('move', 0) (sic)", (R,)),  # (sic) is not a tuple
    ("((move, 1))", (U,)),  # the inner group gets its name quoted
    ("'move', 0", (R,)),  # no group: upstream evaluates the whole output
    # what upstream does and the lenient reading did not
    ("('move', 0) then ('note', 1)", None),  # the last tuple with a str name is the action
    ("('Move', 0)", None),
    ("('STOP', 'STOP')", None),
    ("('move', '1')", None),
    ("(stop)", None),
    ("('stop',)", None),
    ("('stop', '')", None),
    ("(stop, stop)", None),  # only the first bare name is quoted
    ("('stop', 'go')", (S,)),
    ("('stop', 'end')", (S,)),
    ("(stop, '1')", (S,)),
    ("('move', True)", (U,)),
    ("('move', 0x1)", (U,)),
    ("('move', +2)", (L,)),
    ("('move', 0b11)", (D,)),
    ("('move', (1))", (U,)),
    ("(\u2018move\u2019, 0)", None),  # curly quotes do not evaluate
    ("('move', 0)" + " x" * 15_000, (R,)),  # read past the last 20,000 characters
    # invalid in both readings
    ("('move', 4)", None),
    ("('move', -1)", None),
    ("('move', 'right')", None),
    ("('move')", None),
    ("('move', 1, 2)", None),
    ("('move', \u0661)", None),  # non-ASCII digit
    ("('move', 1) ('move', 9)", None),  # the last action tuple is invalid
    ("('move', 10**30)", None),
    ("('move', 99999999999999999999999)", None),  # upstream raises (int64 overflow); a no-op here
    ("('jump', 1)", None),
    ("move 0", None),
    ("", None),
    ("(((((", None),
    (")))(('move'", None),
    ("(" * 5000 + "'move', 0", None),
    ("x" * 10_000 + "('move', 0)", (R,)),
    ("\u79fb\u52a8 (\u53f3) \U0001f600", None),
]

# tuple_lenient: rlkit's earlier reading, kept under its own name.
LENIENT_CASES = [
    ("('move', 0)", (R,)),
    ("(move, 3)", (D,)),
    ("('Move', '2')", (L,)),
    ("(stop, stop)", (S,)),
    ("(stop)", (S,)),
    ("('move', 0) then ('note', 1)", (R,)),
    ("(\u2018move\u2019, 1)", (U,)),
    ("('stop', 'go')", None),
    ("('move', True)", None),
    ("('move', 0)" + " x" * 15_000, None),  # only the last MAX_CHARS characters are read
]

KEYWORD_CASES = [
    ("<action>right</action>", (R,)),
    ("<action>up</action>", (U,)),
    ("<action> LEFT </action>", (L,)),
    ("<action>down</action>", (D,)),
    ("<action>stop</action>", (S,)),
    ("think... <action>up</action> no, <action>down</action>", (D,)),
    ("<action>down</action> <action>jump</action>", (D,)),  # last *valid* tag
    ("<action>jump</action>", None),
    ("<action>right", None),
    ("right", None),
    ("('move', 0)", None),
    ("", None),
    ("<action>" * 3000, None),
    ("<action>\U0001f600</action>", None),
]

PLAN_CASES = [
    ("<answer>right right down stop</answer>", (R, R, D, S)),
    ("<answer>Right, Down, Left, Up, Stop</answer>", (R, D, L, U, S)),
    ("<answer>right -> down -> stop</answer>", (R, D, S)),
    ("<answer>right\u2192down\u2192stop</answer>", (R, D, S)),
    ("<answer>right down</answer>", (R, D)),  # valid; without stop it cannot succeed
    ("<answer>right stop left</answer>", (R, S)),  # stop ends the plan
    ("thinking\nright down stop", (R, D, S)),  # no <answer>: the last non-empty line
    ("<answer>up</answer> <answer>down stop</answer>", (D, S)),  # the last block
    ("<answer>right 2 stop</answer>", None),
    ("<answer>right jump stop</answer>", None),
    ("<answer></answer>", None),
    ("<answer>   </answer>", None),
    ("", None),
    ("\n\n", None),
    ("('move', 0)", None),
    ("<answer>" * 5000, None),
    ("<answer>droite \u00e0 gauche</answer>", None),
    ("x" * 30_000 + "\n<answer>down stop</answer>", (D, S)),
]


def _check(parser_name, text, expected):
    parser = make_parser(parser_name)
    parsed, reason = parser.parse_with_reason(text)
    if expected is None:
        assert parsed is None and reason, f"{text[:60]!r} should not parse"
    else:
        assert parsed is not None, f"{text[:60]!r}: {reason}"
        assert parsed.actions == expected and reason == ""
    assert parser.parse(text) == parsed


@pytest.mark.parametrize("text,expected", TUPLE_CASES)
def test_tuple_parser(text, expected):
    _check("tuple", text, expected)


@pytest.mark.parametrize("text,expected", LENIENT_CASES)
def test_tuple_lenient_parser(text, expected):
    _check("tuple_lenient", text, expected)


@pytest.mark.parametrize("text,expected", KEYWORD_CASES)
def test_keyword_parser(text, expected):
    _check("keyword", text, expected)


@pytest.mark.parametrize("text,expected", PLAN_CASES)
def test_plan_parser(text, expected):
    _check("plan", text, expected)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<answer>('move', 1)</answer>", (U,)),
        ("('move', 0) <answer>('move', 2)</answer>", (L,)),
        ("('move', 1)", None),  # outside <answer>
        ("<ANSWER>(stop, 'stop')</ANSWER>", (S,)),
        ("<answer>('Move', 1)</answer>", None),  # upstream's tuple rules inside the block
    ],
)
def test_tuple_answer_parser(text, expected):
    _check("tuple_answer", text, expected)


@pytest.mark.parametrize("name", PARSER_NAMES)
@pytest.mark.parametrize("bad", [None, 3, b"('move', 0)", ["<action>up</action>"], "\x00" * 100, "\ud800"])
def test_never_raises_on_non_text(name, bad):
    parsed, reason = make_parser(name).parse_with_reason(bad)
    assert parsed is None and reason


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_huge_outputs_are_bounded(name):
    parser = make_parser(name)
    for text in ["(" * 1_000_000, "<answer>" * 200_000, "right " * 200_000, "\u00e9" * 500_000]:
        parser.parse_with_reason(text)  # must return quickly, never raise
    assert MAX_CHARS >= 10_000


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_format_round_trip(name):
    parser = make_parser(name)
    if name == "plan":
        seq = (R, U, L, D, S)
        assert parser.parse(parser.format(seq)).actions == seq
        assert parser.format(seq) == "<answer>right up left down stop</answer>"
    elif name == "plan_walls":
        seq = (R, U, L, D, S)
        assert parser.parse(parser.format(seq, walls="a#b.")).actions == seq
        assert parser.format(seq, walls="a#b.") == "a#b.<answer>right up left down stop</answer>"
        with pytest.raises(ValueError, match="walls"):
            parser.format(seq)
    else:
        for a in (R, U, L, D, S):
            assert parser.parse(parser.format([a])).actions == (a,)
        with pytest.raises(ValueError):
            parser.format([R, U])
    with pytest.raises(ValueError):
        parser.format([7])


def test_unknown_parser_name():
    with pytest.raises(ValueError, match="unknown action parser"):
        make_parser("json")


def test_reasons_are_informative():
    for name in ("tuple", "tuple_lenient"):
        assert "direction" in make_parser(name).parse_with_reason("('move', 7)")[1]
        assert "jump" in make_parser(name).parse_with_reason("('jump', 1)")[1]
    assert "lowercase" in make_parser("tuple").parse_with_reason("('Move', 1)")[1]
    assert "2-tuple" in make_parser("tuple").parse_with_reason("('stop',)")[1]
    assert "1-4 letters" in make_parser("tuple").parse_with_reason("('stop', '')")[1]
    assert "<action>" in make_parser("keyword").parse_with_reason("up")[1]
    assert "'2'" in make_parser("plan").parse_with_reason("<answer>up 2</answer>")[1]


@pytest.mark.parametrize("name", ["tuple", "tuple_answer"])
def test_failure_reason_echo_is_bounded(name):
    from envs.visgym.parsers import MAX_ECHO

    body = "('move', " + "x" * 10_000 + ")"
    parsed, reason = make_parser(name).parse_with_reason(f"<answer>{body}</answer>")
    assert parsed is None and len(reason) < MAX_ECHO + 80


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a#b.c#<answer>right down stop</answer>", (R, D, S)),
        ("a#b.c#d.e#f.g#h.i#j.k#l.<answer>up stop</answer>", (U, S)),  # the transcription is never executed
        ("<answer>right stop</answer>", (R, S)),  # nor required
        ("a#b.c#<answer>right # stop</answer>", None),  # inside the block only route words
        ("a#b.c#", None),  # a transcription and no route
    ],
)
def test_plan_walls_parser(text, expected):
    _check("plan_walls", text, expected)


@pytest.mark.parametrize("name", ["plan", "plan_walls"])
def test_plan_past_max_chars_reads_the_tail(name):
    """An output longer than MAX_CHARS is read from its last MAX_CHARS characters: a route at its end parses,
    one only in its head does not."""
    parser = make_parser(name)
    body = "<answer>right down stop</answer>"
    parsed = parser.parse("x" * (MAX_CHARS + 5) + body)
    assert parsed.actions == (R, D, S) and parsed.text == "right down stop"
    assert parser.parse(body + " " + "x" * MAX_CHARS) is None  # the block fell out of the window read
