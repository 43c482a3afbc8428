"""rlkit.serve.tokens: a token's bytes (OpenAI's logprobs ``bytes``) and a completion's per-token stream pieces."""

from __future__ import annotations

import pytest

from rlkit.serve.tokens import TokenText, byte_level_table

TEXTS = ["go left, then up", "héllo 世界 🙂 maze", "\u00ff\u00fe\t\n  x", "<|im_end|> is escaped text here"]


@pytest.fixture(scope="module")
def tokenizer(tiny_test_ckpt):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_test_ckpt))


def test_byte_level_table_is_a_bijection_onto_bytes():
    table = byte_level_table()
    assert sorted(table.values()) == list(range(256)) and len(table) == 256
    assert table["Ġ"] == 0x20 and table["A"] == 0x41 and table["Ā"] == 0x00  # space, a printable byte, the first unprintable


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_the_text(tokenizer, text):
    tt = TokenText(tokenizer)
    assert tt.byte_level
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert b"".join(tt.raw(i) for i in ids).decode("utf-8") == text
    split = [i for i in ids if "\ufffd" in tt.text(i)]
    if any(ord(c) > 0x7F for c in text):  # the tiny vocabulary splits non-ASCII characters into byte tokens
        assert split and all(len(tt.raw(i).decode("utf-8", errors="replace")) >= 1 for i in split)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tt.raw(im_end) == b"<|im_end|>" and tt.text(im_end) == "<|im_end|>"


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_and_arrive_with_the_last_byte_of_a_character(tokenizer, text):
    tt = TokenText(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], im_end]
    pieces = tt.deltas(ids, text)
    assert len(pieces) == len(ids) and "".join(pieces) == text and pieces[-1] == ""
    assert all("\ufffd" not in p for p in pieces)  # no half character is ever sent
    for k in range(len(ids)):  # each prefix of pieces is the longest whole-character decode of the prefix of ids
        assert "".join(pieces[:k + 1]) == b"".join(tt.raw(i) for i in ids[:k + 1]).decode("utf-8", "ignore")[:len(text)]
    cut = text[: len(text) // 2]  # a content cut short (a left-out stop sequence): later tokens carry nothing
    pieces = tt.deltas(ids, cut)
    assert "".join(pieces) == cut and len(pieces) == len(ids)
    with pytest.raises(ValueError, match="at least one token"):
        tt.deltas([], "x")
    assert tt.deltas([], "") == []
