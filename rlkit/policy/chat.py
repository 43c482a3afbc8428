"""Token-level Qwen chat format: conversations are built token by token, never re-tokenized.

The rollout builds each trajectory by concatenating, in order, the ids returned here and the ids
the engine sampled, so training sees exactly the sampled tokens. Token layout of a trajectory
(Qwen2-VL / Qwen3-VL-Instruct chat template; ``IMG`` = ``<|vision_start|>`` + K x ``<|image_pad|>``
+ ``<|vision_end|>`` with K = t*h*w / merge_size**2 from the image's ``image_grid_thw``)::

    user_turn(first=True, system=S):   <|im_start|>system\\nS<|im_end|>\\n          (only if S)
                                       <|im_start|>user\\nIMG...IMG TEXT<|im_end|>\\n
                                       <|im_start|>assistant\\n
    completion (sampled, loss mask 1): c_1 ... c_k <|im_end|>        finish_reason "stop"
                                       c_1 ... c_max_new_tokens      finish_reason "length"
    turn_end_ids(finish_reason):       \\n                           after "stop"
                                       <|im_end|>\\n                 after "length"
    user_turn(first=False):            <|im_start|>user\\nIMG...IMG TEXT<|im_end|>\\n<|im_start|>assistant\\n
    ...

Images come before the text in a user message (rlkit.types.Observation). When the checkpoint's
template strips surrounding whitespace of message texts (Qwen3-VL's does), so does this format
(``strip_text``, detected by ``check_template`` at load). For one turn the ids
equal ``processor.apply_chat_template(messages, add_generation_prompt=True)`` followed by the
processor's placeholder expansion (tests/policy/test_chat.py checks this).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Sequence

import torch
from PIL import Image

from rlkit.policy.tokenizer import IM_END, IM_START, IMAGE_PAD, PAD_TOKEN, VIDEO_PAD, VISION_END, VISION_START
from rlkit.safe_text import escape_special_tokens


@dataclass
class ImageInput:
    """One processed image: pixel_values [P, D] float32 (P = t*h*w patches, D = 3*2*patch**2) and
    image_grid_thw [1, 3] long (t, h, w in patches)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


class ImageBatch(NamedTuple):
    """Images of one sequence, concatenated in order: pixel_values [sum P_i, D] float32 and
    image_grid_thw [n_images, 3] long; both None when the sequence has no image.

    Unpacks as a tuple (``pv, thw = batch``) and as keyword arguments (``PromptInput(ids, **batch)``).
    """

    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None

    def keys(self) -> tuple[str, ...]:
        return self._fields

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            return getattr(self, key)
        return tuple.__getitem__(self, key)


@dataclass
class TurnTokens:
    """A user turn (plus optional system message) ready to append to a trajectory.

    input_ids: the ids, image placeholders already expanded, ending with ``<|im_start|>assistant\\n``.
    image_inputs: one ImageInput per image of the turn, in placeholder order.
    """

    input_ids: list[int]
    image_inputs: list[ImageInput] = field(default_factory=list)

    @property
    def pixel_values(self) -> torch.Tensor | None:
        return concat_images(self.image_inputs).pixel_values

    @property
    def image_grid_thw(self) -> torch.Tensor | None:
        return concat_images(self.image_inputs).image_grid_thw


def concat_images(image_inputs: Sequence[ImageInput | TurnTokens | ImageBatch]) -> ImageBatch:
    """Concatenate per-image (or per-turn) inputs of one sequence into an ImageBatch, in order.

    Returns ImageBatch(pixel_values [sum P_i, D] float32, image_grid_thw [n, 3] long), or
    ImageBatch(None, None) when there is no image.
    """
    pvs: list[torch.Tensor] = []
    thws: list[torch.Tensor] = []

    def _add(item) -> None:
        if isinstance(item, TurnTokens):
            for sub in item.image_inputs:
                _add(sub)
        elif item.pixel_values is not None:
            pvs.append(item.pixel_values)
            thws.append(item.image_grid_thw.reshape(-1, 3))

    for item in image_inputs:
        _add(item)
    if not pvs:
        return ImageBatch(None, None)
    return ImageBatch(torch.cat(pvs, 0), torch.cat(thws, 0).long())


class ChatFormat:
    """Qwen chat format at the token level for one tokenizer + image processor.

    Attributes (token ids): im_start_id, im_end_id, pad_id, image_pad_id, video_pad_id,
    vision_start_id, vision_end_id, newline_ids (ids of "\\n"), merge_size.
    """

    def __init__(self, tokenizer, image_processor) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.merge_size = int(image_processor.merge_size)

        def _id(tok: str) -> int:
            i = tokenizer.convert_tokens_to_ids(tok)
            if i is None or i == tokenizer.unk_token_id:
                raise ValueError(f"tokenizer has no special token {tok!r}; not a Qwen-VL tokenizer")
            return int(i)

        self.im_start_id = _id(IM_START)
        self.im_end_id = _id(IM_END)
        self.pad_id = _id(PAD_TOKEN)
        self.image_pad_id = _id(IMAGE_PAD)
        self.video_pad_id = _id(VIDEO_PAD)
        self.vision_start_id = _id(VISION_START)
        self.vision_end_id = _id(VISION_END)
        self.newline_ids = self._encode("\n")
        self.strip_text = False  # set by check_template when the checkpoint's template strips contents
        # Every special token of this tokenizer, for escape_text (the <|name|> shape is always covered).
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.special_token_strings = tuple(
            sorted({*tokenizer.all_special_tokens, *(str(t) for t in added.values() if getattr(t, "special", False))})
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def process_images(self, images: Sequence[Image.Image]) -> list[ImageInput]:
        """Run the image processor on each image: one ImageInput per image (see ImageInput)."""
        out: list[ImageInput] = []
        for img in images:
            enc = self.image_processor(images=[img], return_tensors="pt")
            out.append(ImageInput(enc["pixel_values"].to(torch.float32), enc["image_grid_thw"].long().reshape(1, 3)))
        return out

    def num_image_tokens(self, image: ImageInput) -> int:
        """Number of ``<|image_pad|>`` tokens for one image: t*h*w / merge_size**2."""
        return int(image.image_grid_thw.prod().item()) // (self.merge_size**2)

    def escape_text(self, text: str) -> str:
        """``text`` with every special-token string made inert, so it tokenizes as ordinary text
        (rlkit.safe_text.escape_special_tokens with this tokenizer's special tokens)."""
        return escape_special_tokens(text, self.special_token_strings)

    def render_user_turn(self, text: str, num_images: int, system: str | None = None, first: bool = True) -> str:
        """The turn as a string with one ``<|image_pad|>`` per image (unexpanded), see module doc."""
        if system is not None and not first:
            raise ValueError("a system message can only open the conversation (first=True)")
        if self.strip_text:
            text, system = text.strip(), (system.strip() if system else system)
        head = f"{IM_START}system\n{system}{IM_END}\n" if system else ""
        imgs = f"{VISION_START}{IMAGE_PAD}{VISION_END}" * num_images
        return f"{head}{IM_START}user\n{imgs}{text}{IM_END}\n{IM_START}assistant\n"

    def user_turn(
        self, text: str, images: Sequence[Image.Image] = (), system: str | None = None, first: bool = True
    ) -> TurnTokens:
        """Token ids of a user turn (optional system message first) ending with the assistant header.

        ``text`` and ``system`` are env-provided and may echo model output, so special-token strings
        in them are escaped (``escape_text``): ``<|image_pad|>`` or ``<|im_end|>`` written in a text
        become ordinary tokens, never a placeholder or a message end. The only special ids of the
        result are the chat layout's own (module doc).

        Args:
            text: the message text (shown after the images).
            images: PIL images of the message, in order.
            system: system prompt; only with first=True (None or "" = no system message).
            first: True for the opening turn of a conversation.

        Returns:
            TurnTokens(input_ids with each image's placeholder expanded to num_image_tokens(image)
            ``<|image_pad|>`` ids, image_inputs = process_images(images)).

        Raises:
            ValueError: system given with first=False.
        """
        text = self.escape_text(text)
        system = self.escape_text(system) if system else system
        image_inputs = self.process_images(images)
        ids = self._encode(self.render_user_turn(text, len(image_inputs), system=system, first=first))
        expanded: list[int] = []
        it: Iterator[ImageInput] = iter(image_inputs)
        for i in ids:
            if i == self.image_pad_id:
                expanded.extend([self.image_pad_id] * self.num_image_tokens(next(it)))
            else:
                expanded.append(i)
        return TurnTokens(input_ids=expanded, image_inputs=image_inputs)

    def completion_ids(self, text: str) -> list[int]:
        """Ids of an assistant message written as text (demonstrations for SFT): the text's
        tokens followed by ``<|im_end|>``, as a sampled completion with finish_reason "stop" looks.
        Sampled completions are never re-tokenized; this is only for text that was not sampled."""
        return [*self._encode(text), self.im_end_id]

    def turn_end_ids(self, finish_reason: str, stop_reason: str | None = None) -> list[int]:
        """Ids to append after a completion (loss mask 0).

        "stop" (the completion ends with ``<|im_end|>``): "\\n". "length" (cut by max_new_tokens),
        or "stop" by a stop string (``stop_reason`` set, no ``<|im_end|>`` sampled): ``<|im_end|>`` +
        "\\n", closing the assistant message as the chat template would (as SkyRL's
        ``append_eos_token_after_stop_str_in_multi_turn`` does).

        Raises: ValueError for any other finish_reason.
        """
        if finish_reason == "stop" and stop_reason is None:
            return list(self.newline_ids)
        if finish_reason == "stop":
            return [self.im_end_id, *self.newline_ids]
        if finish_reason == "length":
            return [self.im_end_id, *self.newline_ids]
        raise ValueError(f"unknown finish_reason {finish_reason!r} (expected 'stop' or 'length')")

    @staticmethod
    def concat_images(image_inputs: Sequence[ImageInput | TurnTokens | ImageBatch]) -> ImageBatch:
        """See rlkit.policy.chat.concat_images."""
        return concat_images(image_inputs)

    def banned_token_ids(self, vocab_size: int) -> list[int]:
        """Ids the policy must never sample: vision placeholders, ``<|im_start|>``, pad, and every
        id >= len(tokenizer) (padding rows of the model's embedding matrix).

        Sampling a vision placeholder would make the next forward fail with an image-feature count
        mismatch; the others are never produced by the chat template inside an assistant message.
        """
        ids = {self.image_pad_id, self.video_pad_id, self.vision_start_id, self.vision_end_id, self.im_start_id, self.pad_id}
        ids.update(range(len(self.tokenizer), vocab_size))
        return sorted(i for i in ids if i < vocab_size)

    def check_template(self, chat_template: str | None) -> None:
        """Check that this token layout is the checkpoint's chat template (called at policy load).

        Renders a 2-turn conversation (system, user with an image, assistant reply, user with an
        image, generation prompt) with ``chat_template`` and compares it with the layout above.

        Raises:
            ValueError: the template renders differently (e.g. a thinking template that inserts
                ``<think>`` blocks); training would then see a format the model was not tuned on.
        """
        if not chat_template:
            return

        def render(s: str, t1: str, t2: str) -> str:
            msgs = [
                {"role": "system", "content": s},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t1}]},
                {"role": "assistant", "content": "A"},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t2}]},
            ]
            return self.tokenizer.apply_chat_template(
                msgs, chat_template=chat_template, tokenize=False, add_generation_prompt=True
            )

        # Qwen3-VL's own template strips surrounding whitespace of message contents; follow it.
        self.strip_text = render(" S\n", " T1\n", "T2") == render("S", "T1", "T2")
        ref = render("S", "T1", "T2")
        ours = (
            self.render_user_turn("T1", 1, system="S", first=True)
            + f"A{IM_END}\n"
            + self.render_user_turn("T2", 1, first=False)
        )
        if ref != ours:
            raise ValueError(
                "the checkpoint's chat template renders a conversation differently from rlkit's token layout "
                f"(rlkit.policy.chat):\n template: {ref!r}\n rlkit:    {ours!r}"
            )

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of sampled ids without the final ``<|im_end|>`` (what the env parses)."""
        ids = list(token_ids)
        if ids and ids[-1] == self.im_end_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
