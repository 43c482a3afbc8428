"""The ``vllm serve`` command line equivalent to ``scripts/serve.py`` (vLLM is the GPU server).

Flags follow vLLM's OpenAI-compatible server CLI (``vllm serve``; vLLM 0.23 in the GPU image):
``--served-model-name`` (the base's name), ``--enable-lora``, ``--max-lora-rank`` (one of the
ranks vLLM accepts, rounded up from the adapters' largest r), ``--max-loras`` (adapters active in
one batch), ``--lora-modules name=path`` (the exported PEFT adapters: served under the same names,
so clients and ``scripts/play.py`` do not change), ``--max-model-len``, ``--limit-mm-per-prompt``
(JSON, images per request), ``--generation-config vllm`` (vLLM's neutral sampling defaults instead
of the checkpoint's generation_config.json, e.g. Qwen's top_k/top_p/repetition_penalty, which rlkit
neither trains nor evaluates with), and ``--api-key`` from an environment variable (the key itself
is never printed).

What vLLM does differently from rlkit's server: it re-tokenizes assistant messages of the history
(rlkit.serve.conversation explains why rlkit's server can reuse the sampled ids), decodes with
special tokens skipped, and uses the checkpoint's image processor bounds (``policy.image_min_pixels``
/ ``image_max_pixels`` overrides are not passed on).
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
) -> list[str]:
    """The argv of ``vllm serve`` for this base and these adapters (see the module doc).

    Args:
        base: checkpoint directory or hub id. base_name: served name of the base.
        adapters: served as ``--lora-modules name=path``. max_model_len: tokens.
        max_images: images per request. dtype: vLLM --dtype. api_key_env: name of the
            environment variable holding the key (the argv holds ``$NAME``), or None.
    """
    argv = ["vllm", "serve", base, "--served-model-name", base_name, "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(int(max_model_len)),
            "--limit-mm-per-prompt", json.dumps({"image": int(max_images), "video": 0}),
            "--generation-config", "vllm"]
    if adapters:
        argv += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(max(a.rank() for a in adapters))),
                 "--max-loras", str(len(adapters)), "--lora-modules"]
        argv += [f"{a.name}={a.path}" for a in adapters]
    if api_key_env:
        argv += ["--api-key", f"${api_key_env}"]
    return argv


def format_command(argv: Sequence[str]) -> str:
    """A copy-pasteable shell command, one flag per line; ``$VAR`` arguments stay expandable."""
    def q(a: str) -> str:
        return f'"{a}"' if a.startswith("$") and a[1:].replace("_", "").isalnum() else shlex.quote(a)

    lines, cur = [], [q(argv[0]), q(argv[1]), q(argv[2])]
    for a in argv[3:]:
        if a.startswith("--"):
            lines.append(" ".join(cur))
            cur = [a]
        else:
            cur.append(q(a))
    lines.append(" ".join(cur))
    return " \\\n    ".join(lines)
