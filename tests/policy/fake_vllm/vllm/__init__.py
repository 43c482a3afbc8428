"""A stand-in for vLLM's offline API, enough of it for rlkit/policy/vllm_worker.py, for the default suite's tests of
rlkit.policy.vllm_engine without vLLM (tests/policy/test_vllm_engine.py). Not vLLM: it samples nothing. What it
answers comes from $FAKE_VLLM_SCRIPT (JSON):

    {"pads": <pads each image expands to>, "completions": [[token_ids, finish_reason, stop_reason], ...]}

(the completions are handed out in turn, request after request, sample after sample), and every call it gets is
appended to $FAKE_VLLM_CALLS as one JSON line, so a test can check what the worker asked of vLLM."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

__version__ = "fake"


def _script() -> dict:
    return json.loads(os.environ["FAKE_VLLM_SCRIPT"])


def _record(**call) -> None:
    with open(os.environ["FAKE_VLLM_CALLS"], "a") as f:
        f.write(json.dumps(call) + "\n")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    allowed_token_ids: list | None = None
    stop: list | None = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    index: int
    token_ids: list
    logprobs: list
    finish_reason: str
    stop_reason: object


@dataclass
class _Output:
    prompt_token_ids: list
    outputs: list = field(default_factory=list)


class _Engine:
    def add_lora(self, lora) -> bool:
        if "broken" in lora.lora_path:
            raise RuntimeError(f"fake vLLM cannot read the adapter at {lora.lora_path}")
        _record(op="add_lora", name=lora.lora_name, id=lora.lora_int_id, path=lora.lora_path)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        _record(op="remove_lora", id=lora_id)
        return True


class LLM:
    def __init__(self, **kwargs) -> None:
        _record(op="init", **kwargs)
        self.llm_engine = _Engine()
        self._next = 0

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        script = _script()
        pads, comps = int(script["pads"]), script["completions"]
        import torch

        _record(op="generate", torch_seed=torch.initial_seed(),
                lora=None if lora_request is None else lora_request.lora_int_id,
                prompts=[{"ids": p["prompt_token_ids"],
                          "image_sizes": [list(im.size) for im in p.get("multi_modal_data", {}).get("image", [])]}
                         for p in prompts],
                params=[{k: v for k, v in vars(sp).items() if k != "allowed_token_ids"} for sp in params],
                allowed=[len(sp.allowed_token_ids or []) for sp in params])
        outs = []
        for p, sp in zip(prompts, params):
            ids = []
            for t in p["prompt_token_ids"]:
                ids.extend([t] * pads if t == script["image_pad_id"] else [t])
            out = _Output(prompt_token_ids=ids)
            for k in range(sp.n):
                toks, finish, stop = comps[self._next % len(comps)]
                self._next += 1
                toks = toks[: sp.max_tokens]
                out.outputs.append(_Completion(k, list(toks), [{t: _Logprob(-0.1 * (j + 1))} for j, t in enumerate(toks)],
                                               finish, stop))
            out.outputs.reverse()  # out of order: the worker sorts them by index
            outs.append(out)
        return outs
