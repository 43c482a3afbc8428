"""Live streaming with rlkit's engine: chunks leave the server while the engine is still sampling.

The server's engine is wrapped so that its token callback stops at a chosen token until the test lets it go: a
chunk the client reads while the engine waits there was sent before the engine finished, whatever the timing.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from .conftest import serving
from .test_api import maze_message

MESSAGES = [{"role": "system", "content": "Solve the maze."}, maze_message(2)]
#: The token at which the engine waits (a completion's first pieces come before it).
PAUSE_AT = 6
#: Seconds the engine waits for the test; only a failing test waits that long.
GATE_S = 30.0


class GatedEngine:
    """``engine``'s generate whose token callback waits at the PAUSE_AT-th token of a call until ``gate`` is set
    (at most GATE_S seconds), and sleeps ``slow_s`` after each later token."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.gate = threading.Event()
        self.slow_s = 0.0
        self.reset()

    def reset(self) -> None:
        self.gate.clear()
        self.tokens = 0  # tokens the callback saw in the current call
        self.released = None  # whether the gate opened before its timeout
        self.finished = threading.Event()  # generate returned or raised
        self.raised: BaseException | None = None

    def generate(self, prompts, sampling, on_token=None):
        import time

        def tap(i, k, token_id, logprob, *top):
            self.tokens += 1
            on_token(i, k, token_id, logprob, *top)
            if self.tokens == PAUSE_AT:
                self.released = self.gate.wait(GATE_S)
            elif self.tokens > PAUSE_AT and self.slow_s:
                time.sleep(self.slow_s)

        try:
            return self.engine.generate(prompts, sampling, on_token=tap if on_token is not None else None)
        except BaseException as e:
            self.raised = e
            raise
        finally:
            self.finished.set()


@pytest.fixture(scope="module")
def served(base_dir, adapters):
    """(ServerThread, GatedEngine): the tiny base and adapter "a", no API key."""
    gated: list[GatedEngine] = []

    def wrap(engine) -> GatedEngine:
        gated.append(GatedEngine(engine))
        return gated[0]

    with serving(base_dir, [f"a={adapters['a']}"], wrap_engine=wrap, max_tokens=64, default_max_tokens=16,
                 max_n=2) as srv:
        yield srv, gated[0]


def _events(resp: httpx.Response):
    """The JSON payloads of a server-sent event stream as they arrive (stops at ``[DONE]``)."""
    for line in resp.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        yield json.loads(line[len("data: "):])


@pytest.mark.parametrize("top", [0, 3])
def test_first_content_arrives_while_the_engine_is_still_sampling(served, top):
    """The first text and the first logprobs (with their ``top_logprobs`` when asked) reach the client while the
    engine waits at its PAUSE_AT-th token, and the stream equals the non-streamed answer."""
    srv, gated = served
    body = {"model": "a", "messages": MESSAGES, "max_tokens": 40, "temperature": 0, "logprobs": True}
    if top:
        body["top_logprobs"] = top
    gated.reset()
    gated.gate.set()  # the non-streamed answer, for reference
    once = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).json()
    gated.reset()
    at_first = at_logprobs = None
    texts, entries = [], []
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for chunk in _events(r):
            assert "error" not in chunk, chunk
            for ch in chunk["choices"]:
                piece = ch["delta"].get("content")
                got = (ch["logprobs"] or {}).get("content", [])
                if got and at_logprobs is None:  # the first logprobs: the engine must still be inside generate
                    at_logprobs = (gated.finished.is_set(), gated.tokens, [len(e["top_logprobs"]) for e in got])
                if piece and at_first is None:  # the first text: likewise
                    at_first = (gated.finished.is_set(), gated.tokens)
                if at_first is not None and at_logprobs is not None:
                    gated.gate.set()
                texts.append(piece or "")
                entries += got
    assert gated.released is True, "the engine waited for a chunk that never came before it finished"
    assert at_first is not None and at_first[0] is False and 1 <= at_first[1] <= PAUSE_AT, at_first
    assert at_logprobs is not None and at_logprobs[0] is False and 1 <= at_logprobs[1] <= PAUSE_AT, at_logprobs
    assert at_logprobs[2] and set(at_logprobs[2]) == {top}, at_logprobs  # the top ones came with the first token
    assert gated.tokens > PAUSE_AT + 5 and gated.tokens == once["usage"]["completion_tokens"]
    assert "".join(texts) == once["choices"][0]["message"]["content"]
    assert entries == once["choices"][0]["logprobs"]["content"]  # the sampler's logprobs (and top), token by token


def test_a_client_that_leaves_stops_the_sampling(served):
    """The client closes the stream after its first text: sampling stops at the next token after the server sees
    the close (the engine raises out of generate) instead of running to max_tokens, and the server takes the next
    request. (The engine waits at PAUSE_AT, then takes 3 s for the rest: the server has that long to see it.)"""
    srv, gated = served
    gated.reset()
    gated.slow_s = 0.05  # 60 tokens after the pause take 3 s: far longer than the server takes to see the close
    try:
        body = {"model": "a", "messages": MESSAGES, "max_tokens": 64, "temperature": 0, "stream": True,
                "stop": ["never appears \u2603"]}
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=120) as r:
            for chunk in _events(r):
                if any(ch["delta"].get("content") for ch in chunk["choices"]):
                    break
        gated.gate.set()
        assert gated.finished.wait(60)
        assert type(gated.raised).__name__ == "_ClientGone" and gated.tokens < 64, (gated.raised, gated.tokens)
    finally:
        gated.slow_s = 0.0
    gated.reset()
    gated.gate.set()
    after = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=120)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] >= 1
    health = httpx.get(f"{srv.url}/health").json()
    assert health["server_errors"] == 0 and health["queue"] == 0
