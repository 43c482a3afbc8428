"""sft.stages: each later stage is the sft config with the stage's keys set over it, typed by the schema."""

from omegaconf import OmegaConf

from rlkit.config import SFTConfig, check_sft_stage
from rlkit.stages.cache import sft_cache_key
from rlkit.stages.sft import sft_stage_config, sft_stage_configs

ENV = OmegaConf.create({"_target_": "envs.visgym.VisGymMaze", "variant": "easy", "mode": "plan"})
POLICY = {"name": "tiny_vl", "path": None}


def _cfg(stages):
    return OmegaConf.create({"sft": OmegaConf.merge(OmegaConf.structured(SFTConfig), {"stages": stages})})


def test_stages_are_set_over_the_base_config_not_over_the_stage_before():
    stages = sft_stage_configs(_cfg([{"lr_schedule": "cosine", "max_steps": 7}, {"seed": 5}]).sft)
    assert [(s["lr_schedule"], s["max_steps"], s["seed"]) for s in stages] == [
        ("constant", 2000, 1234), ("cosine", 7, 1234), ("constant", 2000, 5)]
    assert all("stages" not in s for s in stages)


def test_a_stage_is_typed_as_a_command_line_override_and_keys_the_same():
    # the chained job's sft.target_success=1 arrives as 1.0 through the schema; a stage's 1 must key the same
    (_, as_int), (_, as_float) = (sft_stage_configs(_cfg([{"target_success": v, "max_steps": "2"}]).sft)
                                  for v in (1, 1.0))
    assert as_int["target_success"] == 1.0 and isinstance(as_int["target_success"], float)
    assert as_int["max_steps"] == 2 and isinstance(as_int["max_steps"], int)
    key = sft_cache_key(sft_stage_config(as_int), ENV, POLICY)
    assert key == sft_cache_key(sft_stage_config(as_float), ENV, POLICY)
    chained = OmegaConf.merge(OmegaConf.structured(SFTConfig), {"target_success": 1, "max_steps": 2})
    assert key == sft_cache_key(sft_stage_config(chained), ENV, POLICY)


def test_bad_stages_are_named_with_their_index_and_the_fix():
    cfg = _cfg([{"max_steps": "abc"}, {"max_step": 3}, {"lr_schedule": "cosine", "max_steps": 10}, 3])
    problems = [p for i, s in enumerate(cfg.sft.stages) for p in check_sft_stage(cfg, i, s)]
    assert problems[0] == "sft.stages[0].max_steps='abc' is not a int (the type of sft.max_steps)"
    assert problems[1].startswith("sft.stages[1].max_step is not a key a later stage can set (use one of: ")
    assert problems[2] == ("sft.stages[2] (stage 4): lr_schedule=cosine with warmup_steps=20 >= max_steps=10 "
                           "never decays; set warmup_steps below max_steps")
    assert problems[3].startswith("sft.stages[3]=3 must be a mapping of sft keys")
    assert len(problems) == 4
    ok = _cfg([{"lr_schedule": "cosine", "max_steps": 600, "target_success": 1}])
    assert check_sft_stage(ok, 0, ok.sft.stages[0]) == []
