"""Sampled tokens as OpenAI's chat logprobs and streamed deltas describe them.

OpenAI's ``choices[i].logprobs.content[j]`` (openai.types.chat.ChatCompletionTokenLogprob) gives each
token as ``token`` (its text) and ``bytes`` (its UTF-8 bytes, "useful in instances where characters are
represented by multiple tokens and their byte representations must be combined"). Qwen's tokenizers are
byte-level BPE (GPT-2 style): a token may hold part of a character, whose text alone is U+FFFD. So
``TokenText`` gives:

- ``text(id)``: the tokenizer's decode of the one id (U+FFFD for a partial character; the special
  token's name, e.g. ``<|im_end|>``, for a special token), as vLLM's server reports ``token``;
- ``raw(id)``: the token's own bytes: for a byte-level vocabulary, its vocabulary string mapped back
  through the byte-to-character table of byte-level BPE (so the bytes of consecutive tokens
  concatenate to the UTF-8 of their decoded text, partial characters included); for an added token
  (``<|im_end|>``), its content's UTF-8; for any other vocabulary, the UTF-8 of ``text(id)``.

``deltas(ids, content)`` splits a choice's returned ``content`` into one piece per sampled token for a
stream: a token's piece is the text its bytes complete (a character split over tokens arrives with its
last byte); the pieces always concatenate to ``content`` exactly (text past a left-out stop sequence and
the final ``<|im_end|>`` give empty pieces).

``StreamPieces`` does the same while the tokens are still being sampled (a live stream): a piece is sent
as soon as it is sure to begin the final content, and ``close`` gives the rest once the content is known.
"""

from __future__ import annotations

import codecs
from typing import Sequence


def byte_level_table() -> dict[str, int]:
    """Byte-level BPE's character -> byte table: bytes that are printable Latin-1 characters (``!``..``~``,
    ``¡``..``¬``, ``®``..``ÿ``) stand for themselves; the other 68 bytes, in increasing order, for the
    characters U+0100, U+0101, ... (so a space, byte 0x20, is ``Ġ``, U+0120)."""
    own = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in own}
    nxt = 256
    for b in range(256):
        if b not in own:
            table[chr(nxt)] = b
            nxt += 1
    return table


class TokenText:
    """Text and bytes of token ids for one tokenizer (cached per id; see the module doc).

    tokenizer: a transformers tokenizer (``decode``, ``convert_ids_to_tokens``, ``added_tokens_decoder``).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self._table = byte_level_table() if self.byte_level else {}
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = {int(i): str(t) for i, t in added.items()}
        self._text: dict[int, str] = {}
        self._raw: dict[int, bytes] = {}

    def text(self, token_id: int) -> str:
        """The decoded text of one token (U+FFFD where it holds part of a character)."""
        t = self._text.get(token_id)
        if t is None:
            t = self.tokenizer.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._text[token_id] = t
        return t

    def raw(self, token_id: int) -> bytes:
        """The token's own bytes (see the module doc)."""
        b = self._raw.get(token_id)
        if b is None:
            b = self._bytes(int(token_id))
            self._raw[token_id] = b
        return b

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        if self.byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in self._table for c in piece):
                return bytes(self._table[c] for c in piece)
        return self.text(token_id).encode("utf-8", errors="replace")

    def deltas(self, token_ids: Sequence[int], content: str) -> list[str]:
        """One piece of ``content`` per token of ``token_ids`` (see the module doc); ``"".join`` of the
        result is ``content``. Returns [] for no tokens (and then ``content`` must be empty)."""
        if not token_ids:
            if content:
                raise ValueError("a non-empty content needs at least one token to carry it")
            return []
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, emitted, out = "", 0, []
        for tok in token_ids:
            text += dec.decode(self.raw(tok))
            agree = emitted
            limit = min(len(text), len(content))
            while agree < limit and text[agree] == content[agree]:
                agree += 1
            out.append(content[emitted:agree])
            emitted = agree
        out[-1] += content[emitted:]  # whatever the bytes did not reproduce (a non-byte-level decode's cleanup)
        return out


class StreamPieces:
    """One choice's content in pieces, token by token while it is sampled (a live server-sent stream).

    Text is sent only once it is sure to be part of the final content, which rlkit.policy's engine makes by
    decoding the sampled ids and cutting the text at a stop string: a character split over tokens waits for
    its last byte, and from the first place where the text could still become a stop string (a whole one, or
    an end of the text that begins one), everything waits for the end of the completion. ``close(content)``
    then gives the rest, so the pieces and the rest concatenate to the content exactly.

    token_text: the tokenizer's TokenText; it must be byte-level (``TokenText.byte_level``), whose token bytes
        concatenate to the tokenizer's decode of the ids. stops: the request's stop strings.
    end_id: the end-of-turn id (<|im_end|>): its text is no content, and a completion it ends is not cut,
        so it releases the held-back text.

    Raises: ValueError for a tokenizer that is not byte-level.
    """

    def __init__(self, token_text: TokenText, stops: Sequence[str], end_id: int) -> None:
        if not token_text.byte_level:
            raise ValueError("StreamPieces needs a byte-level tokenizer (its token bytes concatenate to its decode)")
        self._tt, self._stops, self._end = token_text, tuple(stops), int(end_id)
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # the decoded text so far (a character still missing bytes not yet in it)
        self._sent = 0  # characters of _text given out as pieces
        self._ended = False

    @property
    def sent(self) -> str:
        """The text given out so far."""
        return self._text[: self._sent]

    def push(self, token_id: int) -> str:
        """The piece that the sampled ``token_id`` makes sure of ("" when none, or after the end-of-turn id)."""
        if self._ended:
            return ""
        if token_id == self._end:
            self._text += self._dec.decode(b"", final=True)
            self._ended = True
            safe = len(self._text)
        else:
            self._text += self._dec.decode(self._tt.raw(token_id))
            safe = self._safe_end()
        piece = self._text[self._sent : safe]
        self._sent = max(self._sent, safe)
        return piece

    def _safe_end(self) -> int:
        """Where the text that may still be cut begins: the first stop string found after what was sent, or the
        longest end of the text that is the start of a stop string; else the text's end. (No stop string can
        begin before ``_sent``: the text there was held back while it could.)"""
        text, end = self._text, len(self._text)
        for stop in self._stops:
            at = text.find(stop, self._sent)
            if at >= 0:
                end = min(end, at)
            for k in range(min(len(stop) - 1, len(text) - self._sent), 0, -1):
                if text.endswith(stop[:k]):
                    end = min(end, len(text) - k)
                    break
        return end

    def close(self, content: str) -> str:
        """The rest of the choice's final ``content`` after the pieces given out.

        Raises: ValueError when the pieces given out are not the start of ``content`` (the tokenizer's decode
        of the ids is not the concatenation of their bytes: a bug, the stream has sent wrong text).
        """
        sent = self.sent
        if not content.startswith(sent):
            raise ValueError(f"streamed {sent!r} is not the start of the completion's content {content[:len(sent) + 20]!r}")
        return content[len(sent):]
