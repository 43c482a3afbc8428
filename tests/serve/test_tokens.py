"""rlkit.serve.tokens: a token's bytes (OpenAI's logprobs ``bytes``) and a completion's per-token stream pieces."""

from __future__ import annotations

import pytest

from rlkit.serve.tokens import StreamPieces, TokenText, byte_level_table

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


@pytest.mark.parametrize("text", TEXTS[:3])  # (the last one holds <|im_end|>, which ends a sampled completion)
def test_stream_pieces_without_stop_strings_are_the_deltas(tokenizer, text):
    """Token by token, with no stop string, a live stream sends what ``deltas`` gives for the finished completion."""
    tt = TokenText(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], im_end]
    live = StreamPieces(tt, (), im_end)
    assert [live.push(i) for i in ids] == tt.deltas(ids, text)
    assert live.sent == text and live.close(text) == "" and live.push(ids[0]) == ""  # nothing after the end


def _stream(tokenizer, text, stops, end=True):
    """(pieces per token, the StreamPieces) of ``text``'s tokens (then <|im_end|> when ``end``)."""
    tt = TokenText(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([im_end] if end else [])
    live = StreamPieces(tt, stops, im_end)
    return [live.push(i) for i in ids], live


def test_stream_pieces_hold_back_what_may_become_a_stop_string(tokenizer):
    text = "go left, then up"
    # the completion the engine cuts at ", t" (left out of the content): nothing from "," on is ever sent
    pieces, live = _stream(tokenizer, text, (", t",), end=False)
    assert "".join(pieces) == "go left" and live.close("go left") == ""
    pieces, live = _stream(tokenizer, text, (", t",), end=False)
    assert live.close("go left, t") == ", t"  # include_stop_str_in_output: the rest comes at the close
    # a stop string that never completes: its start is held only while it may still complete
    pieces, live = _stream(tokenizer, text, ("then x",), end=False)
    sent = ["".join(pieces[: k + 1]) for k in range(len(pieces))]
    assert "go left, " in sent and "go left, then" not in sent and sent[-1] == text and live.close(text) == ""
    assert "go left, t" not in sent and "go left, th" not in sent  # held while "t", "th" may begin "then x"
    # a start of a stop string at the end of a completion cut by max_tokens: sent at the close
    pieces, live = _stream(tokenizer, text, ("up!",), end=False)
    assert "".join(pieces) == "go left, then " and live.close(text) == "up"
    pieces, live = _stream(tokenizer, text, ("up!",))
    assert "".join(pieces) == text and pieces[-1] == "up" and live.close(text) == ""  # <|im_end|>: uncut, sent at once
    # several stop strings: each one's start is held (the longest matching end of the text counts)
    pieces, live = _stream(tokenizer, "xyca", ("a!", "ca?"), end=False)
    assert "".join(pieces) == "xy" and live.close("xyca") == "ca"


def test_stream_pieces_hold_a_split_character_and_refuse_a_wrong_content(tokenizer):
    text = "héllo 世界"
    pieces, live = _stream(tokenizer, text, ("界!",), end=False)
    assert "".join(pieces) == "héllo 世" and all("\ufffd" not in p for p in pieces)
    assert live.close(text) == "界"
    with pytest.raises(ValueError, match="not the start"):
        live.close("hello")
    with pytest.raises(ValueError, match="byte-level"):
        StreamPieces(type("T", (), {"byte_level": False})(), (), 0)
