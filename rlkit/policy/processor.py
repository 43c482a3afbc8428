"""Image-only Qwen3-VL processor and the one loader every policy uses.

Why a subclass: ``Qwen3VLProcessor`` requires a video processor, and the Qwen-VL video processors
import torchvision, which is not (and must not be) installed next to this torch build. rlkit's
envs send images only, so the processor here is ``Qwen3VLProcessor`` without the video part, and
the image processor is the PIL backend one (``Qwen2VLImageProcessorPil``, what Qwen3-VL checkpoints
use through ``AutoImageProcessor``; the fast torchvision backend would resize slightly
differently). The same loader is used for the tiny checkpoint and for Qwen/Qwen3-VL-*; sampling and
training see identically processed pixels on every machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen3VLProcessor
from transformers.image_utils import SizeDict


class Qwen3VLImageProcessor(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` without a video processor (images and text only).

    Same ``__call__`` / ``apply_chat_template`` behaviour as upstream for images and text; passing
    ``videos=`` raises ``ValueError``. Saves with ``save_pretrained`` as a standard processor
    (preprocessor_config.json, tokenizer files, chat_template.jinja).
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def save_pretrained(self, save_directory, **kwargs):
        """Save like upstream, recorded as ``Qwen3VLProcessor`` (processor_config.json and
        tokenizer_config.json), so standard tooling (AutoProcessor where torchvision is installed,
        vLLM) opens the directory as an ordinary Qwen3-VL checkpoint.

        Also writes ``video_preprocessor_config.json`` (a ``Qwen3VLVideoProcessor`` with the image
        processor's patch/merge/temporal sizes and normalisation), as every Qwen3-VL release ships:
        ``Qwen3VLProcessor.from_pretrained`` -- what vLLM calls for any Qwen3-VL model -- requires a
        video processor and fails with ``OSError: Can't load video processor`` without one (issue 63).
        rlkit never reads it (images only)."""
        out = super().save_pretrained(save_directory, **kwargs)
        write_video_processor_config(save_directory, self.image_processor)
        for name in ("processor_config.json", "tokenizer_config.json"):
            f = Path(save_directory) / name
            if f.exists():
                data = json.loads(f.read_text())
                if "processor_class" in data:
                    data["processor_class"] = "Qwen3VLProcessor"
                    f.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return out

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError("rlkit's Qwen3-VL processor handles images only (no video processor without torchvision)")
        return super().__call__(images=images, text=text, videos=None, **kwargs)


VIDEO_PROCESSOR_CONFIG = "video_preprocessor_config.json"


def write_video_processor_config(save_directory: str | os.PathLike, image_processor) -> Path:
    """Write ``video_preprocessor_config.json`` for ``image_processor``'s geometry into ``save_directory``.

    Args:
        save_directory: the checkpoint folder (exists).
        image_processor: a Qwen2-VL image processor (``patch_size``, ``merge_size``,
            ``temporal_patch_size``, ``image_mean``, ``image_std`` are copied; the video resize bounds
            keep Qwen3-VL's defaults).

    Returns:
        The path written. Instantiating ``Qwen3VLVideoProcessor`` directly needs no torchvision.
    """
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    video = Qwen3VLVideoProcessor(
        patch_size=int(image_processor.patch_size),
        merge_size=int(image_processor.merge_size),
        temporal_patch_size=int(image_processor.temporal_patch_size),
        image_mean=list(image_processor.image_mean),
        image_std=list(image_processor.image_std),
    )
    out = Path(save_directory) / VIDEO_PROCESSOR_CONFIG
    data = json.loads(video.to_json_string())
    data["processor_class"] = "Qwen3VLProcessor"
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out


def load_processor(
    path: str | os.PathLike,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    **hub_kwargs,
) -> Qwen3VLImageProcessor:
    """Load tokenizer + PIL image processor of a Qwen3-VL checkpoint into an image-only processor.

    Args:
        path: a local checkpoint directory or a Hub model id (resolved by ``from_pretrained``; with
            HF_HUB_OFFLINE=1 only the local cache is read).
        min_pixels, max_pixels: override the image processor's resize bounds (pixels; None keeps
            the checkpoint's ``size.shortest_edge`` / ``size.longest_edge``).
        hub_kwargs: passed to both ``from_pretrained`` calls (e.g. ``local_files_only``).

    Returns:
        Qwen3VLImageProcessor whose ``chat_template`` is the checkpoint's.

    Raises:
        OSError: files not found locally and not downloadable (the caller turns this into a
            message naming the model and the fix).
    """
    tokenizer = AutoTokenizer.from_pretrained(path, **hub_kwargs)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, **hub_kwargs)
    if min_pixels is not None or max_pixels is not None:
        lo = int(min_pixels) if min_pixels is not None else int(image_processor.size["shortest_edge"])
        hi = int(max_pixels) if max_pixels is not None else int(image_processor.size["longest_edge"])
        if lo > hi:
            raise ValueError(f"image min_pixels {lo} > max_pixels {hi}")
        image_processor.size = SizeDict(shortest_edge=lo, longest_edge=hi)
    return Qwen3VLImageProcessor(image_processor, tokenizer, chat_template=tokenizer.chat_template)
