"""The check after each load: one probe prompt through vLLM, its greedy answer against rlkit's (the trainer's).

vLLM loads what it can of an adapter and drops the rest without an error (issue 63: the vision-side modules
without ``enable_tower_connector_lora``, a Conv3d patch embedding always), and a prompt whose images are
expanded twice or a chat template that differs from rlkit's layout also answers without error. So after a
(re)load, rlkit runs one prompt through the engine and compares, for the same weights:

- the prompt's token ids (vLLM expands each image placeholder itself; they must equal rlkit's ids),
- the greedy tokens (equal, token for token; in bf16/fp16 a near tie may flip, see below),
- their logprobs (within ``logprob_atol``: FLOAT32_LOGPROB_ATOL in float32, BF16_LOGPROB_ATOL in bf16/fp16, where
  two kernels' rounding alone moves logprobs by ~1e-2). A dropped module can leave greedy tokens unchanged on a
  short probe (issue 63: 8 of 8 equal with the patch-embedding LoRA dropped) while its logprobs move by ~1e-2,
  so in float32 the logprobs are what catches it; in bf16 the probe catches only larger differences (a missing or
  wrong adapter, another base, another prompt), not a dropped patch-embedding LoRA, which rlkit refuses up front.

Near ties (bf16/fp16 only, ``allow_near_ties``): greedy decoding of two bf16 kernels can pick different tokens
where the top two are within rounding. The first position k where the tokens differ is accepted when vLLM's
logprob of its own pick is within the tolerance of rlkit's logprob of rlkit's pick (both are their model's top
choice: a tie) and, where rlkit can score vLLM's tokens (``rescore``: rlkit's teacher-forced logprobs of vLLM's
tokens), when rlkit's logprob of vLLM's pick is within the tolerance of rlkit's top choice too; positions after k
are then compared with ``rescore`` (vLLM's logprobs against rlkit's of the same tokens), or not at all without it.

and raises ``ProbeMismatch`` naming what differs and where. rlkit's side (``trainer_probe``) is rlkit's own
engine (``rlkit.serve.models.ModelHost``, i.e. ``rlkit.policy.TransformersEngine``) with the adapter loaded;
its logprobs are log_softmax over the ids rlkit may sample (banned ids masked, rlkit.policy.logprobs), so
vLLM is asked for the same quantity: ``allowed_token_ids`` = the complement of the banned ids, and the engine
started with ``logprobs_mode=processed_logprobs`` (logprobs after that mask; vLLM's default ``raw_logprobs``
ignores it). tests/vllm/test_vllm_parity.py measures the agreement and checks that the probe catches a
dropped patch-embedding LoRA.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from rlkit.policy.vllm_facts import (  # noqa: F401 (moved to rlkit.policy.vllm_facts, re-exported)
    BF16_LOGPROB_ATOL,
    FLOAT32_LOGPROB_ATOL,
    ProbeAnswer,
    ProbeMismatch,
    compare_probe,
    logprob_atol_for,
    near_ties_allowed,
)


def allowed_token_ids(vocab_size: int, banned: Sequence[int]) -> list[int]:
    """The ids rlkit may sample: 0..vocab_size-1 without ``banned`` (vLLM's ``allowed_token_ids``)."""
    b = {int(i) for i in banned}
    return [i for i in range(int(vocab_size)) if i not in b]


# ------------------------------------------------------------------------------------------ rlkit's side
def probe_observation(env_spec, seed: int | None = None):
    """(observation, system prompt, seed) of the probe: the opening turn of the env's first evaluation task
    (or task ``seed``)."""
    if seed is None:
        seed = int(next(iter(env_spec.eval_seeds())))
    env = env_spec.make()
    obs = env.reset(seed)
    return obs, env.system_prompt, seed


def probe_messages(observation, system: str | None) -> list[dict[str, Any]]:
    """The probe as Chat Completions messages, built as scripts/play.py builds a turn (PNG data URLs)."""
    from rlkit.serve.play import observation_message

    return ([{"role": "system", "content": system}] if system else []) + [observation_message(observation)]


def trainer_probe(host, name: str, observation, system: str | None, max_tokens: int) -> ProbeAnswer:
    """rlkit's greedy answer to the probe from ``host`` (an rlkit.serve.models.ModelHost) with model ``name``
    (the base's served name or an adapter's): the prompt as rlkit.rollout builds it (``chat.user_turn``)."""
    from rlkit.policy import SamplingParams

    chat = host.policy.chat
    tt = chat.user_turn(observation.text, observation.images, system=system, first=True)
    c = host.generate(name, tt.input_ids, list(tt.image_inputs),
                      SamplingParams(temperature=0.0, max_new_tokens=int(max_tokens), n=1, seed=0))[0]
    return ProbeAnswer(prompt_ids=list(tt.input_ids), token_ids=list(c.token_ids), logprobs=list(c.logprobs))


# ------------------------------------------------------------------------------------------- vLLM's side
def probe_llm(llm, prompt: dict[str, Any], expected: ProbeAnswer, what: str, lora_request=None,
              allowed: Sequence[int] | None = None, logprob_atol: float | None = FLOAT32_LOGPROB_ATOL) -> float:
    """Run the probe through an in-process ``vllm.LLM`` (a rollout engine) and compare with ``expected``.

    Args:
        prompt: vLLM's prompt dict ({"prompt": chat text with one image pad per image, "multi_modal_data"}).
        expected: rlkit's answer (``trainer_probe`` or the same quantities). what: named in the error.
        lora_request: the adapter just loaded (vllm.lora.request.LoRARequest) or None for the base.
        allowed: vLLM's allowed_token_ids (``allowed_token_ids``); the LLM must have been built with
            ``logprobs_mode="processed_logprobs"`` for its logprobs to be comparable.
    Returns the largest |logprob difference|. Raises ProbeMismatch (see compare_probe).
    """
    import vllm

    sp = vllm.SamplingParams(temperature=0.0, max_tokens=len(expected.token_ids), logprobs=0, seed=0,
                             allowed_token_ids=list(allowed) if allowed is not None else None,
                             skip_special_tokens=False)
    out = llm.generate([prompt], sp, lora_request=lora_request, use_tqdm=False)[0]
    toks = list(out.outputs[0].token_ids)
    lps = None
    if out.outputs[0].logprobs is not None:
        lps = [out.outputs[0].logprobs[k][t].logprob for k, t in enumerate(toks)]
    got = ProbeAnswer(prompt_ids=list(out.prompt_token_ids), token_ids=toks, logprobs=lps)
    return compare_probe(what, expected, got, logprob_atol)


def _post(url: str, body: dict, api_key: str | None, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise ProbeMismatch(f"vLLM probe request to {url} failed: HTTP {e.code}: {e.read()[:500]!r}") from e


def server_probe(base_url: str, model: str, messages: list[dict[str, Any]], max_tokens: int,
                 allowed: Sequence[int] | None = None, api_key: str | None = None,
                 timeout: float = 300.0) -> ProbeAnswer:
    """vLLM's greedy answer to the probe from its OpenAI server (``base_url`` ending in /v1), with the
    prompt and sampled token ids (vLLM's ``return_token_ids``) and the sampled tokens' logprobs."""
    body = {"model": model, "messages": messages, "temperature": 0.0, "max_tokens": int(max_tokens), "n": 1,
            "seed": 0, "logprobs": True, "top_logprobs": 0, "return_token_ids": True, "skip_special_tokens": False}
    if allowed is not None:
        body["allowed_token_ids"] = list(allowed)
    r = _post(base_url.rstrip("/") + "/chat/completions", body, api_key, timeout)
    choice = r["choices"][0]
    toks = choice.get("token_ids")
    if toks is None or r.get("prompt_token_ids") is None:
        raise ProbeMismatch(f"vLLM at {base_url} returned no token ids (return_token_ids): a vLLM without it "
                            "cannot be probed; serve with rlkit's engine or pass --no-probe")
    content = (choice.get("logprobs") or {}).get("content") or []
    lps = [float(t["logprob"]) for t in content] if len(content) == len(toks) else None
    return ProbeAnswer(prompt_ids=list(r["prompt_token_ids"]), token_ids=list(toks), logprobs=lps)
