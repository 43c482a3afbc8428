"""The one-time builds before GRPO: the grounding stage (rlkit.stages.grounding), the SFT warm start
(rlkit.stages.sft), their cache (rlkit.stages.cache) and the pipeline that chains them (rlkit.stages.warm_start)."""
