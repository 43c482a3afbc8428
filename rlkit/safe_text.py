"""Neutralise special-token strings in text that is shown to the policy as a user message.

An environment's observation text may echo what the model wrote (e.g. a parse-failure feedback
"Could not read your action: ('move', <|image_pad|>) ..."). A model can write such a string with
ordinary tokens even though the special ids themselves are banned from sampling. If that text were
tokenized as is, ``<|image_pad|>`` would become the vision placeholder id (an image-feature count
mismatch in the next forward), ``<|im_end|>`` would close the message early, and so on: a prompt
injection into the chat structure.

``escape_special_tokens`` breaks every such string by inserting a backslash after its first
character (``<|im_end|>`` -> ``<\\|im_end|>``): the text still reads the same to a person and to
the model, but no tokenizer matches it as a special token. It covers every ``<|name|>`` string
(the shape of all Qwen / Qwen-VL control tokens, whatever the tokenizer) plus any extra strings
given (a tokenizer's own special tokens). It also replaces lone UTF-16 surrogates, which no UTF-8
tokenizer can encode, by U+FFFD.
"""

from __future__ import annotations

import re
from typing import Iterable

#: ``<|name|>``: the shape of every Qwen control token (``<|im_start|>``, ``<|image_pad|>``, ...).
CONTROL_TOKEN_RE = re.compile(r"<\|[^<>|\s]{1,64}\|>")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _break(match: re.Match) -> str:
    s = match.group(0)
    return s[0] + "\\" + s[1:]


def escape_special_tokens(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with every special-token string made inert (see the module doc).

    Args:
        text: any str (model echoes included: huge, unicode, lone surrogates).
        extra: further literal strings to neutralise (a tokenizer's special tokens), each >= 2 chars.

    Returns: the text with ``<\\|`` in place of each ``<|`` that opens a ``<|name|>`` token (or a
    backslash after the first character of each ``extra`` occurrence) and U+FFFD for lone
    surrogates; the text unchanged when it holds none (the common case costs one regex scan).

    Raises: TypeError if ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected a str, got {type(text).__name__}")
    extra = sorted({t for t in extra if len(t) >= 2 and not CONTROL_TOKEN_RE.fullmatch(t)}, key=len, reverse=True)
    pattern = CONTROL_TOKEN_RE
    if extra:
        pattern = re.compile(CONTROL_TOKEN_RE.pattern + "|" + "|".join(re.escape(t) for t in extra))
    text = _SURROGATE_RE.sub("\ufffd", text)
    # Each pass breaks every match; a break cannot create a new ``<|`` pair, so this ends after a
    # pass or two (nested look-alikes such as ``<<|x|>|y|>``). The cap only guards odd ``extra``.
    for _ in range(16):
        new = pattern.sub(_break, text)
        if new == text:
            return text
        text = new
    return pattern.sub("\ufffd", text)
