"""A small byte-level BPE tokenizer with the Qwen-VL special tokens, built offline.

The tiny policy cannot download Qwen's 151k-token tokenizer, so it gets its own: a byte-level BPE
(GPT-2 / Qwen2 style pre-tokenization, all 256 bytes in the base alphabet, so *any* UTF-8 text
encodes) trained deterministically on a small built-in corpus of instruction, maze and action
words, plus the special tokens the Qwen3-VL model and processor look up by name, plus a Qwen-style
chat template. Vocabulary: ``vocab_size`` ids in total, the special tokens last (as in Qwen).

The result is a ``transformers`` fast tokenizer (``TokenizersBackend``) that saves and loads with
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` like any checkpoint's tokenizer.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

#: Special tokens, in id order after the BPE vocabulary. Names follow Qwen2/Qwen3-VL's tokenizer,
#: which is what Qwen3VLProcessor and the model config refer to.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

#: Qwen-style chat template (the layout of Qwen2-VL / Qwen3-VL-Instruct for system, user and
#: assistant messages whose content is a string or a list of {"type": "image"} / {"type": "text"}
#: items). Written for rlkit; no default system prompt (as Qwen3-VL-Instruct).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}"
    "{{- item['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

_WORDS = """
the a an you your is are be to of in on at for with from by and or not no yes it this that there
agent player goal target exit start wall walls path cell cells grid maze map board image picture view
move moves moved moving step steps turn turns action actions stop stopped reach reached reaching
left right up down north south east west row rows column columns position location current next
previous open blocked free empty black white red green blue gray grey square circle dot marker
think answer output format only one single valid invalid must should can cannot will would please
reply respond choose select pick find navigate solve solved success failed fail done finish finished
shortest route best way toward towards away from into out of game level easy hard medium environment
task instruction instructions observation feedback result reward you are at the you have
following below above each every where which what how when then than more less after before
user assistant system model policy prompt response message content text question hello hi thanks
first second third last again once twice three four five six seven eight nine ten zero number
see look shows shown show given give take took make made go goes went come came get got keep kept
here now time times count counted left-most right-most top bottom middle center corner edge side
same different other another all any some none both either neither many much few little large small
big tiny long short high low far near close closer farther straight forward back backward around
if else because so but while until unless only also just still already yet even never always often
think thought reason reasoning plan planned check checked verify note remember know known unknown
correct incorrect wrong right-hand error errors try tried trying attempt attempts retry remaining
episode reward rewards success score point points win won lose lost play playing played player's
""".replace("right-hand", "hand").replace("left-most", "leftmost").replace("right-most", "rightmost")

_DIRECTIONS = ["right", "up", "left", "down"]


def training_corpus() -> list[str]:
    """The fixed corpus the tiny BPE is trained on (deterministic: no randomness, fixed order).

    Covers instruction prose, the VisGym maze action formats (``('move', 0)``, ``('stop', 'stop')``,
    ``<action>left</action>``, ``<answer>...</answer>``), direction words and small numbers, so that
    these strings encode to few tokens. Anything else still encodes through the byte alphabet.
    """
    words = _WORDS.split()
    lines: list[str] = []
    lines.append(" ".join(words))
    for i in range(0, len(words) - 6, 3):
        lines.append(" ".join(words[i : i + 7]).capitalize() + ".")
    for d, name in enumerate(_DIRECTIONS):
        lines += [
            f"('move', {d})",
            f"<action>('move', {d})</action>",
            f"<answer>('move', {d})</answer>",
            f"<action>{name}</action>",
            f"<answer>{name}</answer>",
            f"Action: {name}",
            f"move {name}",
            f"Move {name}.",
            f"The agent moved {name}.",
            f"You moved {name}. The move was valid.",
            f"You tried to move {name} but hit a wall.",
        ]
    lines += [
        "('stop', 'stop')",
        "<action>('stop', 'stop')</action>",
        "<answer>('stop', 'stop')</answer>",
        "<action>stop</action>",
        "<answer>stop</answer>",
        "right down left up stop",
        "up up right right down down left left stop",
        "Invalid action. Output exactly one action.",
        "You reached the goal.",
        "user\n",
        "assistant\n",
        "system\n",
    ]
    for i in range(32):
        seq = [_DIRECTIONS[(i * 7 + k * 3) % 4] for k in range(1 + i % 9)]
        lines.append(" ".join(seq))
        lines.append(", ".join(f"('move', {_DIRECTIONS.index(s)})" for s in seq))
    for r in range(12):
        for c in range(12):
            lines.append(f"({r}, {c})")
        lines.append(f"Row {r}, column {r + 1}. Step {r} of 20.")
    lines += [
        "You are an agent in a 2D maze. The image shows the maze: walls are black, free cells are white, "
        "the agent is a red circle and the goal is a green square.",
        "Choose one action from: ('move', 0) right, ('move', 1) up, ('move', 2) left, ('move', 3) down, "
        "('stop', 'stop') when you are at the goal.",
        "Answer with the action inside <answer></answer> tags, for example <answer>('move', 0)</answer>.",
    ]
    # Repeat the action formats so their merges win over rare prose pairs.
    return lines + lines[-60:] * 4


def build_tiny_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train the tiny byte-level BPE and wrap it with Qwen-VL special tokens and chat template.

    Args:
        vocab_size: total number of ids including the 7 special tokens (>= 256 + 7 + 1). The BPE
            stops earlier if the corpus has no more pairs to merge; ``len(tokenizer)`` is the truth.

    Returns:
        A fast tokenizer: eos ``<|im_end|>``, pad ``<|endoftext|>``, special tokens
        ``SPECIAL_TOKENS`` with consecutive ids after the BPE vocabulary, ``chat_template`` set.
        Building twice gives identical ids (deterministic trainer on a fixed corpus).

    Raises:
        ValueError: vocab_size too small for the byte alphabet plus the special tokens.
    """
    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special + 1:
        raise ValueError(f"vocab_size={vocab_size} is below the byte alphabet + specials ({256 + n_special + 1})")
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_special,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    backend.train_from_iterator(training_corpus(), trainer=trainer)
    # Special tokens at consecutive ids right after the BPE vocabulary, in SPECIAL_TOKENS order.
    backend.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, PAD_TOKEN)],
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
