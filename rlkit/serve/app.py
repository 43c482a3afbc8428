"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) over a ModelHost.

Routes (shapes as the OpenAI API; vLLM's server has the same routes):

    POST /v1/chat/completions    chat completion; ``model`` picks the base or an adapter
    GET  /v1/models              the base and every adapter (OpenAI list of model objects)
    GET  /v1/models/{model}      one of them (404 if unknown)
    GET  /health                 200 {"status": "ok", "models", "queue", "served", "server_errors"}
                                 once the model is loaded (no API key needed)

With an API key (one or several; scripts/serve.py takes ``--api-key``, ``--api-key-env`` or
``VLLM_API_KEY``), every /v1 route needs ``Authorization: Bearer <key>`` (401 with an
``authentication_error`` otherwise), as with ``vllm serve --api-key``. Every error is
``{"error": {"message", "type", "param", "code"}}``; client errors are 4xx (400 invalid request, 401 key,
404 unknown model or route, 405 method, 413 body too large, 429 queue full) and a 5xx only means a
server bug.

Streaming (``"stream": true``): the answer is ``text/event-stream``, one ``data: <chat.completion.chunk>``
event per chunk (rlkit.serve.protocol.completion_chunks: the role, then one content piece per sampled
token, then ``finish_reason``; a usage chunk with ``stream_options.include_usage``) and ``data: [DONE]``.
The chunks leave as the engine samples (its ``on_token`` callback puts each token on a queue the event loop
reads): a token's text is sent once it is sure to begin the final content (rlkit.serve.tokens.StreamPieces:
a character split over tokens waits for its last byte, text that may still become a stop sequence waits for
the end), so the streamed text is exactly the non-streamed content. Logprobs and ``top_logprobs`` stream live
too: the engine hands each token's top ids and logprobs to the callback with the token. (A tokenizer without
byte-level pieces, which StreamPieces needs, gets its chunks once the completion is done: ``completion_chunks``.)
An error found before sampling (a bad parameter, a prompt too long) is a plain JSON error, as with vLLM; one
after the stream began is a last ``data: {"error": ...}`` event before ``[DONE]``. A client that closes its
stream stops the sampling at the next token.

Logprobs (``"logprobs": true``, ``"top_logprobs": k`` <= 20): ``choices[i].logprobs.content`` has one entry
per sampled token, the final ``<|im_end|>`` included (``usage.completion_tokens`` counts it): ``token``
(its text, or vLLM's ``token_id:<id>`` with ``return_tokens_as_token_ids``), ``bytes`` (its own UTF-8
bytes, rlkit.serve.tokens), ``logprob`` and ``top_logprobs``. The quantity is the one the policy samples
from and trains with (rlkit.policy.logprobs: banned ids masked, divided by the temperature, 1 for greedy;
before top-k / top-p truncation), as ``scripts/serve.py --engine vllm`` asks vLLM for
(``--logprobs-mode processed_logprobs``). All of them are the sampler's own values: with ``top_logprobs`` = k
the engine also takes the k most likely ids of the distribution it draws each token from
(``SamplingParams.top_logprobs``, rlkit.policy.TopLogprobs), so a token's logprob equals its own entry in
``top_logprobs`` exactly, and no second forward runs. They agree with the trainer's teacher-forced
compute_logprobs within float32 rounding (tests/policy/test_logprobs.py, tests/policy/test_engine.py,
tests/serve/test_openai_types.py).

Concurrency: requests are parsed and their images decoded on the event loop's thread pool, then
queued to a single model worker thread that builds the prompt, selects the adapter and generates,
one request at a time (the CPU has nothing to gain from overlapping two generations, and the
adapter selection + generation must not interleave); a streamed request holds the worker until its
completion is sampled (not until the client has read it). At most ``limits.max_queue`` requests wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from rlkit.serve.conversation import SampledIds, build_prompt, parse_messages, remember_completion
from rlkit.serve.models import ModelHost
from rlkit.serve.protocol import (APIError, ChatRequest, ChoiceOut, ChunkStream, ServeLimits, completion_chunks,
                                  completion_response, parse_request, sse_event, token_logprob)
from rlkit.serve.tokens import StreamPieces, TokenText

log = logging.getLogger(__name__)

#: A body over the limit is read and dropped up to this many bytes, so the client gets the 413 instead
#: of a reset connection; beyond it the connection is closed after the 413.
DRAIN_CAP_BYTES = 256 * 1024 * 1024


@dataclass
class ServerSettings:
    """What the app needs besides the model.

    limits: ServeLimits. api_key: the bearer token /v1 routes require, or a sequence of tokens any one of
        which is accepted (as ``vllm serve --api-key K1 K2``); None: open.
    num_threads: torch intra-op threads of the model worker (None: torch's default).
    sampled_ids_capacity: completions remembered for exact re-use of sampled ids
        (rlkit.serve.conversation; 0 = always re-tokenize assistant messages).
    """

    limits: ServeLimits
    api_key: str | Sequence[str] | None = None
    num_threads: int | None = None
    sampled_ids_capacity: int = 16384


class _ASCIIJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: an error message quoting a client's odd text (a lone surrogate)
    always encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _api_keys(api_key: str | Sequence[str] | None) -> list[bytes]:
    """sha256 digests of the accepted API keys ([] = open). Raises ValueError for an empty key."""
    if api_key is None:
        return []
    keys = [api_key] if isinstance(api_key, str) else list(api_key)
    if not keys or any(not isinstance(k, str) or not k for k in keys):
        raise ValueError(f"api_key must be a non-empty string or a non-empty list of them, got {api_key!r}")
    return [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]


def _error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return _ASCIIJSONResponse(err.body(), status_code=err.status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, or APIError 413 when it exceeds ``limit`` bytes (see DRAIN_CAP_BYTES), or
    APIError 400 ``client_disconnected`` when the client hangs up before the body is complete."""
    declared = request.headers.get("content-length")
    too_large = APIError(413, f"request body exceeds the limit of {limit} bytes", param=None, code="body_too_large")
    if declared is not None:
        try:
            declared_n = int(declared)
        except ValueError:
            raise APIError(400, f"invalid Content-Length header {declared!r}", code="invalid_header") from None
        if declared_n > DRAIN_CAP_BYTES:
            raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > DRAIN_CAP_BYTES:
                break
    except ClientDisconnect:  # the client's doing, not a server error (nobody reads the answer)
        raise APIError(400, f"the client disconnected after {size} bytes of the request body",
                       code="client_disconnected") from None
    if size > limit:
        raise too_large
    return b"".join(chunks)


def _check_params(req: ChatRequest, host: ModelHost, limits: ServeLimits) -> None:
    """Checks that need no prompt: model name, n, max_tokens."""
    if req.model not in host.names:
        raise APIError(404, f"the model '{req.model}' does not exist; available: {', '.join(host.names)}",
                       param="model", code="model_not_found")
    if (req.n or 1) > limits.max_n:
        raise APIError(400, f"n={req.n} exceeds the limit of {limits.max_n} choices", param="n", code="invalid_value")
    for key in ("max_completion_tokens", "max_tokens"):
        v = getattr(req, key)
        if v is not None and v > limits.max_tokens:
            raise APIError(400, f"{key}={v} exceeds the limit of {limits.max_tokens} tokens", param=key,
                           code="invalid_value")


def _sampling(req: ChatRequest, prompt_len: int, model_len: int, limits: ServeLimits):
    """rlkit SamplingParams for a request (temperature 0 = greedy; OpenAI defaults: temperature 1,
    top_p 1; the engine computes ``top_logprobs`` only when logprobs are asked), or APIError 400 when prompt +
    max_tokens exceed the context (vLLM's check)."""
    from rlkit.policy import SamplingParams

    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    room = model_len - prompt_len
    if room < 1 or (asked is not None and asked > room):
        raise APIError(400, f"this model's maximum context length is {model_len} tokens; the messages take "
                       f"{prompt_len} tokens and {asked or 1} completion tokens were requested",
                       param="messages", code="context_length_exceeded")
    max_new = asked if asked is not None else min(limits.default_max_tokens, room)
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    return SamplingParams(
        temperature=1.0 if req.temperature is None else float(req.temperature),
        top_p=1.0 if req.top_p is None else float(req.top_p),
        top_k=top_k,
        max_new_tokens=int(max_new),
        n=req.n or 1,
        seed=req.seed,
        stop=req.stop_strings(),
        top_logprobs=int(req.top_logprobs or 0) if req.logprobs else 0,
    )


def create_app(host: ModelHost, settings: ServerSettings) -> FastAPI:
    """The FastAPI app serving ``host`` (see the module doc for routes, errors and concurrency).

    Raises: ValueError for invalid ``settings.limits`` (ServeLimits.validate) or an empty API key."""
    settings.limits.validate()
    keys = _api_keys(settings.api_key)
    service = _ChatService(host, settings)
    app = FastAPI(title="rlkit policy server", summary="OpenAI-compatible Chat Completions for rlkit policies",
                  lifespan=service.lifespan)
    app.state.host = host
    app.state.settings = settings
    app.state.sampled_ids = service.sampled
    _add_error_handlers(app, service.counts)
    _add_auth(app, keys)
    _add_routes(app, service)
    return app


def _add_error_handlers(app: FastAPI, counts: dict[str, int]) -> None:
    """Answer every error in the OpenAI shape (see the module doc); a server bug is logged and counted in
    ``counts["server_errors"]``."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        msg = f"{request.method} {request.url.path}: {err.detail}"
        return _error_response(APIError(err.status_code, msg, code=kind))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, err: RequestValidationError):
        return _error_response(APIError(400, f"invalid request: {err.errors()[:1]}", code="invalid_value"))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, err: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        counts["server_errors"] += 1
        return _ASCIIJSONResponse(APIError(500, f"internal server error ({type(err).__name__})",
                                           type="server_error").body(), status_code=500)


def _add_auth(app: FastAPI, keys: list[bytes]) -> None:
    """Require ``Authorization: Bearer <key>`` on the /v1 routes when ``keys`` (``_api_keys``) is not empty."""

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if keys and request.url.path.startswith("/v1"):
            got = request.headers.get("authorization", "")
            scheme, _, token = got.partition(" ")
            digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
            match = False
            for key in keys:  # every key compared, in constant time: the time says nothing about which matched
                match |= hmac.compare_digest(digest, key)
            if scheme.lower() != "bearer" or not match:
                why = "no API key provided (Authorization: Bearer <key>)" if not got else "incorrect API key provided"
                return _error_response(APIError(401, why, type="authentication_error", code="invalid_api_key"))
        return await call_next(request)


def _add_routes(app: FastAPI, service: "_ChatService") -> None:
    """The routes of the module doc: /health, /v1/models, /v1/models/{model}, /v1/chat/completions."""
    host, counts = service.host, service.counts

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": host.names, "queue": counts["pending"], "served": counts["served"],
                "server_errors": counts["server_errors"]}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [host.model_card(n) for n in host.names]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in host.names:
            raise APIError(404, f"the model '{model_id}' does not exist", param="model", code="model_not_found")
        return host.model_card(model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await service.complete(request)


class _ChatService:
    """The chat completions behind the route: requests parsed on the event loop's thread pool, then built, sampled
    and answered on the one model worker thread (see the module doc, "Concurrency").

    ``counts``: requests queued (``pending``), answered (``served``) and failed by a server bug
    (``server_errors``), as /health reports them."""

    def __init__(self, host: ModelHost, settings: ServerSettings) -> None:
        self.host, self.settings, self.limits = host, settings, settings.limits
        self.sampled = SampledIds(settings.sampled_ids_capacity) if settings.sampled_ids_capacity > 0 else None
        self.chat = host.policy.chat
        self.token_text = TokenText(self.chat.tokenizer)
        self.counts: dict[str, int] = {"pending": 0, "served": 0, "server_errors": 0}
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlkit-model",
                                                            initializer=self._init_worker)

    def _init_worker(self) -> None:
        """The model worker's initializer: torch's intra-op threads (``settings.num_threads``; None: torch's default)."""
        if self.settings.num_threads:
            import torch

            torch.set_num_threads(int(self.settings.num_threads))

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        """The app's lifespan: the model worker is shut down (queued requests cancelled) when the app stops."""
        try:
            yield
        finally:
            self.worker.shutdown(wait=True, cancel_futures=True)

    async def complete(self, request: Request):
        """Answer a POST /v1/chat/completions: a JSON completion, or its chunks as server-sent events."""
        body = await _read_body(request, self.limits.max_body_bytes)
        req, turns = await anyio.to_thread.run_sync(self._prepare, body)
        if self.counts["pending"] >= self.limits.max_queue:
            raise APIError(429, f"the server is busy ({self.counts['pending']} requests queued); retry later",
                           type="rate_limit_error", code="server_busy")
        loop = asyncio.get_running_loop()
        if req.stream and self.token_text.byte_level:
            return await self._live_stream(req, turns, loop)
        self.counts["pending"] += 1
        job = loop.run_in_executor(self.worker, self._run, req, turns)
        job.add_done_callback(self._done)
        choices, prompt_tokens, completion_tokens = await job
        self.counts["served"] += 1
        fingerprint = self.host.fingerprint(req.model)
        if not req.stream:
            return JSONResponse(completion_response(req.model, choices, prompt_tokens, completion_tokens, fingerprint))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = completion_chunks(req.model, choices, prompt_tokens, completion_tokens, fingerprint, include_usage)

        async def events():
            for c in chunks:
                yield sse_event(c)
            yield sse_event("[DONE]")

        return _event_stream(events())

    def _prepare(self, body: bytes):
        req = parse_request(body)
        _check_params(req, self.host, self.limits)
        return req, parse_messages(req.messages, self.limits)

    def _done(self, _future) -> None:
        self.counts["pending"] -= 1

    def _token_name(self, req: ChatRequest, token_id: int) -> str:
        """A token as logprobs entries name it: its text, or vLLM's ``token_id:<id>``."""
        return f"token_id:{token_id}" if req.return_tokens_as_token_ids else self.token_text.text(token_id)

    def _entry(self, req: ChatRequest, token_id: int, logprob: float, top=None) -> dict[str, Any]:
        """One logprobs entry (see the module doc, "Logprobs"): a sampled token, its logprob and ``top`` (None, or
        the step's rlkit.policy.TopLogprobs from the engine, whose ids are named as the token is)."""
        raw = self.token_text.raw
        alts = [] if top is None else [(self._token_name(req, i), raw(i), v) for i, v in zip(*top)]
        return token_logprob(self._token_name(req, token_id), raw(token_id), logprob, alts)

    def _logprobs(self, req: ChatRequest, c) -> list[dict[str, Any]]:
        """The logprobs entries of completion ``c``, one per sampled token (its ``top_logprobs`` when asked)."""
        tops = c.top_logprobs if c.top_logprobs is not None else [None] * len(c.token_ids)
        return [self._entry(req, tok, lp, top) for tok, lp, top in zip(c.token_ids, c.logprobs, tops)]

    def _run(self, req: ChatRequest, turns, on_token=None, started=None) -> tuple[list[ChoiceOut], int, int]:
        """(choices, prompt tokens, completion tokens) of a request; runs on the model worker.

        on_token: ModelHost.generate's callback, for a live stream (whose tokens and logprobs it sends: the
        choices then carry neither deltas nor logprobs). started: called once the request is found valid, right
        before sampling (an APIError raised before it is the client's)."""
        live, chat = on_token is not None, self.chat
        prompt = build_prompt(chat, turns, self.sampled)
        sampling = _sampling(req, len(prompt.input_ids), self.host.max_model_len, self.limits)
        if started is not None:
            started()
        completions = self.host.generate(req.model, prompt.input_ids, prompt.image_inputs, sampling,
                                         on_token=on_token)
        choices = []
        for c in completions:
            stop = getattr(c, "stop_reason", None)
            if stop is not None and not req.include_stop_str_in_output:
                text = c.text[: -len(stop)] if c.text.endswith(stop) else c.text  # OpenAI: the stop sequence is left out
            else:  # the content is the sampled text: a later request that sends it back reuses the ids
                text = c.text
                if stop is None or chat.decode(c.token_ids) == c.text:  # (not when the last token reaches past the stop)
                    remember_completion(self.sampled, prompt, c.token_ids, c.text, chat.im_end_id)
            choices.append(ChoiceOut(
                text, c.finish_reason, stop,
                logprobs=self._logprobs(req, c) if req.logprobs and not live else None,
                deltas=self.token_text.deltas(c.token_ids, text) if req.stream and not live else None,
            ))
        return choices, len(prompt.input_ids), sum(len(c.token_ids) for c in completions)

    async def _live_stream(self, req: ChatRequest, turns, loop: asyncio.AbstractEventLoop):
        """Stream a request's tokens as the engine samples them (see the module doc, "Streaming").

        The model worker puts ("started",), then ("token", choice, id, logprob, top) per sampled token (top: the
        step's rlkit.policy.TopLogprobs with ``top_logprobs``, else None), then ("done", result) or ("failed",
        exception) on a queue the event loop reads. An error before "started" is answered as a JSON error; one
        after it ends the stream with an error event (``_live_events``)."""
        queue: asyncio.Queue = asyncio.Queue()
        gone = threading.Event()  # the client left: the worker stops sampling at its next token

        def put(*item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def on_token(k: int, token_id: int, logprob: float, top=None) -> None:
            if gone.is_set():
                raise _ClientGone
            put("token", k, token_id, logprob, top)

        def job() -> None:
            try:
                put("done", self._run(req, turns, on_token=on_token, started=lambda: put("started")))
            except BaseException as e:  # (handed to the event loop, which answers or logs it)
                put("failed", e)

        self.counts["pending"] += 1
        loop.run_in_executor(self.worker, job).add_done_callback(self._done)
        try:
            first = await queue.get()
        except asyncio.CancelledError:  # the client left while the request waited its turn
            gone.set()
            raise
        if first[0] == "failed":
            raise first[1]
        stops, n = req.stop_strings(), req.n or 1
        pieces = [StreamPieces(self.token_text, stops, self.chat.im_end_id) for _ in range(n)]
        fingerprint = self.host.fingerprint(req.model)
        out = ChunkStream(req.model, fingerprint, bool(req.stream_options and req.stream_options.include_usage))
        return _event_stream(self._live_events(req, queue, gone, pieces, out))

    async def _live_events(self, req: ChatRequest, queue: asyncio.Queue, gone: threading.Event,
                           pieces: list[StreamPieces], out: ChunkStream):
        """The server-sent events of a live stream: each choice's role, then its content pieces (and logprobs) as
        ``queue`` brings the sampled tokens, the rest of each choice's content and its finish reason, the usage
        when asked, and ``[DONE]``; a failure after the 200 went out ends it with an error event. ``gone`` is set
        when it ends, so that the worker stops sampling for a client that left."""
        try:
            for k in range(len(pieces)):
                yield sse_event(out.role(k))
            while True:
                item = await queue.get()
                if item[0] == "token":
                    _, k, tok, lp, top = item
                    piece = pieces[k].push(tok)
                    if piece or req.logprobs:
                        entry = self._entry(req, tok, lp, top) if req.logprobs else None
                        yield sse_event(out.content(k, piece, entry))
                    continue
                if item[0] == "failed":
                    raise item[1]
                choices, prompt_tokens, completion_tokens = item[1]
                for k, c in enumerate(choices):
                    rest = pieces[k].close(c.content)
                    if rest:
                        yield sse_event(out.content(k, rest))
                for k, c in enumerate(choices):
                    yield sse_event(out.finish(k, c.finish_reason, c.stop_reason))
                if out.include_usage:
                    yield sse_event(out.usage(prompt_tokens, completion_tokens))
                yield sse_event("[DONE]")
                self.counts["served"] += 1
                return
        except Exception as e:  # after the 200 went out: an error event in the OpenAI shape, as vLLM sends
            log.exception("internal error while streaming a completion")
            self.counts["server_errors"] += 1
            yield sse_event(APIError(500, f"internal server error ({type(e).__name__})", type="server_error").body())
            yield sse_event("[DONE]")
        finally:
            gone.set()


class _ClientGone(Exception):
    """Raised in the engine's token callback to stop sampling for a client that closed its stream."""


def _event_stream(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class ServerThread:
    """Run an app with uvicorn on a background thread (tests, benchmarks): bind, start, stop.

    ``port=0`` picks a free port; ``url`` is ``http://host:port`` once started. Use as a context
    manager or call ``start()`` / ``stop()``. Binds ``host`` only (127.0.0.1 by default).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False,
                                                    timeout_graceful_shutdown=10))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="rlkit-serve", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServerThread":
        """Start serving; returns once uvicorn accepts connections. Raises RuntimeError on timeout."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on {self.url} did not start within {timeout:.0f}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask uvicorn to exit, wait for the thread, close the socket."""
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
