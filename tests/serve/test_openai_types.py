"""Streaming, logprobs and API keys, read through the ``openai`` package: its client streams and reads logprobs, and
every raw response (the JSON body, each server-sent chunk) validates strictly against its own pydantic types.

Logprob values are checked against the policy's own teacher-forced logprobs (rlkit.policy.logprobs.compute_logprobs,
what training computes) of the returned token ids, from a second copy of the policy with the adapter loaded in
place; the top_logprobs against the full distribution of that copy. One server for the module: the tiny base plus
adapters "a" and "b", two accepted API keys, float32 (the comparison is token for token).
"""

from __future__ import annotations

import json
import typing

import httpx
import openai
import pytest
import torch
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel

from tests.conftest import TEST_DTYPE

from .conftest import API_KEY, serving
from .test_api import maze_message

pytestmark = pytest.mark.dtype_sensitive

OTHER_KEY = "second-key-456"
LIMITS = dict(max_tokens=64, default_max_tokens=16, max_n=4)
#: Largest |served - teacher-forced| logprob (float32; the engine-vs-training bound of tests/policy/test_logprobs.py).
TOL = 1e-4
#: Keys a response may hold beyond the openai types' fields: vLLM's stop_reason (a choice field).
EXTRAS = {"stop_reason"}


@pytest.fixture(scope="module")
def server(base_dir, adapters):
    with serving(base_dir, [f"a={adapters['a']}", f"b={adapters['b']}"], api_key=[API_KEY, OTHER_KEY],
                 **LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(base_dir, adapters):
    """A second policy with adapter "a" loaded in place (no server code involved)."""
    from rlkit.policy import load_policy
    from rlkit.policy.lora import load_adapter_inplace

    policy = load_policy(name="serve_ref", path=str(base_dir), device="cpu", dtype=TEST_DTYPE,
                         lora={"rank": 4, "alpha": 8})
    load_adapter_inplace(policy.model, adapters["a"])
    policy.model.eval()
    return policy


def check_fields(model: type[BaseModel], data, where: str = "") -> None:
    """Every field the openai type requires is present in the raw JSON (strict validation alone accepts a missing
    Optional field as None), and the JSON holds no key the type does not know (but EXTRAS); recursive."""
    assert isinstance(data, dict), (where, data)
    fields = model.model_fields
    for name, f in fields.items():
        key = f.alias or name
        if f.is_required():
            assert key in data, f"{where}: {model.__name__} requires '{key}'"
    unknown = set(data) - {f.alias or n for n, f in fields.items()} - EXTRAS
    assert not unknown, f"{where}: keys {unknown} are not in {model.__name__}"
    for name, f in fields.items():
        value = data.get(f.alias or name)
        if value is None:
            continue
        for sub in _models_in(f.annotation):
            if isinstance(value, list):
                for i, v in enumerate(value):
                    check_fields(sub, v, f"{where}.{name}[{i}]")
            else:
                check_fields(sub, value, f"{where}.{name}")


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def validate(model: type[BaseModel], data: dict):
    """``model.model_validate(data, strict=True)`` after check_fields."""
    check_fields(model, data, model.__name__)
    return model.model_validate(data, strict=True)


def raw_post(server, body: dict, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def sse_data(resp: httpx.Response) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order (each event one ``data:`` line)."""
    events = [e for e in resp.text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events[:3]
    return [e[len("data: "):] for e in events]


MESSAGES = [{"role": "system", "content": "Solve the maze."}, maze_message(2)]


def test_raw_responses_validate_against_the_openai_types(server):
    body = {"model": "a", "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    plain = raw_post(server, body)
    assert plain.status_code == 200, plain.text
    done = validate(ChatCompletion, plain.json())
    assert done.object == "chat.completion" and done.choices[0].logprobs.content
    entry = plain.json()["choices"][0]["logprobs"]["content"][0]
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 3

    streamed = raw_post(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    data = sse_data(streamed)
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    chunks = [validate(ChatCompletionChunk, json.loads(d)) for d in data[:-1]]
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.usage is None for c in chunks[:-1]) and all("usage" in json.loads(d) for d in data[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == done.usage.model_dump()
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finals) == 1 and finals[0] is chunks[-2] and finals[0].choices[0].finish_reason == done.choices[0].finish_reason
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in entries] == [e.model_dump() for e in done.choices[0].logprobs.content]

    no_usage = sse_data(raw_post(server, {**body, "stream": True}))
    assert all("usage" not in json.loads(d) for d in no_usage[:-1])  # OpenAI sends usage only when asked


#: Logprob requests of the streaming tests: top_logprobs and the sampler's logprobs (both sent live, token by token
#: with the sampler's values) and none (live).
LOGPROB_KINDS = {"top_logprobs": dict(logprobs=True, top_logprobs=2), "logprobs": dict(logprobs=True), "none": {}}


@pytest.mark.parametrize("kind", list(LOGPROB_KINDS))
@pytest.mark.parametrize("model", ["a", "base"])
def test_openai_client_streams_the_non_streamed_answer(client, model, kind):
    """Greedy: the streamed text, finish reason, usage and logprobs are the non-streamed ones (also with a stop
    sequence, which is left out of both or kept with include_stop_str_in_output, with two stop sequences, and with
    n=2 choices interleaved)."""
    for extra in ({}, {"stop": None}, {"stop": None, "extra_body": {"include_stop_str_in_output": True}},
                  {"stop": None, "n": 2}, {"n": 2}):
        kw = dict(model=model, messages=MESSAGES, max_tokens=12, temperature=0, **LOGPROB_KINDS[kind], **extra)
        if "stop" in extra:  # two characters from the middle of the greedy answer (and for n=2 one more stop)
            free = client.chat.completions.create(**{**kw, "stop": None}).choices[0].message.content
            kw["stop"] = [free[3:5]] if kw.get("n", 1) == 1 else [free[7:9], free[3:5]]
            assert free[3:5].strip(), free
        once = client.chat.completions.create(**kw)
        stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        n = kw.get("n", 1)
        for i in range(n):
            mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
            text = "".join(ch.delta.content or "" for ch in mine)
            assert text == once.choices[i].message.content, (model, extra, i)
            assert mine[-1].finish_reason == once.choices[i].finish_reason and \
                all(ch.finish_reason is None for ch in mine[:-1])
            got = [e.model_dump() for ch in mine if ch.logprobs for e in ch.logprobs.content]
            assert got == ([e.model_dump() for e in once.choices[i].logprobs.content] if kind != "none" else [])
        assert chunks[-1].usage.completion_tokens == once.usage.completion_tokens
        if kind != "none":
            assert sum(len(c.logprobs.content) for c in once.choices) == once.usage.completion_tokens
        if "stop" in extra:
            kept = "extra_body" in extra
            assert once.choices[0].finish_reason == "stop"
            assert once.choices[0].message.content.endswith(kw["stop"][-1]) == kept, once.choices[0].message.content


def test_openai_stream_helper_accumulates_the_non_streamed_completion(client):
    """The openai package's own stream accumulator (``chat.completions.stream``, which rebuilds a ChatCompletion
    from the chunks, logprobs included) gets the non-streamed completion."""
    kw = dict(model="b", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=1)
    free = client.chat.completions.create(**kw).choices[0].message.content
    kw["stop"] = free[4:6]  # the helper refuses a "length" finish (it parses the content); a stop sequence ends it
    once = client.chat.completions.create(**kw)
    assert once.choices[0].finish_reason == "stop", free
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == once.choices[0].message.content
    assert final.choices[0].finish_reason == once.choices[0].finish_reason
    assert [e.model_dump() for e in final.choices[0].logprobs.content] == \
        [e.model_dump() for e in once.choices[0].logprobs.content]


def _teacher_forced(policy, ids: list[int], image_inputs, n_completion: int, temperature: float):
    """(logprobs [T] of the last n_completion tokens by compute_logprobs, log-distributions [T, V] at those
    positions from the same model's logits, banned ids at -inf)."""
    from rlkit.policy import PromptInput
    from rlkit.policy.chat import concat_images
    from rlkit.policy.logprobs import compute_logprobs, sequence_batch

    seq = PromptInput(input_ids=ids, **concat_images(image_inputs))
    with torch.no_grad():
        lp, _ = compute_logprobs(policy.model, [seq], temperature=temperature,
                                 banned_token_ids=policy.banned_token_ids, with_entropy=False)
        batch = sequence_batch(policy.model, [seq], padding_side="right")
        logits = policy.model(**batch.model_inputs(), use_cache=False).logits[0].float()  # [L, V]
    tau = temperature if temperature > 0 else 1.0
    logits[:, list(policy.banned_token_ids)] = float("-inf")
    dist = torch.log_softmax(logits / tau, dim=-1)[-n_completion - 1:-1]  # position j predicts token j + 1
    return lp[0, -n_completion:], dist


@pytest.mark.parametrize("temperature, seed", [(0, None), (0.7, 11)])
def test_logprobs_are_the_policys_teacher_forced_logprobs(client, reference, temperature, seed):
    chat = reference.chat
    message = maze_message(3)
    turn = chat.user_turn("Your action?", [_image_of(message)], system="Solve the maze.")
    kw = dict(model="a", messages=[{"role": "system", "content": "Solve the maze."}, message], max_tokens=10,
              temperature=temperature, seed=seed, logprobs=True, n=2)
    with_ids = client.chat.completions.create(**kw, top_logprobs=5, extra_body={"return_tokens_as_token_ids": True})
    sampler = client.chat.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True})  # no top: sampler's
    named = client.chat.completions.create(**kw, top_logprobs=5)
    chunks = list(client.chat.completions.create(**kw, top_logprobs=5, stream=True,
                                                 extra_body={"return_tokens_as_token_ids": True}))
    assert with_ids.usage.prompt_tokens == len(turn.input_ids)
    for i in range(2):
        entries = with_ids.choices[i].logprobs.content
        ids = [int(e.token.removeprefix("token_id:")) for e in entries]
        assert all(e.token.startswith("token_id:") for e in entries)
        assert [int(e.token.removeprefix("token_id:")) for e in sampler.choices[i].logprobs.content] == ids  # same seed
        want, dist = _teacher_forced(reference, [*turn.input_ids, *ids], turn.image_inputs, len(ids), temperature)
        got = torch.tensor([e.logprob for e in entries])
        assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()
        got_sampler = torch.tensor([e.logprob for e in sampler.choices[i].logprobs.content])
        assert torch.allclose(got_sampler, want, atol=TOL, rtol=0), (got_sampler - want).abs().max()
        assert all(e.top_logprobs == [] for e in sampler.choices[i].logprobs.content)  # none asked
        assert [e.logprob for e in sampler.choices[i].logprobs.content] == got.tolist()  # asking top changes nothing
        streamed = [e for c in chunks for ch in c.choices if ch.index == i and ch.logprobs for e in ch.logprobs.content]
        assert [e.model_dump() for e in streamed] == [e.model_dump() for e in entries]  # streamed = non-streamed
        assert (want < -1e-3).any(), "a near-certain completion would not test the values"
        for t, e in enumerate(entries):
            top_vals, top_ids = dist[t].topk(5)
            assert [int(x.token.removeprefix("token_id:")) for x in e.top_logprobs] == top_ids.tolist()
            assert torch.allclose(torch.tensor([x.logprob for x in e.top_logprobs]), top_vals, atol=TOL, rtol=0)
            mine = [x.logprob for x in e.top_logprobs if x.token == e.token]
            assert mine in ([], [e.logprob])  # the token's own entry, when it is among the top, is its logprob
            if temperature == 0:
                assert e.top_logprobs[0].token == e.token  # greedy picks the top token
        # the named tokens: the same positions, each token's text and bytes; the bytes add up to the content
        texts = named.choices[i].logprobs.content
        assert [x.logprob for x in texts] == [e.logprob for e in entries]
        assert [x.token for x in texts] == [chat.tokenizer.decode([j]) for j in ids]
        body = ids[:-1] if ids[-1] == chat.im_end_id else ids
        # (a random policy samples invalid UTF-8 too: the tokenizer decodes it with U+FFFD, as Python does)
        assert bytes(b for x in texts[:len(body)] for b in x.bytes).decode("utf-8", errors="replace") == \
            named.choices[i].message.content
        if ids[-1] == chat.im_end_id:
            assert texts[-1].token == "<|im_end|>" and bytes(texts[-1].bytes) == b"<|im_end|>"


def _image_of(message: dict):
    import base64
    import io

    from PIL import Image

    url = message["content"][0]["image_url"]["url"]
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


BAD = {
    # name: (extra request fields, words in the 400's message, param)
    "top_logprobs without logprobs": ({"top_logprobs": 2}, "needs 'logprobs': true", "top_logprobs"),
    "top_logprobs above 20": ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs"),
    "logprobs not a bool": ({"logprobs": "yes"}, "logprobs", "logprobs"),
    "stream_options without stream": ({"stream_options": {"include_usage": True}}, "only allowed with 'stream'",
                                      "stream_options"),
    "unknown stream option": ({"stream": True, "stream_options": {"include_usage": True, "nope": 1}}, "nope",
                              "stream_options.nope"),
    "continuous usage": ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "continuous_usage_stats",
                         "stream_options.continuous_usage_stats"),
    "stream not a bool": ({"stream": "true"}, "stream", "stream"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_stream_and_logprob_params_are_400_in_the_openai_error_shape(server, case):
    extra, words, param = BAD[case]
    r = raw_post(server, {"model": "a", "messages": [{"role": "user", "content": "hi"}], **extra})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json"), r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert words in err["message"] and err["param"] == param, err


def test_a_stream_that_fails_before_sampling_is_a_json_error(server):
    r = raw_post(server, {"model": "nope", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_api_keys(server):
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    for key in (API_KEY, OTHER_KEY):  # either accepted key
        assert raw_post(server, body, key).status_code == 200
    for key in (None, "wrong", API_KEY + "x", API_KEY[:-1]):
        r = raw_post(server, body, key)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert (err["type"], err["code"]) == ("authentication_error", "invalid_api_key")
        assert ("no API key" if key is None else "incorrect API key") in err["message"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"Authorization": f"Basic {API_KEY}"})
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError) as info:
        list(openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model="a", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert info.value.status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # no key needed


def test_no_server_error_after_all_of_the_above(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["server_errors"] == 0


def test_serve_script_streams_logprobs_to_the_openai_client_with_vllms_key_variable(base_dir, adapters, tmp_path):
    """``scripts/serve.py`` itself (a subprocess, as a user starts it) with the key in VLLM_API_KEY: the openai
    client streams a greedy chat completion with logprobs, equal to the non-streamed one; no key is a 401."""
    import os
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VLLM_API_KEY": "env-key-789", "OMP_NUM_THREADS": "1", "RLKIT_CACHE_DIR": str(tmp_path)}
    log = tmp_path / "serve.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, str(root / "scripts" / "serve.py"), f"policy.dtype={TEST_DTYPE}",
                                 "--adapter", f"a={adapters['a']}", "--port", str(port), "--threads", "1",
                                 "--log-level", "warning"], cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() - t0 < 180, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert "API key required (from VLLM_API_KEY)" in log.read_text()
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0).models.list()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="env-key-789", max_retries=0, timeout=120)
        kw = dict(model="a", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
        once = client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(**kw, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == once.choices[0].message.content
        streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert len(streamed) == once.usage.completion_tokens and all(e.logprob <= 0 for e in streamed)
        assert [e.model_dump() for e in streamed] == [e.model_dump() for e in once.choices[0].logprobs.content]
    finally:
        proc.terminate()
        proc.wait(60)
