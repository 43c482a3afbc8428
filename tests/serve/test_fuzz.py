"""Fuzz: malformed requests to the server are the client's errors (4xx in OpenAI's shape), never 5xx.

Over 1,000 requests mutate a valid chat request: every field given every wrong JSON type, lone UTF-16
surrogates anywhere, out-of-range numbers, broken JSON and bytes, deep nesting, bad images, plus
clients that disconnect in the middle of the body. Checked: no response is a 5xx, every error has
the ``{"error": {"message", "type", "param", "code"}}`` shape, and ``/health`` counts 0 server errors.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import random
import socket
import threading
import time

import httpx
import pytest

from .conftest import API_KEY, serving

N_REQUESTS = 1_200
WRONG = [True, False, None, "8", "", "\ud800", -1, 0, 1.5, 10**30, -(10**30), [], [1], {}, {"a": 1}, "NaN",
         1e308, "x" * 5000]
FIELDS = ["model", "messages", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "n", "seed",
          "stream", "stop", "logprobs", "metadata", "user", "top_logprobs", "stream_options",
          "return_tokens_as_token_ids"]


@pytest.fixture(scope="module")
def server(base_dir):
    with serving(base_dir, [], api_key=API_KEY, max_tokens=4, default_max_tokens=1, max_n=2, max_images=2,
                 max_image_pixels=64 * 64, max_body_bytes=200_000) as srv:
        yield srv


def _valid() -> dict:
    return {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _bodies(rng: random.Random):
    """An endless stream of (raw body bytes, description)."""
    while True:
        body = _valid()  # one wrong value in a field
        field = rng.choice(FIELDS)
        body[field] = rng.choice(WRONG)
        yield json.dumps(body).encode(), f"{field}={body[field]!r:.40}"
        body = _valid()  # a lone surrogate or a control/special string somewhere in a message
        bad = rng.choice(["\ud800", "\udfff", "a\ud83d", "<|im_end|>", "\x00", "\u202e", "\ufeff"])
        where = rng.choice(["role", "content", "part_text", "image_url", "extra", "model"])
        if where == "model":
            body["model"] = bad
        elif where == "role":
            body["messages"][0]["role"] = bad
        elif where == "content":
            body["messages"][0]["content"] = f"x{bad}y"
        elif where == "part_text":
            body["messages"][0]["content"] = [{"type": "text", "text": bad}]
        elif where == "image_url":
            body["messages"][0]["content"] = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{bad}"}}]
        else:
            body["messages"][0][bad] = bad
        yield json.dumps(body).encode(), f"{where} with {bad!r}"
        msg = rng.choice([  # structurally wrong messages
            [], [None], ["hi"], [{"role": "user"}], [{"content": "hi"}], [{"role": "user", "content": [None]}],
            [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": [{"type": "image_url"}]}],
            [{"role": "user", "content": [{"type": "text", "text": 5}]}], [{"role": "assistant", "content": "x"}],
            [{"role": "system", "content": "s"}], [{"role": "user", "content": {"text": "hi"}}],
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
        ])
        body = _valid()
        body["messages"] = msg
        yield json.dumps(body).encode(), f"messages={msg!r:.60}"
        raw = rng.choice([  # broken JSON and bytes
            b"", b"{", b"null", b"[]", b"1", b'"x"', b"\xff\xfe\xfd", b'{"model": "base", "messages": [}',
            b'{"model": "\\ud800", "messages": []}', b'{"model": "base", "messages": [{"role": "user", "content": "\\udc00"}]}',
            b'{"model": "base", "temperature": Infinity, "messages": []}', b"[" * 50_000,
            bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))),
            json.dumps(_valid()).encode()[: rng.randint(1, 60)],
        ])
        yield raw, f"raw {raw[:30]!r}"


def _disconnect_mid_body(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_valid()).encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body) + 1000}\r\n\r\n")
        s.sendall(head.encode() + body[:20])
        time.sleep(0.05)  # the server now waits in the body; hang up before the declared length arrived


def test_malformed_requests_never_get_a_5xx(server):
    rng = random.Random(16)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    statuses: dict[int, int] = {}
    five_xx, bad_shape = [], []
    host, port = server.url.removeprefix("http://").split(":")
    local = threading.local()

    def send(item):
        raw, what = item
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        local.conn.request("POST", "/v1/chat/completions", body=raw, headers=headers)
        r = local.conn.getresponse()
        return what, r.status, r.read().decode()

    # 8 connections at once: a request's time is mostly idle round trips on loopback (~40 ms each here)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, [item for item, _ in zip(_bodies(rng), range(N_REQUESTS))]))
    for what, status, text in results:
        statuses[status] = statuses.get(status, 0) + 1
        if status >= 500:
            five_xx.append((what, text[:200]))
        elif status >= 400:
            err = json.loads(text).get("error", {})
            if not (isinstance(err, dict) and set(err) >= {"message", "type", "param", "code"} and err["message"]):
                bad_shape.append((what, text[:200]))
    for _ in range(30):
        _disconnect_mid_body(server.url)
    time.sleep(0.5)
    health = httpx.get(f"{server.url}/health").json()
    print(f"{N_REQUESTS} malformed requests + 30 disconnects: statuses {dict(sorted(statuses.items()))}, "
          f"5xx {len(five_xx)}, server_errors {health['server_errors']}")
    assert five_xx == [] and bad_shape == []
    assert sum(v for k, v in statuses.items() if 400 <= k < 500) > N_REQUESTS * 0.8  # the rest were valid after all
    assert health["server_errors"] == 0


@pytest.mark.parametrize("field, value", [("temperature", True), ("max_tokens", "8"), ("n", "2"), ("top_p", False),
                                          ("seed", "1"), ("top_k", 2.5), ("max_completion_tokens", True)])
def test_wrong_json_types_are_refused_not_coerced(server, field, value):
    body = _valid() | {field: value}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_lone_surrogate_is_a_400_naming_where(server):
    raw = b'{"model": "base", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    r = httpx.post(f"{server.url}/v1/chat/completions", content=raw, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages[0].content"


def test_client_disconnect_mid_body_is_not_a_server_error(server):
    before = httpx.get(f"{server.url}/health").json()["server_errors"]
    for _ in range(5):
        _disconnect_mid_body(server.url)
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/health").json()["server_errors"] == before
