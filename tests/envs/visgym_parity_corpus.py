"""The outputs of the VisGym parity suite (plain Python: also imported by tests/envs/data/make_visgym_parity.py
in a Python that has only upstream's code, so nothing from rlkit here).

``parity_outputs()`` lists ``(category, output)`` pairs: the issue's categories (later non-move/stop
tuples, capitalised names, quoted directions, malformed and short stops, Python literals, curly
quotes, outputs over 20,000 characters) plus ordinary and hostile model-like outputs. The action
upstream takes on each is recorded in data/visgym_parity_actions.json.
"""

from __future__ import annotations

import random

CANONICAL = ["('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)", "('stop', 'stop')"]

WRAPPERS = [
    "{}",
    "`{}`",
    "```\n{}\n```",
    "```python\n{}\n```",
    "```json {}```",
    "Action: {}",
    "action:{}",
    "ACTION :  {}",
    "I will go this way. {}",
    "{} is my move.",
    "<think>the goal is below me</think>\n{}",
    "<answer>{}</answer>",
    "<|begin_of_box|>{}<|end_of_box|>",
    "\u25c1think\u25b7hmm\u25c1/think\u25b7{}",
    "Reasoning:\n- wall to the right (gray)\n- open below\n\nFinal answer: {}",
    "{}\n\n",
    "\t{}  ",
]


def _issue_cases() -> list[tuple[str, str]]:
    later = [
        "('move', 0) then ('note', 1)",
        "('move', 1) ('Move', 2)",
        "('stop', 'stop') ('check', 'ok')",
        "('move', 3) and then (x, 1)",
        "('move', 2) (sic)",
        "('move', 2) (see above)",
        "('move', 0) ('a',)",
        "('move', 1), i.e. (up, 1)",
        "('move', 0) -> ('move', 9)",
        "((move, 1))",
        "(('move', 1), ('move', 2))",
        "('move', ('left', 2))",
        "('move', 3) (1, 2)",
        "('move', 3) ([1], 'a')",
    ]
    capitalised = ["('Move', 0)", "('MOVE', 1)", "(Move, 2)", "('Stop', 'stop')", "('STOP', 'STOP')",
                   "(STOP, 'STOP')", "('stop', 'STOP')", "('mOve', 3)"]
    quoted_direction = ["('move', '1')", "('move', \"0\")", "(move, '3')", "('move', 'right')", "('move', '')"]
    malformed_stop = ["(stop)", "('stop',)", "('stop', '')", "(stop,)", "('stop')", "('stop', 'stop', 'stop')",
                      "('stop', None)", "('stop', 0)", "(stop, stop)", "('stop', 'stops')", "('stop', 'st p')",
                      "('stop', '\u00e9t\u00e9')", "('stop', '!')"]
    short_stop = ["('stop', 'go')", "('stop', 'end')", "(stop, '1')", "('stop', 'done')", "('stop', 'X')",
                  "(stop, 'ok')", "('stop', 's' 'top')", "('stop', r'stop')", "('stop', u'end')"]
    literals = ["('move', True)", "('move', False)", "('move', 0x1)", "('move', +2)", "('move', 0b11)",
                "('move', (1))", "('move', -0)", "('move', 0o2)", "('move', 00)", "('move', 0_0)",
                "('move', 1.0)", "('move', 1j)", "('move', None)", "('move', [1])", "('move', 1_0)",
                "('move', 10**30)", "('move', 99999999999999999999999999)", "('move', -1)", "('move', 4)",
                "('mo' 've', 1)", "(u'move', 2)", "(r'move', 3)", "((('move')), 0)", "('move', 1, )",
                "('move', 0) # right", "('move', ((3)))", "('move', --1)", "('move', 0x_1)", "('move', 1e0)"]
    curly = ["(\u2018move\u2019, 0)", "(\u201cmove\u201d, 1)", "(\u2018move', 2)", "('move\u2019, 3)",
             "(\u2018stop\u2019, \u2018stop\u2019)", "(\u201cstop\u201d, \u201cstop\u201d)", "(move, \u20181\u2019)"]
    no_parens = ["'move', 0", "\"stop\", \"stop\"", "move 0", "move right", "'move', 1 # up", "  'move', 2",
                 "'stop', 'go'", "['move', 1]", "{'move': 1}", "move, 3"]
    out = []
    for cat, texts in [("later_tuple", later), ("capitalised", capitalised), ("quoted_direction", quoted_direction),
                       ("malformed_stop", malformed_stop), ("short_stop", short_stop), ("literal", literals),
                       ("curly_quotes", curly), ("no_parens", no_parens)]:
        out += [(cat, t) for t in texts]
    return out


def _hostile() -> list[tuple[str, str]]:
    texts = ["", " ", "\n\n", "```", "``````", "Action:", "(", ")", "()", "(((((", ")))(('move'", "('move', 0",
             "('move' 0)", "('move'; 0)", "move(0)", "stop()", "('move', 0))", "(('move', 0)",
             "(" * 300 + "'move', 0" + ")" * 300, "(" * 150 + "('move', 2)" + ")" * 150,
             "\x00('move', 0)", "('move', 0)\x00", "('move',\u00a00)", "('move',\u20031)",
             "\u79fb\u52a8 (\u53f3) \U0001f600", "('\u79fb\u52a8', 0)", "(\u79fb\u52a8, 0)",
             "('move', \u0661)", "('move', 0)\n('move', 1)\n('stop', 'stop')", "('move', '0') ('move', 0)",
             "(move 0)", "(move, 0", "move, 0)", "((move, 0), (stop, stop))", "('move', 0) ('stop',)",
             "f('move', 1)", "print('move', 2)", "lambda: ('move', 3)", "('move', 0)['x']", "'('move', 1)'",
             "\"('move', 2)\"", "('move', '(1)')", "('a (b c) d', 1)", "('move', len('ab'))",
             "(_, 1)", "(move_1, 1)", "(move1, 1)", "( move , 2 )", "(\tmove,\n3)"]
    return [("hostile", t) for t in texts]


def _long() -> list[tuple[str, str]]:
    prose = "The blue dot must go around the gray wall (carefully) before it turns. "
    filler = (prose * 400)[:25_000]
    return [
        ("long", "('move', 2)" + " x" * 12_000),
        ("long", "('move', 3)\n" + filler),
        ("long", filler + "('move', 1)"),
        ("long", filler + "('stop', 'stop')" + filler),
        ("long", "x" * 30_000 + "('move', 0)"),
        ("long", "('move', 0) " + "(" * 21_000),
        ("long", "('move', 1) " + "() " * 8_000),
        ("long", "('move', 0" + ", 0" * 11_000 + ")"),
        ("long", "('stop', " + "'' " * 8_000 + "'go')"),
        ("long", "('move', " + "0" * 21_000 + ")"),
    ]


def _templated(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    names = ["move", "move", "move", "stop", "Move", "go", "turn"]
    quotes = ["'", "'", '"', "", "\u2018"]
    args = ["0", "1", "2", "3", "'stop'", "'1'", "True", "4", "'go'", "'s'", ""]
    out = []
    for _ in range(n):
        q = rng.choice(quotes)
        close = "\u2019" if q == "\u2018" else q
        tup = f"({q}{rng.choice(names)}{close}, {rng.choice(args)})"
        if rng.random() < 0.3:
            tup = rng.choice(CANONICAL) + rng.choice([" then ", "\n", " or maybe "]) + tup
        out.append(("templated", rng.choice(WRAPPERS).format(tup)))
    return out


def parity_outputs() -> list[tuple[str, str]]:
    """``(category, output)`` pairs, deterministic."""
    out = [("canonical", w.format(c)) for c in CANONICAL for w in WRAPPERS]
    out += [("canonical", t) for t in ["(move, 0)", "(move,1)", '("move", 2)', "( 'move' , 3 )", "(stop, 'stop')",
                                        "('stop', \"stop\")", "(\"stop\",\"stop\")"]]
    return out + _issue_cases() + _hostile() + _long() + _templated(80)


#: (variant, seed) of the recorded image episodes; data/make_visgym_parity.py builds their outputs.
PARITY_EPISODES = [("easy", s) for s in range(10)] + [("hard", s) for s in range(4)]
