"""rlkit.policy.vllm_engine without vLLM: what rlkit hands vLLM and how it reads the answer back.

The worker (rlkit/policy/vllm_worker.py) runs for real, in a child process, but against a stand-in for vLLM's offline
API (tests/policy/fake_vllm: it answers scripted completions and records every call). So these tests check rlkit's
side of the boundary: the pipe protocol, the prompt ids with one image pad per image and the PNG images, the sampling
parameters (per-prompt seeds, banned ids, the end-of-turn token, stop strings), the mapping of vLLM's answer to
rlkit's Completion (text cut after the stop string, stop reason), the check of vLLM's expanded prompt ids, adapter ids
per version, errors, and that the process never outlives its engine or its parent. vLLM itself against rlkit's engine:
tests/vllm/test_vllm_rollout.py (`bash scripts/test_vllm.sh`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit.distributed.reaper import (
    pid_alive,  # a zombie (exited, not reaped) counts as gone
)
from rlkit.policy import PromptInput, SamplingParams
from rlkit.policy.vllm_engine import VllmEngine, VllmEngineError, collapse_image_pads

from .conftest import maze_image

FAKE = Path(__file__).resolve().parent / "fake_vllm"


@pytest.fixture
def policy(make_policy):
    return make_policy()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(python wrapper that runs the worker against the stand-in, calls file, set_script(dict))."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={FAKE} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_VLLM_CALLS", str(calls))

    def set_script(script: dict) -> None:
        monkeypatch.setenv("FAKE_VLLM_SCRIPT", json.dumps(script))

    def read_calls() -> list[dict]:
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    return wrapper, read_calls, set_script


def _prompt(policy, seed: int = 0):
    img = maze_image(seed)
    tt = policy.chat.user_turn("Find the goal.", [img], system="You are in a maze.", first=True)
    return PromptInput(input_ids=tt.input_ids, images=[img], **policy.chat.concat_images(tt.image_inputs)), tt


def test_collapse_image_pads_keeps_one_pad_per_image_and_refuses_other_runs():
    P = 7
    assert collapse_image_pads([1, 2, P, P, P, 3, P, P, 4], P, [3, 2]) == [1, 2, P, 3, P, 4]
    assert collapse_image_pads([1, 2, 3], P, []) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"runs \[3, 2\] but its images need \[3, 3\]"):
        collapse_image_pads([1, P, P, P, 3, P, P, 4], P, [3, 3])
    with pytest.raises(ValueError, match="do not belong together"):
        collapse_image_pads([1, P, P, 4], P, [2, 2])


def test_generate_hands_vllm_one_pad_per_image_and_reads_rlkits_completion_back(policy, fake):
    python, calls, set_script = fake
    chat = policy.chat
    p, tt = _prompt(policy)
    pads = chat.num_image_tokens(tt.image_inputs[0])
    stop_text = "</answer>"
    def ids(text):  # the tokens of a text, without the end-of-turn token completion_ids appends
        return list(policy.tokenizer(text, add_special_tokens=False)["input_ids"])

    answer = ids("<answer>up</answer> more")
    set_script({"pads": pads, "image_pad_id": chat.image_pad_id, "completions": [
        [answer, "stop", stop_text],                         # a stop string: text cut right after it
        [chat.completion_ids("left"), "stop", chat.im_end_id],  # ends with the end-of-turn token
        [ids("down down down"), "length", None],
    ]})
    with VllmEngine(policy, max_images=3, probe=False, python=python) as eng:
        out = eng.generate([p], SamplingParams(temperature=0.7, max_new_tokens=24, n=3, seed=11, stop=(stop_text,)))
        assert eng.wait_ready() >= 0 and eng.versions["vllm"] == "fake"
    assert [len(x) for x in out] == [3]
    a, b, c = out[0]
    assert a.token_ids == answer and a.finish_reason == "stop" and a.stop_reason == stop_text
    assert a.text == "<answer>up</answer>"  # rlkit's engine's text for these tokens: cut after the stop string
    assert b.token_ids[-1] == chat.im_end_id and b.stop_reason is None and b.text == "left"
    assert c.finish_reason == "length" and c.text == chat.decode(c.token_ids)
    assert a.logprobs == pytest.approx([-0.1 * (j + 1) for j in range(len(answer))])

    init = next(x for x in calls() if x["op"] == "init")
    assert init["model"] == str(policy.checkpoint) and init["dtype"] == "float32"
    assert init["logprobs_mode"] == "processed_logprobs" and init["generation_config"] == "vllm"
    assert init["enable_lora"] and init["max_loras"] == 1 and init["max_lora_rank"] == 8  # rank 4 -> vLLM's 8
    assert init["enable_tower_connector_lora"] is False  # the test policy's LoRA is on the language model only
    assert init["limit_mm_per_prompt"] == {"image": 3, "video": 0}
    gen = next(x for x in calls() if x["op"] == "generate")
    sent = gen["prompts"][0]
    assert sent["ids"].count(chat.image_pad_id) == 1 and len(sent["ids"]) == len(tt.input_ids) - pads + 1
    assert sent["image_sizes"] == [list(p.images[0].size)]  # the source image, as PNG, decoded there
    sp = gen["params"][0]
    assert sp["seed"] is None and gen["torch_seed"] == 11 and sp["n"] == 3 and sp["temperature"] == 0.7
    assert sp["stop"] == [stop_text] and sp["include_stop_str_in_output"] and sp["stop_token_ids"] == [chat.im_end_id]
    assert sp["ignore_eos"] and sp["logprobs"] == 0 and sp["top_k"] == 0 and sp["top_p"] == 1.0
    assert gen["allowed"] == [policy.vocab_size - len(policy.banned_token_ids)]


def test_expanded_ids_that_differ_from_rlkits_are_refused(policy, fake):
    python, _, set_script = fake
    p, tt = _prompt(policy)
    pads = policy.chat.num_image_tokens(tt.image_inputs[0])
    set_script({"pads": pads + 1, "image_pad_id": policy.chat.image_pad_id,  # another image size than rlkit's
                "completions": [[[5], "length", None]]})
    with VllmEngine(policy, probe=False, python=python) as eng:
        with pytest.raises(VllmEngineError, match=f"expanded prompt 0 to {len(tt.input_ids) + 1} ids, rlkit's has "
                                                  f"{len(tt.input_ids)}"):
            eng.generate([p], SamplingParams(temperature=0.0, max_new_tokens=4))
        # a prompt without its source images cannot go to vLLM
        with pytest.raises(ValueError, match="PromptInput.images"):
            eng.generate([PromptInput(p.input_ids, p.pixel_values, p.image_grid_thw)], SamplingParams(max_new_tokens=4))
        with pytest.raises(ValueError, match="top_k=0, top_p=1"):
            eng.generate([p], SamplingParams(top_p=0.9, max_new_tokens=4))


def test_each_adapter_version_gets_a_new_lora_id_and_the_last_is_dropped(policy, fake, tmp_path):
    python, calls, set_script = fake
    set_script({"pads": 1, "image_pad_id": policy.chat.image_pad_id, "completions": [[[5], "length", None]]})
    text = PromptInput(input_ids=policy.chat.completion_ids("hello"))
    with VllmEngine(policy, probe=False, python=python) as eng:
        for v in (0, 1):
            info = policy.save_adapter(tmp_path / f"v{v}", version=v)
            assert eng.load_adapter(tmp_path / f"v{v}").sha256 == info.sha256
            eng.generate([text], SamplingParams(max_new_tokens=2))
    got = [(c["op"], c.get("id"), c.get("lora")) for c in calls() if c["op"] != "init"]
    assert got == [("add_lora", 1, None), ("generate", None, 1), ("add_lora", 2, None), ("remove_lora", 1, None),
                   ("generate", None, 2)]


def test_a_failing_request_raises_with_vllms_error_and_the_engine_serves_on(policy, fake, tmp_path):
    python, _, set_script = fake
    set_script({"pads": 1, "image_pad_id": policy.chat.image_pad_id, "completions": [[[5], "length", None]]})
    text = PromptInput(input_ids=policy.chat.completion_ids("hello"))
    policy.save_adapter(tmp_path / "broken", version=3)
    with VllmEngine(policy, probe=False, python=python) as eng:
        with pytest.raises(VllmEngineError, match=r"failed: Traceback(.|\n)*fake vLLM cannot read the adapter"):
            eng.load_adapter(tmp_path / "broken")
        assert eng.adapter_info is None  # nothing half-loaded: generate still samples the base
        assert eng.generate([text], SamplingParams(max_new_tokens=1))[0][0].token_ids == [5]


def test_the_process_stops_with_close_and_with_its_parent(policy, fake, tiny_dir):
    python, _, set_script = fake
    set_script({"pads": 1, "image_pad_id": policy.chat.image_pad_id, "completions": [[[5], "length", None]]})
    eng = VllmEngine(policy, probe=False, python=python)
    eng.wait_ready()
    pid = eng.pid
    assert pid_alive(pid)
    eng.close()
    assert not pid_alive(pid)
    eng.close()  # idempotent

    # a parent that dies without a word (SIGKILL: a killed Ray actor) takes its vLLM process with it
    script = (
        "import sys, time\n"
        "from rlkit.policy import load_policy\n"
        "from rlkit.policy.vllm_engine import VllmEngine\n"
        f"pol = load_policy(name='t', path={str(tiny_dir)!r}, device='cpu', dtype='float32', lora={{'rank': 4, 'alpha': 8}})\n"
        f"eng = VllmEngine(pol, probe=False, python={str(python)!r})\n"
        "eng.wait_ready()\n"
        "print(eng.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(child), f"vLLM worker {child} outlived its killed parent"


def test_a_missing_interpreter_is_refused_naming_the_setup_script(policy, tmp_path):
    with pytest.raises(VllmEngineError, match="bash scripts/setup_vllm.sh"):
        VllmEngine(policy, python=tmp_path / "no-python")


def test_lora_on_the_patch_embedding_is_refused(make_policy, fake):
    python, _, _ = fake
    pol = make_policy(lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "proj"]})
    with pytest.raises(ValueError, match="target_modules=all-linear"):
        VllmEngine(pol, python=python)
