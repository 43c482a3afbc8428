"""Every typed config field has a valid range, checked before any work (rlkit.config.RANGES)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rlkit.config import RANGES, check_ranges

CONF = Path(__file__).resolve().parents[1] / "conf"


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_defaults_and_every_experiment_are_valid():
    assert check_ranges(_compose([])) == []
    for exp in sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")):
        assert check_ranges(_compose([f"experiment={exp}"])) == [], exp


@pytest.mark.parametrize("override, message", [
    ("seed=-1", "seed=-1 must be an integer >= 0 and <= 4294967295"),
    ("seed=4294967296", "seed=4294967296"),
    ("algorithm.update_epochs=0", "algorithm.update_epochs=0 must be an integer >= 1"),
    ("algorithm.eps_clip_low=-0.2", "algorithm.eps_clip_low=-0.2 must be >= 0 and < 1"),
    ("algorithm.eps_clip_high=-1", "algorithm.eps_clip_high=-1.0 must be >= 0"),
    ("algorithm.max_grad_norm=-1", "algorithm.max_grad_norm=-1.0 must be >= 0 (0 = no clipping"),
    ("rollout.top_k=-5", "rollout.top_k=-5 must be an integer >= 0 or -1 (0 or -1 = off)"),
    ("trainer.ckpt_interval=-1", "trainer.ckpt_interval=-1 must be an integer >= 0 (0 = only the final checkpoint)"),
    ("trainer.eval_interval=-1", "trainer.eval_interval=-1 must be an integer >= 0 (0 = only before and after"),
    ("trainer.export_interval=-2", "trainer.export_interval=-2"),
    ("trainer.num_threads=0", "trainer.num_threads=0 must be an integer >= 1 or null"),
    ("trainer.build_threads=0", "trainer.build_threads=0 must be an integer >= 1 or null"),
    ("trainer.restart_wait_s=0", "trainer.restart_wait_s=0.0 must be > 0"),
    ("rollout.top_p=0", "rollout.top_p=0.0 must be > 0 and <= 1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0"),
    ("rollout.eval_temperature=-0.5", "rollout.eval_temperature=-0.5 must be >= 0 (0 = greedy)"),
    ("algorithm.kl_coef=-0.1", "algorithm.kl_coef=-0.1"),
    ("algorithm.entropy_coef=-0.1", "algorithm.entropy_coef=-0.1"),
    ("algorithm.clip_ratio_c=0.5", "algorithm.clip_ratio_c=0.5 must be > 1 or null"),
    ("algorithm.adv_eps=0", "algorithm.adv_eps=0.0 must be > 0"),
    ("algorithm.loss_reduction=sum", "algorithm.loss_reduction='sum' must be one of token_mean"),
    ("algorithm.kl_estimator=k4", "algorithm.kl_estimator='k4'"),
    ("optim.lr_schedule=linear", "optim.lr_schedule='linear'"),
    ("optim.weight_decay=-1", "optim.weight_decay=-1.0"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1"),
    ("optim.adam_betas=[0.9,1.5]", "optim.adam_betas=[0.9, 1.5] must be two numbers in [0, 1)"),
    ("aux_loss.demo_max_tasks=0", "aux_loss.demo_max_tasks=0 must be an integer >= 1"),
    ("algorithm.mini_batch_size=0", "algorithm.mini_batch_size=0"),
    ("steps=-1", "steps=-1 must be an integer >= 0 (0 = only the warm start"),
    ("lr=0", "lr=0.0 must be > 0"),
    ("lr=inf", "lr=inf must be > 0"),
    ("sft.target_success=1.5", "sft.target_success=1.5 must be >= 0 and <= 1 (or sft.enabled=false)"),
    ("sft.seed=-3", "sft.seed=-3"),
    ("eval.pass_k=-1", "eval.pass_k=-1 must be an integer >= 0 (0 = off)"),
    ("trainer.resume_mode=earliest", "trainer.resume_mode='earliest' must be one of latest, none, from_path"),
    ("control=blind", "control='blind' must be one of fixed_image, shuffled_reward or null"),
    ("optim.warmup_steps=300", "optim.lr_schedule=cosine with optim.warmup_steps=300 >= steps=300 never decays"),
    ("sft.enabled=false sft.stages=[{max_steps:5}]", "sft.stages has 1 later warm-start stage(s) but sft.enabled=false"),
])
def test_bad_value_is_named_with_its_range(override, message):
    problems = check_ranges(_compose(override.split()))
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_sft_ranges_apply_only_when_sft_runs():
    assert check_ranges(_compose(["sft.enabled=false", "sft.max_steps=0"])) == []


def test_cosine_warmup_below_steps_and_a_constant_schedule_pass():
    assert check_ranges(_compose(["optim.warmup_steps=299"])) == []
    assert check_ranges(_compose(["optim.warmup_steps=300", "optim.lr_schedule=constant"])) == []
    assert check_ranges(_compose(["optim.warmup_steps=300", "steps=0"])) == []  # steps=0: no GRPO update


def test_every_typed_field_has_a_rule():
    from dataclasses import fields

    from rlkit.config import (AlgorithmConfig, AuxLossConfig, EvalConfig, GroundingConfig, OptimConfig, RolloutConfig,
                              SFTConfig, TrainerConfig)

    free = {"algorithm.name", "algorithm.norm_adv_by_std", "algorithm.filter_zero_variance_groups",
            "algorithm.dedup_identical_samples", "algorithm.overlong_filtering",
            "optim.adam_betas",  # rlkit.config.check_ranges (two numbers in [0, 1))
            "trainer.eval_before_train", "trainer.max_ckpts_to_keep", "trainer.resume_path",
            "trainer.overwrite", "trainer.deterministic", "trainer.quiet", "sft.enabled", "algorithm.shared_prefix",
            "rollout.reuse_kv_cache", "rollout.stop",  # stop: SamplingParams.validate (non-empty strings)
            "grounding.enabled", "grounding.tasks",  # tasks: rlkit.stages.grounding.grounding_tasks
            "sft.stages",  # each stage: rlkit.config.check_sft_stage (its keys, and the sft.* rules over its values)
            "sft.start_from_env", "sft.start_from_experiment"}  # a config's name: rlkit.recipes.validation
    for prefix, cls in [("algorithm", AlgorithmConfig), ("rollout", RolloutConfig), ("trainer", TrainerConfig),
                        ("sft", SFTConfig), ("grounding", GroundingConfig), ("eval", EvalConfig),
                        ("aux_loss", AuxLossConfig), ("optim", OptimConfig)]:
        for f in fields(cls):
            key = f"{prefix}.{f.name}"
            assert key in RANGES or key in free, f"{key} has no valid-range rule in rlkit.config.RANGES"
