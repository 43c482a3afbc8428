"""rlkit.recipes.validation: what the GRPO recipe refuses before any work. Config problems (the sampling
strategy's keys) and env capabilities (rlkit.types' Supports* protocols): a stage the env cannot feed is refused
naming the capability and the override that avoids it."""

from __future__ import annotations

import pytest
from omegaconf import open_dict

from rlkit.errors import ConfigError
from rlkit.recipes.validation import capability_problems, check_config, config_problems
from rlkit.run import compose_train
from rlkit.types import SupportsDemonstrations, SupportsGroundingQuestions


class BareEnv:
    """An env with the required EnvSpec interface only: no solver, no grounding questions, no renderer."""

    eval_set_name = "bare_4"
    max_turns = 1

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def eval_seeds(self):
        return [0, 1, 2, 3]

    def is_eval_seed(self, seed):
        return seed < 4

    def make(self):
        raise AssertionError("capability checks do not build an env unless control=fixed_image")


class PlayableBareEnv(BareEnv):
    """BareEnv with episodes that keep the contract, for GRPORecipe.setup (which plays the env: rlkit.env_check)."""

    def make(self):
        from tests.envs.broken_envs import GoodEnv

        return GoodEnv().make()


class WithDemonstrations(BareEnv):
    def demonstration(self, seed):
        return ["<answer>stop</answer>"]


class WithQuestions(BareEnv):
    grounding_tasks = ("walls",)

    def grounding_example(self, seed, task, rng):
        raise AssertionError("not asked here")


def _cfg(*overrides):
    """The smoke config (its recipe mixes sft.grounding_mix=8 questions in: 0 unless a test says otherwise); the
    paths are set, as train.py's Hydra run sets them (nothing is written where they point)."""
    cfg = compose_train(["experiment=smoke", "logger=console", "sft.grounding_mix=0", *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = "/nonexistent/run"
        cfg.paths.cache_dir = "/nonexistent/cache"
    return cfg


def test_the_protocols_are_what_an_env_declares_by_its_methods():
    from envs.visgym import VisGymMaze

    assert not isinstance(BareEnv(), SupportsDemonstrations) and not isinstance(BareEnv(), SupportsGroundingQuestions)
    assert isinstance(WithDemonstrations(), SupportsDemonstrations)
    assert isinstance(WithQuestions(), SupportsGroundingQuestions)
    maze = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    assert isinstance(maze, SupportsDemonstrations) and isinstance(maze, SupportsGroundingQuestions)


def test_the_sft_warm_start_needs_a_solver():
    (problem,) = capability_problems(_cfg("sft.enabled=true", "grounding.enabled=false", "aux_loss.demo_coef=0"), BareEnv())
    assert "SupportsDemonstrations" in problem and "set sft.enabled=false" in problem
    assert "env BareEnv " in problem  # the env is named
    assert capability_problems(_cfg("sft.enabled=true", "grounding.enabled=false", "aux_loss.demo_coef=0"),
                               WithDemonstrations()) == []


def test_an_env_with_only_the_required_interface_runs_plain_grpo():
    assert capability_problems(_cfg("sft.enabled=false", "grounding.enabled=false", "aux_loss.demo_coef=0"), BareEnv()) == []


def test_the_demonstration_loss_needs_a_solver():
    cfg = _cfg("sft.enabled=false", "grounding.enabled=false", "aux_loss.demo_coef=0.3")
    (problem,) = capability_problems(cfg, BareEnv())
    assert "SupportsDemonstrations" in problem and "aux_loss.demo_coef=0.3" in problem
    assert "set aux_loss=none" in problem
    assert capability_problems(cfg, WithDemonstrations()) == []


def test_the_grounding_stage_and_the_grounding_mix_need_questions():
    cfg = _cfg("sft.enabled=false", "grounding.enabled=true", "aux_loss.demo_coef=0")
    (problem,) = capability_problems(cfg, BareEnv())
    assert "SupportsGroundingQuestions" in problem and "set grounding.enabled=false" in problem
    assert capability_problems(cfg, WithQuestions()) == []
    # a policy.path checkpoint is not grounded (it reads images already): nothing to ask
    assert capability_problems(_cfg("sft.enabled=false", "grounding.enabled=true", "aux_loss.demo_coef=0",
                                    "policy.path=/some/ckpt"), BareEnv()) == []
    mix = _cfg("sft.enabled=true", "sft.grounding_mix=2", "grounding.enabled=false", "aux_loss.demo_coef=0")
    (problem,) = capability_problems(mix, WithDemonstrations())
    assert "sft.grounding_mix=2" in problem and "set sft.grounding_mix=0" in problem


def test_every_problem_is_reported_at_once_and_visgym_has_every_capability():
    from envs.visgym import VisGymMaze

    cfg = _cfg("sft.enabled=true", "sft.grounding_mix=2", "grounding.enabled=true", "aux_loss.demo_coef=0.3")
    problems = capability_problems(cfg, BareEnv())
    assert len(problems) == 4
    assert ["sft.enabled=false" in p for p in problems] == [True, False, False, False]
    assert "aux_loss.demo_coef=0" in problems[1] and "grounding.enabled=false" in problems[2]
    assert "sft.grounding_mix=0" in problems[3]
    assert capability_problems(cfg, VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)) == []


def test_one_pass_names_problems_of_every_kind_in_one_refusal():
    """A bad range, a task count the env's set cannot hold and the executor's own refusal: one ConfigError with
    all three (GRPORecipe.setup's validation pass), where each used to stop the run on its own, one per start."""
    from rlkit.recipes.validation import check_run

    cfg = _cfg("lr=-1", "eval.num_tasks=1000")
    with pytest.raises(ConfigError) as e:
        check_run(cfg, ["policy.device is cuda but backend.gpus_per_worker=0: (the executor's)"])
    text = str(e.value)
    assert text.startswith("3 bad values: lr=-1.0 must be > 0")
    assert "; policy.device is cuda but backend.gpus_per_worker=0" in text and "; eval.num_tasks=1000: use null" in text
    # a value refused by its range is named once, not again by the check that reads it
    with pytest.raises(ConfigError) as e:
        check_run(_cfg("eval.num_tasks=0", "rollout.temperature=-1"), [])
    assert str(e.value).count("eval.num_tasks=0") == 1 and str(e.value).count("temperature=-1") == 1
    checked = check_run(_cfg(), [])
    assert checked.eval_seeds and checked.job.env_spec is checked.env_spec


def test_setup_refuses_an_env_that_cannot_feed_a_stage_before_any_build(tmp_path):
    from rlkit.recipes.grpo import GRPORecipe
    from rlkit.recipes.local import LocalExecutor

    cfg = _cfg("sft.enabled=true", "grounding.enabled=false", "aux_loss.demo_coef=0", "eval.num_tasks=null")
    with open_dict(cfg):
        cfg.env = {"_target_": f"{__name__}.PlayableBareEnv", "name": "bare"}
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.cache_dir = str(tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"env bare \(PlayableBareEnv\) has no solver .*set sft\.enabled=false"):
        GRPORecipe(cfg, LocalExecutor()).setup()
    assert not (tmp_path / "cache").exists()


def test_plain_sampling_refuses_the_dapo_keys():
    # PlainSampling has no keys: Hydra refuses `sampling.max_rounds=2` on it, and an appended one is refused here
    problems = config_problems(_cfg("sampling=plain", "+sampling.max_rounds=2", "+sampling.adaptive_batch=false"))
    assert problems == ["sampling.max_rounds=2 / sampling.adaptive_batch=false belong to DAPO dynamic sampling, "
                        "which sampling=plain does not run: choose sampling=dapo, or drop them"]
    (problem,) = config_problems(_cfg("sampling=plain", "+sampling.adaptive_batch=true"))
    assert "sampling.adaptive_batch=true belong to DAPO" in problem
    with pytest.raises(ConfigError, match="sampling=dapo with sampling.max_rounds=0 samples no extra round"):
        check_config(_cfg("sampling=dapo", "sampling.max_rounds=0"))
    assert config_problems(_cfg("sampling=dapo", "sampling.max_rounds=3")) == []
    assert config_problems(_cfg("sampling=plain")) == []


def test_each_sampling_strategy_is_a_class_with_only_its_own_keys():
    from rlkit.resume import SAMPLING_TARGETS
    from rlkit.sampling import DapoSampling, PlainSampling, sampling_strategy
    from rlkit.sampling.strategies import TARGETS, sampling_problems

    assert sampling_strategy(_cfg("sampling=plain").sampling) == PlainSampling()
    assert sampling_strategy(_cfg("sampling=dapo", "sampling.adaptive_batch=false").sampling) == DapoSampling(3, False)
    assert SAMPLING_TARGETS == TARGETS  # what resume reads an older checkpoint's sampling.name as
    assert sampling_problems(_cfg("sampling=dapo", "sampling.max_rounds=-1").sampling) == [
        "sampling.max_rounds=-1 must be an integer >= 0 (dapo's extra rollout rounds a step)"]
    assert sampling_problems(_cfg("sampling=dapo", "sampling.adaptive_batch=2").sampling) == [
        "sampling.adaptive_batch=2 must be true or false"]
    (problem,) = sampling_problems(_cfg("sampling._target_=greso").sampling)
    assert problem.startswith("sampling._target_='greso' must be one of rlkit.sampling.PlainSampling, ")
    with pytest.raises(ConfigError, match="sampling=plain does not run"):
        sampling_strategy(_cfg("sampling=plain", "+sampling.max_rounds=1").sampling)


def test_rollout_engine_is_one_of_its_choices():
    problems = config_problems(_cfg("rollout.engine=vllmm"))
    assert any(p.startswith("rollout.engine='vllmm' must be one of rlkit, vllm") for p in problems), problems


def test_rollout_engine_vllm_refuses_what_vllm_cannot_sample_faithfully(monkeypatch, tmp_path):
    """No .venv-vllm; top-k (vLLM's logprobs would be the truncated distribution's); an image-size override vLLM's
    processor never sees; a target list naming proj, which reaches the Conv3d patch embedding vLLM ignores. Each
    named with its fix; with the fixes (and an interpreter) nothing is left, the default recipe's vision LoRA
    included (all-linear takes linears only: rlkit.policy.lora.excluded_modules)."""
    monkeypatch.setenv("RLKIT_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    problems = config_problems(_cfg("rollout.engine=vllm", "rollout.top_k=5", "policy.image_max_pixels=3136",
                                    "policy.lora.target_modules=[q_proj,proj]"))
    text = " | ".join(problems)
    assert len(problems) == 4, problems
    assert "bash scripts/setup_vllm.sh" in text and str(tmp_path / "missing" / "python") in text
    assert "['proj']" in text and "visual.patch_embed.proj" in text and "target_modules=all-linear" in text
    assert "rollout.top_k=0" in text and "policy.image_max_pixels=3136" in text

    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv("RLKIT_VLLM_PYTHON", str(python))
    assert config_problems(_cfg("rollout.engine=vllm")) == []  # the default recipe: include_vision=true
    assert config_problems(_cfg("rollout.engine=vllm", "policy.lora.include_vision=false")) == []
    assert config_problems(_cfg("rollout.engine=vllm", "policy.lora.include_vision=true",
                                "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,qkv,linear_fc1]")) == []
    assert config_problems(_cfg("rollout.engine=rlkit", "rollout.top_k=5")) == []  # rlkit's engine: all of it


def test_recovery_demonstrations_need_an_env_that_draws_them_and_a_later_turn():
    from envs.visgym import VisGymMaze

    base = ("sft.enabled=true", "grounding.enabled=false", "aux_loss.demo_coef=0")
    (problem,) = capability_problems(_cfg(*base, "sft.recovery_share=0.5"), WithDemonstrations())
    assert "SupportsRecoveryDemonstrations" in problem and "set sft.recovery_share=0" in problem
    # a later stage that draws them is checked too
    (problem,) = capability_problems(_cfg(*base, "+sft.stages=[{recovery_share: 0.25}]"), WithDemonstrations())
    assert "sft.recovery_share=0.25" in problem
    plan = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    (problem,) = capability_problems(_cfg(*base, "sft.recovery_share=0.5"), plan)
    assert "multi-turn" in problem and "env.mode=interactive" in problem
    interactive = VisGymMaze(variant="small", mode="interactive", parser="tuple", max_turns=17)
    assert capability_problems(_cfg(*base, "sft.recovery_share=0.5"), interactive) == []
    assert capability_problems(_cfg(*base, "sft.recovery_share=0"), WithDemonstrations()) == []
