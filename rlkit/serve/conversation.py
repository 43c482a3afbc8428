"""OpenAI chat messages -> the policy's token layout (rlkit.policy.chat), exactly as rollouts build it.

A conversation must have the shape rlkit trains on: an optional system (or developer) message, then
user and assistant messages alternating, ending with a user message::

    [system] user (assistant user)*

It becomes the ids of ``rlkit.rollout``'s trajectory layout:

    user_turn(user_0, system=S, first=True)
    <assistant_0 ids> <|im_end|> \\n
    user_turn(user_1, first=False)
    ...                                            (ends with <|im_start|>assistant\\n)

Images of a user message go before its text (the policy's layout, ``rlkit.types.Observation``),
in the order given; text parts are concatenated in order. Assistant messages are text only.

Assistant ids and re-tokenization: a rollout appends the ids the policy *sampled*, never the
tokenization of their decoded text, and the two differ often (byte-level BPE merges, partial UTF-8
bytes). The OpenAI API only carries text, so ``SampledIds`` remembers, for each completion this
server returned, the sampled ids under a key of (the prompt ids and images it was sampled from,
its text). When a later request repeats that conversation prefix and that text as an assistant
message, the remembered ids are used, so the prompt equals the rollout's token for token; any
other assistant text is tokenized (``ChatFormat.completion_ids``). vLLM's server always re-tokenizes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from rlkit.policy.tokenizer import IM_END, IM_START, IMAGE_PAD, PAD_TOKEN, VIDEO_PAD, VISION_END, VISION_START
from rlkit.serve.protocol import APIError, DecodedImage, Message, ServeLimits, decode_image_url


@dataclass
class Turn:
    """One message reduced to what the layout needs: role ("system" | "user" | "assistant"), its text,
    and (user messages) its decoded images in order."""

    role: str
    text: str
    images: list[DecodedImage] = field(default_factory=list)


def parse_messages(messages: Sequence[Message], limits: ServeLimits) -> list[Turn]:
    """Check the conversation shape and decode its images.

    Returns: one Turn per message (``developer`` -> "system").
    Raises: APIError 400 naming the message: wrong order of roles, no final user message, missing
    content, an image in a system/assistant message, more than ``limits.max_images`` images, or any
    image error of ``decode_image_url``.
    """
    turns: list[Turn] = []
    n_images = sum(
        1 for m in messages if isinstance(m.content, list) for p in m.content if p.type == "image_url"
    )
    if n_images > limits.max_images:
        raise APIError(400, f"the request has {n_images} images, more than the limit of {limits.max_images} "
                       "per request", param="messages", code="too_many_images")
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        param = f"messages[{i}]"
        if role == "system" and i != 0:
            raise APIError(400, f"{param}: a system message may only be the first message", param=param,
                           code="invalid_conversation")
        expected = "user" if (i - (1 if turns and turns[0].role == "system" else 0)) % 2 == 0 else "assistant"
        if role != "system" and role != expected:
            raise APIError(400, f"{param}: expected {'a user' if expected == 'user' else 'an assistant'} message here; messages must be an optional system "
                           "message, then user and assistant messages alternating, starting and ending with user "
                           "(the policy's chat layout)", param=param, code="invalid_conversation")
        if m.content is None:
            raise APIError(400, f"{param}.content is required", param=f"{param}.content", code="missing_required_parameter")
        if isinstance(m.content, str):
            turns.append(Turn(role, m.content))
            continue
        texts, images = [], []
        for j, part in enumerate(m.content):
            if part.type == "text":
                texts.append(part.text)
            elif role != "user":
                raise APIError(400, f"{param}.content[{j}]: images are only accepted in user messages",
                               param=f"{param}.content[{j}]", code="invalid_conversation")
            else:
                images.append(decode_image_url(part.image_url.url, limits, f"{param}.content[{j}].image_url.url"))
        turns.append(Turn(role, "".join(texts), images))
    if not turns or turns[-1].role != "user":
        raise APIError(400, "the last message must be a user message (the server generates the assistant reply "
                       "to it)", param="messages", code="invalid_conversation")
    return turns


class SampledIds:
    """A bounded LRU map from (conversation prefix, completion text) to the ids that were sampled.

    Thread-safe. ``capacity`` entries (0 disables it: assistant texts are always tokenized).
    """

    def __init__(self, capacity: int = 16384) -> None:
        self.capacity = int(capacity)
        self._map: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(prefix_ids: Sequence[int], image_digests: Sequence[str], text: str) -> str:
        h = hashlib.sha256()
        h.update(",".join(map(str, prefix_ids)).encode())
        h.update(b"|")
        h.update(",".join(image_digests).encode())
        h.update(b"|")
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def put(self, key: str, ids: Sequence[int]) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._map[key] = tuple(ids)
            self._map.move_to_end(key)
            while len(self._map) > self.capacity:
                self._map.popitem(last=False)

    def get(self, key: str) -> tuple[int, ...] | None:
        if self.capacity <= 0:
            return None
        with self._lock:
            ids = self._map.get(key)
            if ids is None:
                self.misses += 1
                return None
            self._map.move_to_end(key)
            self.hits += 1
            return ids


@dataclass
class BuiltPrompt:
    """A request's prompt: ``input_ids`` (ending with the assistant header), the processed images
    (``ImageInput`` list, in order), and the image digests (for ``SampledIds`` keys)."""

    input_ids: list[int]
    image_inputs: list
    image_digests: list[str]


#: Tokens that make the chat structure or stand for images: never inside a message text (the policy
#: never samples them inside a reply: they are banned or end it, rlkit.policy.chat.banned_token_ids).
STRUCTURE_TOKENS = (IM_START, IM_END, PAD_TOKEN, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)


def build_prompt(chat, turns: Sequence[Turn], sampled: SampledIds | None) -> BuiltPrompt:
    """Token ids of the conversation in the rollout layout (see the module doc).

    Args:
        chat: the policy's ChatFormat. turns: from ``parse_messages``. sampled: the server's
            SampledIds (None: always tokenize assistant texts).

    Raises: APIError 400 when a message text contains one of STRUCTURE_TOKENS (``<|im_end|>``,
    ``<|image_pad|>``, ...), or the image processor refuses an image (e.g. an aspect ratio over 200).
    """
    for i, turn in enumerate(turns):
        found = next((t for t in STRUCTURE_TOKENS if t in turn.text), None)
        if found is not None:
            raise APIError(400, f"messages[{i}]: the text contains the special token {found!r}; the chat structure is "
                           "given by the messages, not by control tokens in their text", param=f"messages[{i}]",
                           code="invalid_content")
    system = turns[0].text if turns[0].role == "system" else None
    body = turns[1:] if system is not None else list(turns)
    ids: list[int] = []
    image_inputs: list = []
    digests: list[str] = []
    for i, turn in enumerate(body):
        msg_index = i + (1 if system is not None else 0)
        if turn.role == "assistant":
            cached = sampled.get(SampledIds.key(ids, digests, turn.text)) if sampled is not None else None
            if cached is not None:
                ids.extend(cached)
                ids.append(chat.im_end_id)
            else:
                ids.extend(chat.completion_ids(turn.text))  # text ids + <|im_end|>
            ids.extend(chat.turn_end_ids("stop"))  # "\n"
            continue
        try:
            first = i == 0
            tt = chat.user_turn(turn.text, [d.image for d in turn.images], system=(system or None) if first else None,
                                first=first)
        except ValueError as e:
            raise APIError(400, f"messages[{msg_index}]: {e}", param=f"messages[{msg_index}]",
                           code="invalid_content") from None
        ids.extend(tt.input_ids)
        image_inputs.extend(tt.image_inputs)
        digests.extend(d.digest for d in turn.images)
    return BuiltPrompt(ids, image_inputs, digests)


def remember_completion(sampled: SampledIds | None, prompt: BuiltPrompt, token_ids: Sequence[int], text: str,
                        im_end_id: int) -> None:
    """Record a returned completion's sampled ids (without the final ``<|im_end|>``) under its prompt."""
    if sampled is None:
        return
    ids = list(token_ids)
    if ids and ids[-1] == im_end_id:
        ids = ids[:-1]
    sampled.put(SampledIds.key(prompt.input_ids, prompt.image_digests, text), ids)
