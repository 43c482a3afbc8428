"""The OpenAI Chat Completions wire format as this server speaks it: requests, limits, errors, images.

Shapes follow the OpenAI API reference for ``POST /v1/chat/completions`` (request: ``model``,
``messages``, ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``n``,
``seed``, ``stop``, ``stream`` / ``stream_options.include_usage``, ``logprobs`` / ``top_logprobs``;
response: ``chat.completion`` objects with ``choices`` and ``usage``, or with ``stream`` a server-sent
event stream of ``chat.completion.chunk`` objects ending with ``data: [DONE]``; errors:
``{"error": {"message", "type", "param", "code"}}``), plus vLLM's extra ``top_k``,
``include_stop_str_in_output`` and ``return_tokens_as_token_ids`` parameters. The response types are
checked against the ``openai`` package's own (openai.types.chat.ChatCompletion, ChatCompletionChunk) in
tests/serve/test_openai_types.py.

Everything a client can get wrong is an ``APIError`` with a 4xx status and a message naming the
field; nothing here raises anything else on malformed input. Parameters the server cannot honour
(tools, penalties, logit_bias, ...) are refused with 400, never ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: Image formats accepted in data URLs (what PIL decodes safely and clients send).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")

#: torch.Generator.manual_seed accepts this inclusive range (negative seeds are remapped by torch).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class APIError(Exception):
    """An error answered to the client in the OpenAI error shape.

    status: HTTP status (4xx for client errors). message: what is wrong and how to fix it.
    type: OpenAI error type ("invalid_request_error", "authentication_error", "not_found_error",
    "rate_limit_error", "server_error"). param: the offending request field (e.g. "messages[1].content"),
    or None. code: a short machine-readable code (e.g. "model_not_found"), or None.
    """

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ServeLimits:
    """Per-request limits of the server (all checked before any model work; violations are 4xx).

    max_body_bytes: request body size (bytes; 413 above). Default 16 MiB.
    max_image_bytes: one decoded image file (bytes). Default 8 MiB.
    max_image_pixels: one image's width * height (pixels), checked from the header before the
        pixels are decoded (decompression bombs). Default 4096 * 4096.
    max_images: images in one request, all messages together. Default 32 (an 18-turn interactive
        maze episode sends 18; a 30-turn hard one 30).
    max_tokens: the largest ``max_tokens`` / ``max_completion_tokens`` a request may ask for (tokens
        per choice). Default 1024.
    default_max_tokens: used when the request gives none (capped by the context left). Default 256.
    max_n: the largest ``n`` (choices per request). Default 8.
    max_model_len: prompt tokens + max_tokens must fit (tokens; as vLLM's --max-model-len); None =
        the model's max_position_embeddings.
    max_queue: requests waiting for the model worker beyond which new ones get 429. Default 64.
    """

    max_body_bytes: int = 16 * 1024 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_images: int = 32
    max_tokens: int = 1024
    default_max_tokens: int = 256
    max_n: int = 8
    max_model_len: int | None = None
    max_queue: int = 64

    def validate(self) -> None:
        """Raise ValueError naming a limit that is not a positive int."""
        for name in ("max_body_bytes", "max_image_bytes", "max_image_pixels", "max_images", "max_tokens",
                     "default_max_tokens", "max_n", "max_queue"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"limit {name}={v!r} must be an int >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"limit max_model_len={self.max_model_len!r} must be >= 2")
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(f"default_max_tokens={self.default_max_tokens} exceeds max_tokens={self.max_tokens}")


# ---------------------------------------------------------------------------------------- request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    """``{"type": "text", "text": "..."}``."""

    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    """``{"url": "data:image/png;base64,...", "detail": "auto"}`` (detail is accepted and ignored:
    the policy's image processor decides the resolution)."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    """``{"type": "image_url", "image_url": {"url": ...}}``."""

    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class Message(BaseModel):
    """One chat message. ``developer`` is OpenAI's newer name for ``system`` and is treated as such.
    Extra keys (``name``, ...) are accepted and ignored; tool and function messages are refused."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[Part], None] = None


#: Largest ``top_logprobs`` (OpenAI's limit; vLLM's default --max-logprobs is also 20).
MAX_TOP_LOGPROBS = 20


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` (a last chunk with ``usage`` and no choices; every other
    chunk has ``"usage": null``), OpenAI's ``include_obfuscation`` (accepted; this server adds no
    obfuscation padding) and vLLM's ``continuous_usage_stats`` (refused unless false)."""

    include_usage: bool | None = Field(default=None, strict=True)
    include_obfuscation: bool | None = Field(default=None, strict=True)
    continuous_usage_stats: Literal[False] | None = None


class ChatRequest(BaseModel):
    """The body of ``POST /v1/chat/completions`` (OpenAI fields this server honours, plus vLLM's
    ``top_k``, ``include_stop_str_in_output`` and ``return_tokens_as_token_ids``). Unlisted fields are
    accepted only if ``UNSUPPORTED`` does not refuse their value."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    messages: list[Message] = Field(min_length=1)
    # strict: JSON types as OpenAI documents them; "temperature": true or "max_tokens": "8" is a 400,
    # not coerced (an int is a valid number; a float is not an integer)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    top_k: int | None = Field(default=None, ge=-1, strict=True)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    n: int | None = Field(default=None, ge=1, strict=True)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX, strict=True)
    # OpenAI: up to 4 sequences where generation stops; the returned content leaves the sequence out
    # unless vLLM's extra field include_stop_str_in_output is true (rlkit's rollouts keep it)
    stop: Union[Annotated[str, Field(strict=True)], list[Annotated[str, Field(strict=True)]], None] = None
    include_stop_str_in_output: bool | None = Field(default=None, strict=True)
    # server-sent events (OpenAI's streaming); stream_options only with stream (OpenAI refuses it otherwise)
    stream: bool | None = Field(default=None, strict=True)
    stream_options: StreamOptions | None = None
    # OpenAI: logprobs of the returned tokens, and at each position the top_logprobs most likely (0..20;
    # top_logprobs needs logprobs=true)
    logprobs: bool | None = Field(default=None, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    # vLLM's extra field: each logprobs ``token`` as "token_id:<id>" (exact ids for RL clients)
    return_tokens_as_token_ids: bool | None = Field(default=None, strict=True)

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple (a lone string is one sequence; "" and [] are none)."""
        if isinstance(self.stop, str):
            return (self.stop,) if self.stop else ()
        return tuple(self.stop or ())


#: Most stop sequences per request (OpenAI's limit).
MAX_STOP = 4

#: Request fields whose non-neutral values cannot be honoured: field -> (is the value neutral?, why).
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "tools": (lambda v: v in (None, []), "tools are not supported"),
    "tool_choice": (lambda v: v in (None, "none"), "tool_choice is not supported"),
    "functions": (lambda v: v in (None, []), "functions are not supported"),
    "function_call": (lambda v: v in (None, "none"), "function_call is not supported"),
    "logit_bias": (lambda v: v in (None, {}), "logit_bias is not supported"),
    "presence_penalty": (lambda v: v in (None, 0, 0.0), "presence_penalty is not supported (only 0)"),
    "frequency_penalty": (lambda v: v in (None, 0, 0.0), "frequency_penalty is not supported (only 0)"),
    "repetition_penalty": (lambda v: v in (None, 1, 1.0), "repetition_penalty is not supported (only 1)"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, "response_format other than text is not supported"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only the text output modality is supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "best_of": (lambda v: v in (None, 1), "best_of is not supported"),
    "use_beam_search": (lambda v: v in (None, False), "beam search is not supported"),
}


def _param(loc: tuple) -> str:
    """A pydantic error location as the request field path, e.g. ``messages[1].content[0].image_url.url``
    (pydantic's union-branch and discriminator-tag entries dropped)."""
    out, tagged = "", False
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if part == "str" or part.startswith("list["):
            tagged = "tagged-union" in part
            continue
        if tagged and out.endswith("]"):
            tagged = False  # the discriminator tag right after the list index
            continue
        out += f".{part}" if out else part
    return out


def _validation_error(e: ValidationError) -> APIError:
    errs = e.errors(include_url=False)
    err = max(errs, key=lambda x: len(x.get("loc", ())))  # the most specific branch of a union
    loc = tuple(err.get("loc", ()))
    param = _param(loc)
    if err.get("type") == "missing":
        return APIError(400, f"'{param}' is a required field", param=param or None, code="missing_required_parameter")
    if loc and isinstance(loc[-1], str) and (loc[-1] == "str" or loc[-1].startswith("list[")):
        msg = (f"invalid value for '{param}': must be a string or a list of content parts "
               '({"type": "text", "text": ...} / {"type": "image_url", "image_url": {"url": ...}})')
    else:
        msg = f"invalid value for '{param}': {err.get('msg')}"
    return APIError(400, msg, param=param or None, code="invalid_value")


_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(data: Any) -> tuple[str, str] | None:
    """(field path, the character) of the first string or key in parsed JSON ``data`` holding a lone
    UTF-16 surrogate (JSON's ``"\\ud800"`` escape decodes to one; no UTF-8 encoder accepts it), else None.
    Iterative, so any nesting depth that ``json.loads`` accepted is fine."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            m = _SURROGATE.search(node)
            if m:
                return path, m.group(0)
        elif isinstance(node, dict):
            for k, v in node.items():
                m = _SURROGATE.search(k)
                if m:
                    return path, m.group(0)
                stack.append((f"{path}.{k}" if path else k, v))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node))
    return None


def parse_request(body: bytes) -> ChatRequest:
    """Parse and validate a request body (already size-checked).

    Returns: the ChatRequest.
    Raises: APIError 400 for invalid JSON, a non-object body, a lone surrogate in any string (naming
    where), a missing or ill-typed field (naming it; JSON types are not coerced), ``stream_options``
    without ``stream``, ``top_logprobs`` > 0 without ``logprobs``, or a parameter this server cannot
    honour (``UNSUPPORTED``).
    """
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    where = find_lone_surrogate(data)
    if where is not None:
        path, char = where
        raise APIError(400, f"'{path or '(a key)'}' holds a lone UTF-16 surrogate (\\u{ord(char):04x}), which is not "
                       "valid Unicode text; send each astral character as a surrogate pair or as UTF-8",
                       param=path or None, code="invalid_unicode")
    try:
        req = ChatRequest.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    stop = req.stop_strings()
    if len(stop) > MAX_STOP or any(x == "" for x in stop):
        raise APIError(400, f"'stop' takes at most {MAX_STOP} non-empty strings, got {len(stop)}"
                       f"{' with an empty one' if '' in stop else ''}", param="stop", code="invalid_value")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options",
                       code="invalid_value")
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, f"'top_logprobs'={req.top_logprobs} needs 'logprobs': true", param="top_logprobs",
                       code="invalid_value")
    for key, (neutral, why) in UNSUPPORTED.items():
        try:
            ok = neutral(data.get(key))
        except Exception:  # an unhashable / odd value: not neutral
            ok = False
        if not ok:
            raise APIError(400, f"'{key}': {why}", param=key, code="unsupported_parameter")
    return req


# ----------------------------------------------------------------------------------------- images


_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[^,;]*)*),", re.ASCII)


@dataclass
class DecodedImage:
    """An image from a request: the RGB PIL image and a sha256 of its pixels (mode, size, bytes)."""

    image: Image.Image
    digest: str


_WARNINGS_LOCK = threading.Lock()  # decode_image_url's catch_warnings (the warnings module is not thread-safe)


def decode_image_url(url: str, limits: ServeLimits, param: str) -> DecodedImage:
    """Decode an ``image_url`` into an RGB PIL image, enforcing the image limits.

    Only ``data:image/<fmt>;base64,<payload>`` URLs are accepted (the server never fetches remote
    URLs). The decoded file must be at most ``limits.max_image_bytes`` bytes, one of
    ``IMAGE_FORMATS``, and at most ``limits.max_image_pixels`` pixels (checked from the header,
    before decoding the pixels). Non-RGB images are converted to RGB (alpha dropped); the first
    frame of an animation is used.

    Raises: APIError 400 naming ``param`` (remote URL, not base64, bad base64, too many bytes or
    pixels, unsupported or corrupt image).
    """
    if not url.startswith("data:"):
        raise APIError(400, f"{param}: only data URLs (data:image/png;base64,...) are accepted; "
                       "this server does not fetch remote images", param=param, code="invalid_image_url")
    m = _DATA_URL.match(url)
    if m is None:
        raise APIError(400, f"{param}: malformed data URL (expected data:image/png;base64,<payload>)",
                       param=param, code="invalid_image_url")
    mime = (m.group("mime") or "").lower()
    if not mime.startswith("image/"):
        raise APIError(400, f"{param}: data URL media type {mime or '(none)'!r} is not an image", param=param,
                       code="invalid_image_url")
    if "base64" not in [p.strip().lower() for p in m.group("params").split(";")]:
        raise APIError(400, f"{param}: the data URL must be base64-encoded (data:{mime};base64,...)", param=param,
                       code="invalid_image_url")
    payload = "".join(url[m.end():].split())  # tolerate line-wrapped base64
    if len(payload) // 4 * 3 > limits.max_image_bytes + 3:
        raise APIError(400, f"{param}: image is about {len(payload) // 4 * 3} bytes, more than the limit of "
                       f"{limits.max_image_bytes} bytes", param=param, code="image_too_large")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise APIError(400, f"{param}: invalid base64 in data URL ({e})", param=param, code="invalid_base64") from None
    if len(raw) > limits.max_image_bytes:
        raise APIError(400, f"{param}: image has {len(raw)} bytes, more than the limit of {limits.max_image_bytes}",
                       param=param, code="image_too_large")
    if not raw:
        raise APIError(400, f"{param}: empty image", param=param, code="invalid_image")
    try:
        # catch_warnings swaps the process-wide filter list: two threads inside it at once can restore each
        # other's filters (the bomb warning left an error for everyone, or not an error here), so the
        # header read that may warn runs under a lock; decoding, the slow part, runs outside it.
        with _WARNINGS_LOCK, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)
        w, h = img.size
        if w * h > limits.max_image_pixels:
            raise APIError(400, f"{param}: image is {w}x{h} = {w * h} pixels, more than the limit of "
                           f"{limits.max_image_pixels} pixels", param=param, code="image_too_large")
        img.seek(0)
        img.load()
        rgb = img if img.mode == "RGB" else img.convert("RGB")
    except APIError:
        raise
    except Image.DecompressionBombError:
        raise APIError(400, f"{param}: image dimensions exceed the limit of {limits.max_image_pixels} pixels",
                       param=param, code="image_too_large") from None
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError, bomb errors ...
        raise APIError(400, f"{param}: could not decode the image ({type(e).__name__}: {e}); send a PNG, JPEG, "
                       "WebP, GIF or BMP", param=param, code="invalid_image") from None
    h_ = hashlib.sha256()
    h_.update(f"{rgb.mode}{rgb.size}".encode())
    h_.update(rgb.tobytes())
    return DecodedImage(rgb, h_.hexdigest())


# ---------------------------------------------------------------------------------------- response


#: OpenAI's logprob for a token outside what can be represented ("-9999.0 is used to signify that the token
#: is very unlikely"): a banned id's -inf (JSON has no infinity) is reported as this.
VERY_UNLIKELY = -9999.0


def _finite(lp: float) -> float:
    return lp if lp > VERY_UNLIKELY else VERY_UNLIKELY


def token_logprob(token: str, raw: bytes, logprob: float, top: list[tuple[str, bytes, float]] | None = None
                  ) -> dict[str, Any]:
    """One entry of ``choices[i].logprobs.content`` (openai.types.chat.ChatCompletionTokenLogprob).

    token: the token's text. raw: its UTF-8 bytes (``bytes`` is their list of ints). logprob: natural log
    (values below -9999, including -inf, are reported as -9999.0 as OpenAI does). top: (token, bytes,
    logprob) of the most likely tokens at this position, most likely first ([] when not asked).
    """
    return {"token": token, "logprob": _finite(float(logprob)), "bytes": list(raw),
            "top_logprobs": [{"token": t, "logprob": _finite(float(lp)), "bytes": list(b)} for t, b, lp in top or ()]}


@dataclass
class ChoiceOut:
    """One choice as the server returns it.

    content: the message text (a left-out stop sequence already cut). finish_reason: "stop" | "length".
    stop_reason: the stop sequence that ended it (vLLM's field), else None. logprobs: token_logprob entries,
    one per sampled token (the final ``<|im_end|>`` included, as ``usage.completion_tokens`` counts it), or
    None when the request did not ask for logprobs. deltas: ``content`` split into one piece per sampled
    token (rlkit.serve.tokens.TokenText.deltas), for a stream.
    """

    content: str
    finish_reason: str
    stop_reason: str | None = None
    logprobs: list[dict[str, Any]] | None = None
    deltas: list[str] | None = None


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(model: str, choices: list[ChoiceOut], prompt_tokens: int, completion_tokens: int,
                        fingerprint: str | None = None) -> dict[str, Any]:
    """A ``chat.completion`` object (OpenAI shape; openai.types.chat.ChatCompletion).

    choices: ChoiceOut per choice (``logprobs`` None gives ``"logprobs": null``, else
    ``{"content": [...]}``); ``stop_reason`` is vLLM's extra field.
    prompt_tokens: prompt length in tokens (image placeholder tokens included).
    completion_tokens: sampled tokens over all choices, the end-of-turn token included (as vLLM counts).
    fingerprint: ``system_fingerprint`` (here: names the adapter weights served).
    """
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": c.content},
             "logprobs": None if c.logprobs is None else {"content": c.logprobs},
             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


class ChunkStream:
    """The ``chat.completion.chunk`` objects (openai.types.chat.ChatCompletionChunk) of one streamed answer, made
    one at a time as its tokens come; all share one ``id`` and ``created``.

    model: the served model name. fingerprint: ``system_fingerprint``. include_usage (``stream_options``):
    every chunk has ``"usage": null`` and ``usage`` makes the final chunk with no choices that carries it, as
    OpenAI streams it. The order a stream sends them in: ``completion_chunks``.
    """

    def __init__(self, model: str, fingerprint: str | None = None, include_usage: bool = False) -> None:
        self.model, self.fingerprint, self.include_usage = model, fingerprint, include_usage
        self.id, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def _chunk(self, index: int, delta: dict, logprobs=None, finish=None, **extra) -> dict[str, Any]:
        c = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
             "system_fingerprint": self.fingerprint,
             "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **extra}]}
        if self.include_usage:
            c["usage"] = None
        return c

    def role(self, index: int) -> dict[str, Any]:
        """Choice ``index``'s first chunk: ``delta {"role": "assistant", "content": ""}``."""
        return self._chunk(index, {"role": "assistant", "content": ""})

    def content(self, index: int, piece: str, entry: dict[str, Any] | None = None) -> dict[str, Any]:
        """``delta {"content": piece}``, with one token's logprobs entry (``token_logprob``) when given."""
        return self._chunk(index, {"content": piece}, logprobs=None if entry is None else {"content": [entry]})

    def finish(self, index: int, finish_reason: str, stop_reason: str | None) -> dict[str, Any]:
        """Choice ``index``'s last chunk: ``delta {}`` with ``finish_reason`` and vLLM's ``stop_reason``."""
        return self._chunk(index, {}, finish=finish_reason, stop_reason=stop_reason)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The final chunk of an ``include_usage`` stream: no choices, the usage (as ``completion_response``)."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [],
                "usage": _usage(prompt_tokens, completion_tokens)}


def completion_chunks(model: str, choices: list[ChoiceOut], prompt_tokens: int, completion_tokens: int,
                      fingerprint: str | None = None, include_usage: bool = False) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer whose choices are complete (openai.types.chat.
    ChatCompletionChunk), in order; each is sent as one ``data: <json>`` server-sent event, then ``data: [DONE]``.

    Per choice: a first chunk ``delta {"role": "assistant", "content": ""}``; then, token by token (choices
    interleaved), ``delta {"content": piece}`` with that token's logprobs entry (``{"content": [entry]}``)
    when asked (a chunk whose piece is empty is sent only to carry logprobs); then a last chunk ``delta {}``
    with ``finish_reason`` (and vLLM's ``stop_reason``). With ``include_usage`` (``stream_options``) every
    chunk has ``"usage": null`` and a final chunk with no choices carries the usage, as OpenAI streams it.
    All chunks share one ``id`` and ``created`` (ChunkStream). choices need ``deltas`` (ChoiceOut); the pieces
    of a choice concatenate to its ``content``, so the streamed text is the non-streamed text.

    Raises: ValueError when a choice has no ``deltas`` or its deltas do not add up to its content.
    """
    for i, c in enumerate(choices):
        if c.deltas is None or "".join(c.deltas) != c.content:
            raise ValueError(f"choice {i}: its deltas do not add up to its content")
        if c.logprobs is not None and len(c.logprobs) != len(c.deltas):
            raise ValueError(f"choice {i}: {len(c.logprobs)} logprobs entries for {len(c.deltas)} tokens")
    stream = ChunkStream(model, fingerprint, include_usage)
    out = [stream.role(i) for i in range(len(choices))]
    for t in range(max((len(c.deltas) for c in choices), default=0)):
        for i, c in enumerate(choices):
            if t >= len(c.deltas) or (not c.deltas[t] and c.logprobs is None):
                continue
            out.append(stream.content(i, c.deltas[t], None if c.logprobs is None else c.logprobs[t]))
    out += [stream.finish(i, c.finish_reason, c.stop_reason) for i, c in enumerate(choices)]
    if include_usage:
        out.append(stream.usage(prompt_tokens, completion_tokens))
    return out


def sse_event(data: dict[str, Any] | str) -> bytes:
    """One server-sent event ``data: <json>\\n\\n`` (``data: [DONE]`` for the string "[DONE]"); JSON with
    non-ASCII escaped, so every event encodes whatever text the model sampled."""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=True, allow_nan=False,
                                                          separators=(",", ":"))
    return f"data: {body}\n\n".encode("ascii")
