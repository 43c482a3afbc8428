"""The tiny Qwen3-VL policy: a real ``Qwen3VLForConditionalGeneration`` with random weights.

Built fully offline from a ``Qwen3VLConfig`` (seeded init), the tiny BPE tokenizer of
rlkit.policy.tokenizer and the PIL Qwen2-VL image processor, and saved as an ordinary Hugging Face
checkpoint directory (config.json, model.safetensors, generation_config.json, tokenizer files,
preprocessor_config.json, chat_template.jinja). Every code path that loads Qwen/Qwen3-VL-8B-Instruct
loads this directory the same way.

Vision geometry (the default): patch 4 px, 2x2 spatial merge, image resized to at most 72x72 px.
A VisGym 9x9 maze rendered at 25 px/cell (225x225) resizes to 72x72 -> 18x18 patches -> 9x9 = 81
merged image tokens, one per maze cell (8 px per cell = one 2x2 block of 4 px patches). For 11x11
mazes (275x275) set ``image_max_pixels = 88*88`` to keep one token per cell.

Traps this module handles: ``mrope_section`` must sum to head_dim/2; the vision ``out_hidden_size``
must equal the text hidden size; ``deepstack_visual_indexes`` must index existing vision blocks; the
model vocabulary equals ``len(tokenizer)`` and the config's vision token ids are the tokenizer's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

from rlkit.cache_dir import user_cache_dir
from rlkit.policy.lora import umask_permissions
from rlkit.policy.processor import VIDEO_PROCESSOR_CONFIG, Qwen3VLImageProcessor, write_video_processor_config
from rlkit.policy.tokenizer import (
    IM_END,
    IMAGE_PAD,
    PAD_TOKEN,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tiny_tokenizer,
)

#: Bump when the builder's output changes for the same sizes (invalidates cached checkpoints).
BUILDER_VERSION = 3


@dataclass
class TinyVLSizes:
    """Sizes of the tiny Qwen3-VL (what conf/policy/tiny_vl.yaml ``tiny:`` holds).

    Text decoder: ``text_hidden`` (= vision out_hidden_size), ``text_layers``, ``text_heads`` query
    heads of ``head_dim`` (q dim = heads*head_dim), ``text_kv_heads`` (GQA), ``text_intermediate``
    (SwiGLU width), ``vocab_size`` (tokenizer size incl. 7 special tokens).
    Vision tower: ``vision_hidden``, ``vision_depth`` blocks of ``vision_heads`` heads,
    ``vision_intermediate`` MLP width, ``deepstack_indexes`` (vision blocks whose outputs are added
    to the first len(deepstack_indexes) decoder layers; each < vision_depth).
    Image geometry: ``patch_size`` px, ``merge_size`` (2 -> 2x2 patches per LLM token),
    ``image_min_pixels`` / ``image_max_pixels`` resize bounds of the image processor (pixels).
    ``vision_pos_embed_std``: init std of the vision tower's learned absolute position embedding
    (Hugging Face's default init gives 0.02). At 0.02 the patch contents drown the position code
    (per-cell feature spread 0.14 against a wall/free difference of 0.25) and the language model
    never learns which image token holds a given cell; at 0.5 every image token carries a strong
    code of its (row, column) that a query can match by content, and "is cell (4, 3) a wall?" is
    learned from pixels in < 50 steps (issue 19's probes; the 2D MRoPE positions of image tokens
    alone, with head_dim 32..128 and rope theta 10..1e4, did not give a learnable lookup).
    """

    text_hidden: int = 128
    text_layers: int = 4
    text_heads: int = 4
    text_kv_heads: int = 2
    head_dim: int = 32
    text_intermediate: int = 384
    vocab_size: int = 1024
    vision_hidden: int = 64
    vision_depth: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 128
    deepstack_indexes: list[int] = field(default_factory=lambda: [0])
    patch_size: int = 4
    merge_size: int = 2
    image_min_pixels: int = 16 * 16
    image_max_pixels: int = 72 * 72
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    vision_pos_embed_std: float = 0.5

    def validate(self) -> None:
        """Raise ValueError naming the field when the sizes cannot form a valid Qwen3-VL."""
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"tiny.head_dim={self.head_dim} must be even and >= 6 (mrope needs t/h/w sections)")
        if self.text_heads % self.text_kv_heads:
            raise ValueError(f"tiny.text_heads={self.text_heads} must be a multiple of text_kv_heads={self.text_kv_heads}")
        if self.vision_hidden % self.vision_heads or (self.vision_hidden // self.vision_heads) % 4:
            raise ValueError(
                f"tiny.vision_hidden={self.vision_hidden} / vision_heads={self.vision_heads} must give a head dim "
                "divisible by 4 (2D rotary embedding of the vision tower)"
            )
        bad = [i for i in self.deepstack_indexes if not 0 <= i < self.vision_depth]
        if bad:
            raise ValueError(f"tiny.deepstack_indexes {bad} out of range for vision_depth={self.vision_depth}")
        if len(self.deepstack_indexes) > self.text_layers:
            raise ValueError("tiny.deepstack_indexes has more entries than text_layers")
        if self.image_min_pixels > self.image_max_pixels:
            raise ValueError("tiny.image_min_pixels > tiny.image_max_pixels")
        if not self.vision_pos_embed_std > 0:
            raise ValueError(f"tiny.vision_pos_embed_std={self.vision_pos_embed_std} must be > 0 (0.5 is the default)")

    def mrope_section(self) -> list[int]:
        """[t, h, w] rotary sections summing to head_dim/2 (same 24:20:20 split as Qwen3-VL-8B)."""
        half = self.head_dim // 2
        hw = (half * 5) // 16
        return [half - 2 * hw, hw, hw]

    def vision_grid_side(self) -> int:
        """Side of the learned vision position-embedding grid: the largest patch grid the bounds allow."""
        return max(4, int((self.image_max_pixels**0.5) // self.patch_size) + self.merge_size)


def tiny_config(sizes: TinyVLSizes, tokenizer) -> Qwen3VLConfig:
    """The ``Qwen3VLConfig`` of the tiny policy, with token ids taken from ``tokenizer``."""
    sizes.validate()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (PAD_TOKEN, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)}
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=sizes.text_hidden,
        intermediate_size=sizes.text_intermediate,
        num_hidden_layers=sizes.text_layers,
        num_attention_heads=sizes.text_heads,
        num_key_value_heads=sizes.text_kv_heads,
        head_dim=sizes.head_dim,
        max_position_embeddings=sizes.max_position_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": sizes.rope_theta,
            "mrope_section": sizes.mrope_section(),
            "mrope_interleaved": True,
        },
        pad_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[IM_END],
    )
    vision = dict(
        depth=sizes.vision_depth,
        hidden_size=sizes.vision_hidden,
        intermediate_size=sizes.vision_intermediate,
        num_heads=sizes.vision_heads,
        patch_size=sizes.patch_size,
        spatial_merge_size=sizes.merge_size,
        temporal_patch_size=2,
        out_hidden_size=sizes.text_hidden,
        num_position_embeddings=sizes.vision_grid_side() ** 2,
        deepstack_visual_indexes=list(sizes.deepstack_indexes),
    )
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
        pad_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[IM_END],
    )


def build_tiny_policy(out_dir: str | os.PathLike, sizes: TinyVLSizes | None = None, seed: int = 0, **overrides) -> Path:
    """Build the tiny Qwen3-VL checkpoint (random weights, seeded) into ``out_dir``.

    Args:
        out_dir: directory to create (must not exist or be empty); written atomically (a temp
            sibling renamed into place), so a half-built directory never appears under this name.
        sizes: TinyVLSizes; ``overrides`` are field overrides on top (e.g. ``text_layers=2``).
        seed: torch seed of the weight init (same seed + sizes -> bitwise identical weights).

    Returns:
        Path of the checkpoint directory: loadable with ``Qwen3VLForConditionalGeneration
        .from_pretrained`` / ``AutoModelForImageTextToText``, ``AutoTokenizer`` and
        rlkit.policy.processor.load_processor.

    Raises:
        ValueError: invalid sizes (see TinyVLSizes.validate); FileExistsError: non-empty out_dir.
    """
    sizes = TinyVLSizes(**{**asdict(sizes or TinyVLSizes()), **overrides})
    sizes.validate()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"tiny policy output dir {out} exists and is not empty")
    tokenizer = build_tiny_tokenizer(sizes.vocab_size)
    config = tiny_config(sizes, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).to(torch.float32)
        with torch.no_grad():
            model.model.visual.pos_embed.weight.normal_(0.0, sizes.vision_pos_embed_std)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id],
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=sizes.patch_size,
        merge_size=sizes.merge_size,
        temporal_patch_size=2,
        min_pixels=sizes.image_min_pixels,
        max_pixels=sizes.image_max_pixels,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = Qwen3VLImageProcessor(image_processor, tokenizer, chat_template=tokenizer.chat_template)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / "rlkit_tiny.json").write_text(
            json.dumps({"sizes": asdict(sizes), "seed": seed, "builder_version": BUILDER_VERSION}, indent=2)
        )
        umask_permissions(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def default_cache_dir() -> Path:
    """Where built tiny checkpoints are cached: ``<rlkit.cache_dir.user_cache_dir()>/tiny_vl`` ($RLKIT_CACHE_DIR,
    else $XDG_CACHE_HOME/rlkit, else ~/.cache/rlkit), as conf/policy/tiny_vl.yaml's ``cache_dir`` in a job."""
    return user_cache_dir() / "tiny_vl"


def tiny_checkpoint(sizes: TinyVLSizes | None = None, seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached tiny checkpoint for (sizes, seed), building it on first use.

    The cache key hashes the sizes, the seed, BUILDER_VERSION and the transformers version, so a
    changed recipe never reuses a stale build. Concurrent callers (several workers) serialize on a
    file lock and the build is atomic, so every caller sees either no directory or a complete one.

    Args:
        sizes: TinyVLSizes (None = defaults). seed: init seed.
        cache_dir: cache root (None = default_cache_dir()).

    Returns: the checkpoint directory (``<cache_dir>/<key>``).
    """
    from filelock import FileLock

    sizes = sizes or TinyVLSizes()
    sizes.validate()
    key_src = json.dumps(
        {"sizes": asdict(sizes), "seed": seed, "v": BUILDER_VERSION, "transformers": transformers.__version__},
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    out = root / key
    with FileLock(str(root / f"{key}.lock")):
        if not (out / "config.json").exists() or not (out / "rlkit_tiny.json").exists():
            if out.exists():
                shutil.rmtree(out)
            build_tiny_policy(out, sizes, seed=seed)
        elif not (out / VIDEO_PROCESSOR_CONFIG).exists():
            # Built before the processor wrote a video processor config (vLLM needs one; same weights).
            write_video_processor_config(out, Qwen2VLImageProcessorPil.from_pretrained(out))
    return out
