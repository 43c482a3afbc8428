"""The policy package: a Qwen-VL policy (tiny offline build or Qwen3-VL-2B/8B) for GRPO.

Public API (see each module's docstring for shapes, layouts and sources):

- rlkit.policy.policy: PolicyConfig, Policy, load_policy (the ``_target_`` of conf/policy/*.yaml),
  PolicyLoadError.
- rlkit.policy.chat: ChatFormat (``policy.chat``: user_turn, turn_end_ids, concat_images),
  TurnTokens, ImageInput, ImageBatch. The token layout of a trajectory is documented there.
- rlkit.policy.engine: RolloutEngine, TransformersEngine, make_engine, PromptInput, SamplingParams,
  Completion, TopLogprobs.
- rlkit.policy.batching: sequence_batch, SequenceBatch, mrope_position_ids.
- rlkit.policy.logprobs: compute_logprobs (rlkit.policy.shared_prefix: its shared-prefix forward).
- rlkit.policy.lora: LoraSettings, AdapterInfo, apply_lora, save_adapter, load_adapter_inplace,
  read_adapter_info, save_full_model.
- rlkit.policy.tiny: TinyVLSizes, build_tiny_policy, tiny_checkpoint.
"""

from rlkit.policy.chat import ChatFormat, ImageBatch, ImageInput, TurnTokens, concat_images
from rlkit.policy.engine import (Completion, PromptInput, RolloutEngine, SamplingParams, TopLogprobs, TransformersEngine,
                                 make_engine)
from rlkit.policy.batching import SequenceBatch, mrope_position_ids, sequence_batch
from rlkit.policy.logprobs import compute_logprobs
from rlkit.policy.lora import (
    AdapterInfo,
    LoraSettings,
    apply_lora,
    load_adapter_inplace,
    read_adapter_info,
    save_adapter,
    save_full_model,
)
from rlkit.policy.policy import Policy, PolicyConfig, PolicyLoadError, load_policy, load_policy_from_config
from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy, tiny_checkpoint

__all__ = [
    "AdapterInfo",
    "ChatFormat",
    "Completion",
    "ImageBatch",
    "ImageInput",
    "LoraSettings",
    "Policy",
    "PolicyConfig",
    "PolicyLoadError",
    "PromptInput",
    "RolloutEngine",
    "SamplingParams",
    "SequenceBatch",
    "TinyVLSizes",
    "TopLogprobs",
    "TransformersEngine",
    "TurnTokens",
    "apply_lora",
    "build_tiny_policy",
    "compute_logprobs",
    "concat_images",
    "load_adapter_inplace",
    "load_policy",
    "load_policy_from_config",
    "make_engine",
    "mrope_position_ids",
    "read_adapter_info",
    "save_adapter",
    "save_full_model",
    "sequence_batch",
    "tiny_checkpoint",
]
