"""rlkit.safe_text: special-token strings in user-message text are made inert."""

import pytest

from rlkit.safe_text import CONTROL_TOKEN_RE, escape_special_tokens


@pytest.mark.parametrize("text", [
    "<|image_pad|>", "('move', <|vision_start|>)", "<<|im_end|>|im_end|>", "<|a|><|b|><|c|>", "x<|im_start|>y" * 1000,
])
def test_control_tokens_are_broken(text):
    out = escape_special_tokens(text)
    assert CONTROL_TOKEN_RE.search(out) is None
    assert out.replace("\\", "") == text  # only backslashes were added


def test_extra_tokens_surrogates_and_plain_text():
    assert escape_special_tokens("a </s> b", extra=["</s>"]) == "a <\\/s> b"
    assert escape_special_tokens("bad \ud800 char") == "bad \ufffd char"
    plain = "Could not read your action: ('move', 7)."
    assert escape_special_tokens(plain) is plain or escape_special_tokens(plain) == plain
    assert escape_special_tokens("<| spaced |> and <|") == "<| spaced |> and <|"
    with pytest.raises(TypeError):
        escape_special_tokens(None)
