"""Which bracket groups of a text Python's ``ast.literal_eval`` accepts, in linear time.

Upstream VisGym's harness evaluates every balanced ``( ... )`` group of a model output with
``ast.literal_eval`` (see ``envs.visgym.parsers.UpstreamTupleParser``): quadratic in the output's
length when groups nest, seconds for a 20,000-character runaway generation. ``LiteralScanner``
gets the same answers with each bracket parsed once: a bracketed literal starting at a position is
the same expression whatever group contains it, so its parse is memoised by position, and groups
are scanned from the last one back (inner before outer).

It recognises exactly the expressions ``literal_eval`` accepts (Python 3.11): str/bytes literals
(implicit concatenation, no f-strings, not mixing str and bytes), numbers, ``...``, True, False,
None, tuples, lists, dicts and sets of those (keys and set members hashable), ``set()``, a ``+``/``-``
sign on a number constant, and ``number +/- complex``; with the tokenizer's limit of 200 nested
brackets. The value of each token (a string's escapes, a number's spelling) is computed by
``literal_eval`` itself on that token alone. Callers confirm a group they act on with
``literal_eval`` (``confirm``), so a gap here can only make a group look invalid, which the parity
tests guard against (tests/envs/test_visgym_parsers.py compares with literal_eval on every group of
random texts).
"""

from __future__ import annotations

import ast
import re
import threading
import unicodedata
import warnings

MAX_NESTING = 200  # CPython's tokenizer refuses the 201st simultaneously open bracket (MAXLEVEL)

# A string literal: optional prefix, then a triple-quoted body when the quote is tripled (Python
# commits to that reading), else a single-quoted body.
_STRING_RE = re.compile(
    r"""(?:[rR][bBfF]?|[bBfF][rR]?|[uU])?"""
    r"""(?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"|'(?!'')(?:[^'\\]|\\.)*'|"(?!"")(?:[^"\\]|\\.)*")""",
    re.DOTALL,
)
_NAME_RE = re.compile(r"[^\W\d]\w*")
_NUMBER_RE = re.compile(r"(?:[0-9]|\.[0-9])[0-9A-Za-z_.]*")
_EXPONENT_TAIL_RE = re.compile(r"[+-][0-9][0-9A-Za-z_.]*")
_CONSTS = {"True": True, "False": False, "None": None}
_CLOSE = {"(": ")", "[": "]", "{": "}"}

FAIL = object()  # a group or token literal_eval would not accept


#: ``warnings.catch_warnings`` swaps the process-wide filter list and is not thread-safe: two threads
#: inside it at once can restore each other's filters (leaving "ignore" on, or dropping a caller's
#: filter). Parsers run on threads (rlkit/serve/play.py plays episodes concurrently), so the calls here
#: take turns.
_WARNINGS_LOCK = threading.Lock()


def literal_eval_quiet(source: str):
    """``ast.literal_eval(source)``, or ``FAIL`` where it raises; warnings (e.g. invalid escape
    sequences) are ignored, as with Python's default filters, so the result does not depend on them.
    Thread-safe among its own callers (``_WARNINGS_LOCK``)."""
    try:
        with _WARNINGS_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.literal_eval(source)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError, TypeError, MemoryError, RecursionError
        return FAIL


class LiteralScanner:
    """Parses bracketed literals of ``text`` (single-line, whitespace only spaces: as upstream's
    clean-up leaves it), memoised by start position.

    ``group(start, end, first=None)``: the value ``literal_eval(text[start:end])`` returns, or
    ``FAIL``; ``text[start]`` must be ``(``. With ``first=(value, pos)`` the group's first element is
    replaced by ``value`` and the text resumes at ``pos`` (right after the comma that follows it):
    upstream quotes a bare first name before evaluating.
    """

    def __init__(self, text: str):
        self.text = text
        self._tokens: dict[int, tuple] = {}
        self._atoms: dict[int, tuple] = {}
        self._brackets: list[int] | None = None  # bracket positions not yet primed, ascending

    # -- tokens ---------------------------------------------------------------------------------

    def _token(self, p: int) -> tuple:
        """(kind, value, end) of the token at ``p`` (spaces skipped): kind is "end", "op", "str",
        "bytes", "num", "const", "set" or "bad"."""
        s = self.text
        while p < len(s) and s[p] == " ":
            p += 1
        if p >= len(s):
            return ("end", None, p)
        hit = self._tokens.get(p)
        if hit is not None:
            return hit
        c = s[p]
        if c in "()[]{},:+-":
            return ("op", c, p + 1)  # not memoised: cheap, and most tokens of a runaway output
        if (m := _STRING_RE.match(s, p)) is not None:
            v = literal_eval_quiet(m.group())
            kind = "str" if isinstance(v, str) else "bytes" if isinstance(v, bytes) else "bad"
            tok = (kind, v, m.end())
        elif s.startswith("...", p):
            tok = ("const", ..., p + 3)
        elif (m := _NUMBER_RE.match(s, p)) is not None:
            end = m.end()
            word = m.group()
            if word[-1] in "eE" and not word[:2].lower() in ("0x", "0o", "0b"):
                tail = _EXPONENT_TAIL_RE.match(s, end)
                end = tail.end() if tail else end
            v = literal_eval_quiet(s[p:end])
            ok = type(v) in (int, float, complex)
            tok = ("num", v, end) if ok else ("bad", None, end)
        elif (m := _NAME_RE.match(s, p)) is not None:
            word = m.group()
            if word in _CONSTS:  # keywords only in ASCII; other spellings are names
                tok = ("const", _CONSTS[word], m.end())
            elif unicodedata.normalize("NFKC", word) == "set":  # Python normalises identifiers
                tok = ("set", None, m.end())
            else:
                tok = ("bad", None, m.end())
        else:
            tok = ("bad", None, p + 1)
        self._tokens[p] = tok
        return tok

    # -- expressions ----------------------------------------------------------------------------

    def _atom(self, p: int) -> tuple:
        """(value, kind, end, depth) of the bracketed literal opening at ``p``, or FAIL.

        kind: "num" for a number constant (parentheses add no node), "str"/"bytes" for a
        (parenthesised) string, "set" for a parenthesised bare ``set``, else "other".
        depth: brackets nested inside, this one included."""
        hit = self._atoms.get(p)
        if hit is not None:
            return hit
        result = self._parse_bracket(p, None)
        self._atoms[p] = result
        return result

    def _parse_bracket(self, p: int, first) -> tuple:
        s = self.text
        opener = s[p]
        close = _CLOSE[opener]
        items, depth, q = [], 1, p + 1
        dict_keys = opener == "{" and None  # decided by the first element
        trailing_comma = False
        if first is not None:
            items.append((first[0], "str"))
            q = first[1]
            trailing_comma = True
        while True:
            kind, value, end = self._token(q)
            if kind == "op" and value == close:
                q = end
                break
            if items and not trailing_comma:
                return FAIL
            elem = self._expression(q)
            if elem is FAIL:
                return FAIL
            v, k, q, d = elem
            if k == "set" and (opener != "(" or items):  # a bare name: only "(set)()" is a literal
                return FAIL
            depth = max(depth, d + 1)
            if opener == "{":
                kind, value, end = self._token(q)
                is_pair = kind == "op" and value == ":"
                if dict_keys is None:
                    dict_keys = is_pair
                elif dict_keys != is_pair:
                    return FAIL
                if is_pair:
                    val = self._expression(end)
                    if val is FAIL or val[1] == "set":
                        return FAIL
                    v = (v, val[0])
                    q, depth = val[2], max(depth, val[3] + 1)
            items.append((v, k))
            kind, value, end = self._token(q)
            trailing_comma = kind == "op" and value == ","
            if trailing_comma:
                q = end
        if depth > MAX_NESTING:
            return FAIL
        values = [v for v, _ in items]
        if any(k == "set" for _, k in items) and not (len(items) == 1 and not trailing_comma):
            return FAIL
        try:
            if opener == "(":
                if len(items) == 1 and not trailing_comma:
                    return (values[0], items[0][1], q, depth)  # parenthesised, not a tuple
                return (tuple(values), "other", q, depth)
            if opener == "[":
                return (values, "other", q, depth)
            if dict_keys:
                return (dict(values), "other", q, depth)
            return (set(values), "other", q, depth) if values else ({}, "other", q, depth)
        except TypeError:  # an unhashable dict key or set member: literal_eval raises too
            return FAIL

    def _operand(self, p: int):
        """A sign-free operand: a token or a bracketed literal, then (only for ``set``) ``()``.
        Returns (value, kind, end, depth) or FAIL; kind "set" is a bare (parenthesised) ``set``."""
        kind, value, end = self._token(p)
        depth = 0
        if kind == "op" and value in "([{":
            atom = self._atom(end - 1)
            if atom is FAIL:
                return FAIL
            value, kind, end, depth = atom
        elif kind in ("str", "bytes"):
            pieces = [value]
            while True:  # implicit concatenation
                k2, v2, e2 = self._token(end)
                if k2 not in ("str", "bytes"):
                    break
                if k2 != kind:  # mixing str and bytes
                    return FAIL
                pieces.append(v2)
                end = e2
            value = pieces[0][:0].join(pieces)
        elif kind not in ("num", "const", "set"):
            return FAIL
        k2, v2, e2 = self._token(end)
        if k2 == "op" and v2 in "([":  # a call or subscript: only set() is a literal
            if kind != "set" or v2 != "(":
                return FAIL
            k3, v3, e3 = self._token(e2)
            if not (k3 == "op" and v3 == ")"):
                return FAIL
            value, kind, end, depth = set(), "other", e3, max(depth, 1)
            k2, v2, _ = self._token(end)
            if k2 == "op" and v2 in "([":
                return FAIL
        return (value, kind, end, depth)

    def _signed(self, p: int):
        kind, value, end = self._token(p)
        if kind == "op" and value in "+-":
            inner = self._operand(end)
            if inner is FAIL or inner[1] != "num":  # literal_eval signs only a number constant
                return FAIL
            v, _, q, d = inner
            return ((-v if value == "-" else +v), "signed", q, d)
        return self._operand(p)

    def _expression(self, p: int):
        """An element: a signed operand, optionally ``+``/``-`` a complex constant."""
        left = self._signed(p)
        if left is FAIL:
            return FAIL
        kind, value, end = self._token(left[2])
        if not (kind == "op" and value in "+-"):
            return left
        right = self._signed(end)
        if right is FAIL or right[1] != "num" or not isinstance(right[0], complex):
            return FAIL
        if left[1] not in ("num", "signed") or not isinstance(left[0], (int, float)) or isinstance(left[0], bool):
            return FAIL
        k2, v2, _ = self._token(right[2])
        if k2 == "op" and v2 in "+-":  # a chain: the outer BinOp's left is a BinOp
            return FAIL
        v = left[0] + right[0] if value == "+" else left[0] - right[0]
        return (v, "other", right[2], max(left[3], right[3]))

    # -- groups ---------------------------------------------------------------------------------

    def group(self, start: int, end: int, first=None):
        """``literal_eval(text[start:end])`` (a ``( ... )`` group) or FAIL; see the class docstring."""
        self.prime_from(start)
        if first is None:
            atom = self._atom(start)
        else:
            atom = self._parse_bracket(start, first)
        if atom is FAIL or atom[2] != end or atom[1] == "set":
            return FAIL
        return atom[0]

    def prime_from(self, start: int) -> None:
        """Parse every bracket at or after ``start`` not parsed yet, from the last back, so that a
        group's parse finds its nested brackets memoised (a few frames of recursion, not five per
        nesting level). Call it with decreasing ``start``: each bracket is parsed once in all."""
        if self._brackets is None:
            self._brackets = [m.start() for m in re.finditer(r"[(\[{]", self.text)]
        while self._brackets and self._brackets[-1] >= start:
            self._atom(self._brackets.pop())
