"""The OpenAI-compatible server through the official ``openai`` client: shapes, adapters, limits, errors.

One server for the module (127.0.0.1, free port): the tiny base plus adapters "a" and "b", an API
key, and small limits so the limit cases stay cheap.
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from .conftest import API_KEY, serving

LIMITS = dict(max_body_bytes=1_000_000, max_image_bytes=200_000, max_image_pixels=300 * 300, max_images=3,
              max_tokens=64, default_max_tokens=16, max_n=4)


@pytest.fixture(scope="module")
def server(base_dir, adapters):
    with serving(base_dir, [f"a={adapters['a']}", f"b={adapters['b']}"], api_key=API_KEY, **LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def data_url(img: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode()}"


def maze_message(seed: int = 0, text: str = "Your action?") -> dict:
    from envs.visgym import VisGymMaze

    obs = VisGymMaze(mode="interactive").make().reset(seed)
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(obs.images[0])}},
                                        {"type": "text", "text": text}]}


def ask(client, model: str, messages=None, **kw) -> openai.types.chat.ChatCompletion:
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=model, messages=messages or [maze_message()], **kw)


def test_models_and_health(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["base", "a", "b"]
    assert [getattr(m, "parent", None) for m in models] == [None, "base", "base"]
    assert client.models.retrieve("b").id == "b"
    health = httpx.get(f"{server.url}/health")  # no key needed
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_completion_with_image_has_openai_shape(client):
    resp = ask(client, "a", n=2, temperature=0.8, seed=3)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion" and resp.model == "a"
    assert isinstance(resp.created, int) and resp.system_fingerprint.startswith("a@")
    assert [c.index for c in resp.choices] == [0, 1]
    for c in resp.choices:
        assert c.message.role == "assistant" and isinstance(c.message.content, str)
        assert c.finish_reason in ("stop", "length")
    u = resp.usage
    assert u.prompt_tokens > 81 and 2 <= u.completion_tokens <= 24  # 9x9 maze = 81 image tokens; 2 choices x <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_adapters_differ_and_seeds_reproduce(client):
    msgs = [{"role": "system", "content": "Solve the maze."}, maze_message(1)]
    a1 = ask(client, "a", msgs, temperature=1.0, seed=7).choices[0].message.content
    a2 = ask(client, "a", msgs, temperature=1.0, seed=7).choices[0].message.content
    b = ask(client, "b", msgs, temperature=1.0, seed=7).choices[0].message.content
    base = ask(client, "base", msgs, temperature=1.0, seed=7).choices[0].message.content
    assert a1 == a2, "same adapter, same seed: same sample"
    assert len({a1, b, base}) == 3, "each adapter (and the base) samples differently for the same seed"
    greedy = {m: ask(client, m, msgs, temperature=0).choices[0].message.content for m in ("a", "b", "base")}
    assert len(set(greedy.values())) == 3


def test_concurrent_requests_keep_their_adapter(client):
    """Requests for different adapters in flight together get what each gets alone (greedy)."""
    order = ["a", "b", "base", "a", "b", "base"]
    alone = {m: ask(client, m, temperature=0).choices[0].message.content for m in set(order)}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda m: ask(client, m, temperature=0).choices[0].message.content, order))
    assert got == [alone[m] for m in order]


def test_max_tokens_and_length_finish(client):
    resp = ask(client, "b", max_tokens=3, temperature=0)
    c = resp.choices[0]
    assert resp.usage.completion_tokens <= 3
    assert c.finish_reason == "length" or resp.usage.completion_tokens <= 3


def test_stop_sequences_end_the_choice_as_openai_and_vllm_do(client):
    """The choice ends at the first stop sequence; the content leaves it out (OpenAI) unless vLLM's
    include_stop_str_in_output is set; stop_reason names it (vLLM's field)."""
    free = ask(client, "a", temperature=0, max_tokens=12).choices[0].message.content
    stop = free[3:5]  # two characters from the middle of the greedy answer
    assert len(stop) == 2 and stop.strip(), free
    cut = free[: free.index(stop)]
    left_out = ask(client, "a", temperature=0, max_tokens=12, stop=[stop, "zzzz"]).choices[0]
    assert (left_out.message.content, left_out.finish_reason) == (cut, "stop")
    assert left_out.model_extra.get("stop_reason") == stop
    kept = ask(client, "a", temperature=0, max_tokens=12, stop=stop,
               extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.message.content == cut + stop
    never = ask(client, "a", temperature=0, max_tokens=12, stop=["\u00ff\u00fe"]).choices[0]
    assert never.message.content == free and never.model_extra.get("stop_reason") is None


# ------------------------------------------------------------------------------------- errors


def _noise(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray((np.random.default_rng(seed).random((h, w, 3)) * 255).astype("uint8"))


def _img_msg(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]}]


ERROR_CASES = {
    # name: (request kwargs, status, words expected in the message)
    "bad base64": (dict(model="a", messages=_img_msg("data:image/png;base64,@@not-base64@@")), 400, "base64"),
    "not an image": (dict(model="a", messages=_img_msg("data:image/png;base64," + base64.b64encode(b"hello").decode())),
                     400, "decode"),
    "remote url": (dict(model="a", messages=_img_msg("https://example.com/maze.png")), 400, "data URLs"),
    "too many pixels": (dict(model="a", messages=_img_msg(data_url(Image.new("RGB", (400, 400))))), 400, "pixels"),
    "too many bytes": (dict(model="a", messages=_img_msg(data_url(_noise(290, 290), "BMP"))), 400, "bytes"),
    "too many images": (dict(model="a", messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(Image.new("RGB", (20, 20)))}}] * 4}]), 400, "images"),
    "unknown model": (dict(model="nope", messages=[{"role": "user", "content": "hi"}]), 404, "does not exist"),
    "max_tokens too large": (dict(model="a", messages=[{"role": "user", "content": "hi"}], max_tokens=65), 400,
                             "max_tokens"),
    "n too large": (dict(model="a", messages=[{"role": "user", "content": "hi"}], n=5), 400, "n=5"),
    "temperature out of range": (dict(model="a", messages=[{"role": "user", "content": "hi"}], temperature=3), 400,
                                 "temperature"),
    "empty messages": (dict(model="a", messages=[]), 400, "messages"),
    "ends with assistant": (dict(model="a", messages=[{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "x"}]), 400, "last message"),
    "tool role": (dict(model="a", messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]), 400, "role"),
    "vision token in text": (dict(model="a", messages=[{"role": "user", "content": "<|image_pad|>"}]), 400,
                             "special token"),
    "stream_options without stream": (dict(model="a", messages=[{"role": "user", "content": "hi"}],
                                           stream_options={"include_usage": True}), 400, "stream"),
    "too many stop sequences": (dict(model="a", messages=[{"role": "user", "content": "hi"}],
                                     stop=["a", "b", "c", "d", "e"]), 400, "at most 4"),
    "empty stop sequence": (dict(model="a", messages=[{"role": "user", "content": "hi"}], stop=["x", ""]), 400,
                            "non-empty"),
    "unknown part type": (dict(model="a", messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]), 400, "tag"),
    "body too large": (dict(model="a", messages=[{"role": "user", "content": "x" * 1_100_000}]), 413, "body"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_malformed_requests_get_4xx_with_a_message(client, case):
    kwargs, status, words = ERROR_CASES[case]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**kwargs)
    err = info.value
    assert err.status_code == status, (case, err.status_code, err.body)
    assert isinstance(err.body, dict) and set(err.body) >= {"message", "type", "param", "code"}
    assert words.lower() in err.body["message"].lower(), err.body


def test_missing_fields_and_raw_bodies(client, server):
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.post("/chat/completions", body={"model": "a"}, cast_to=object)  # no messages at all
    with pytest.raises(openai.BadRequestError, match="model"):
        client.post("/chat/completions", body={"messages": [{"role": "user", "content": "hi"}]}, cast_to=object)
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    for raw in (b"{not json", b"[1, 2]", b"", b"\xff\xfe", b'{"model": "a", "messages": "hi"}', b"[" * 200_000,
                b'{"model": "a", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                b'{"model": "a", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'):
        r = httpx.post(f"{server.url}/v1/chat/completions", content=raw, headers=headers, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"], (raw, r.text)
    r = httpx.get(f"{server.url}/v1/nothing-here", headers=headers)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{server.url}/v1/chat/completions", headers=headers)
    assert r.status_code == 405 and "error" in r.json()


def test_api_key_required(server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert info.value.status_code == 401 and "API key" in info.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        ask(bad, "a")
    r = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps({"model": "a"}))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_no_server_error_after_all_of_the_above(client, server):
    """After every malformed request above, the server still answers and answered no 5xx."""
    assert ask(client, "base", temperature=0).choices[0].message.content is not None
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["server_errors"] == 0
