"""Every option of every config group composes; typos and unknown options fail at compose time."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

import rlkit.config  # noqa: F401  registers the schema

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ["env", "reward", "policy", "backend", "algorithm", "logger", "launcher", "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    for key in ("env", "reward", "policy", "logger", "backend"):
        assert "_target_" in cfg[key], f"{key} must name its _target_"
    assert cfg.algorithm.eps_clip_low > 0
    OmegaConf.to_container(cfg.algorithm, resolve=True)


def test_top_level_knobs_are_swept_keys():
    cfg = _compose(["lr=3e-5", "seed=7", "steps=3", "group_size=4"])
    assert (cfg.lr, cfg.seed, cfg.steps, cfg.group_size) == (3e-5, 7, 3, 4)


def test_unknown_option_lists_available():
    with pytest.raises(MissingConfigException) as e:
        _compose(["env=nosuch"])
    assert "visgym" in str(e.value)  # Hydra lists the available options


@pytest.mark.parametrize("override", ["algorithm.eps_clip_hihg=0.3", "nosuchkey=1", "trainer.eval_intervl=3"])
def test_unknown_key_fails_at_compose(override):
    with pytest.raises(ConfigCompositionException):
        _compose([override])


def test_typed_value_is_checked():
    with pytest.raises(ConfigCompositionException):
        _compose(["algorithm.update_epochs=many"])


def test_forced_unknown_top_level_key_is_refused_at_run_start():
    # `+key=value` bypasses the schema at compose time (Hydra's append); the run refuses it.
    from rlkit.run import ConfigError, check_top_level_keys

    cfg = _compose(["+nosuchkey=1"])
    with pytest.raises(ConfigError, match="nosuchkey"):
        check_top_level_keys(cfg)
    for typo, right in (("+algorithm.eps_clip_hihg=0.3", "algorithm.eps_clip_high"),
                        ("+rollout.tempreature=0.5", "rollout.temperature"),
                        ("+trainer.resme_mode=none", "trainer.resume_mode")):
        with pytest.raises(ConfigError, match=typo[1:].split("=")[0].replace(".", r"\.")) as err:
            check_top_level_keys(_compose([typo]))
        assert f"did you mean {right}?" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_top_level_keys(_compose(["+zzzz=1"]))
    assert "did you mean" not in str(err.value)
    check_top_level_keys(_compose([]))
    check_top_level_keys(_compose(["experiment=hyperpod_visgym"]))
    # the sampling strategy holds only its own keys (rlkit.sampling.strategies): a typo names the closest one
    from rlkit.sampling.strategies import sampling_problems

    assert sampling_problems(_compose(["+sampling.max_round=2"]).sampling) == [
        "sampling.max_round=2: sampling=dapo has no such key (did you mean sampling.max_rounds?)"]


def test_image_grid_follows_the_policy_and_env_choices():
    # conf/image_grid/<policy>_<env>.yaml: one image token per maze cell for the tiny policy
    default = _compose([])  # the default env is the 7x7 maze: 56x56 px -> 7x7 tokens
    assert default.env.variant == "small" and default.policy.tiny.image_max_pixels == 56 * 56
    nine = _compose(["env=visgym"])  # 9x9 maze -> 72x72 px -> 9x9 tokens (tiny_vl.yaml's own bound)
    assert nine.env.variant == "easy" and nine.policy.tiny.image_max_pixels == 72 * 72
    assert _compose(["env=visgym_small", "policy=qwen3_vl_8b"]).policy.tiny is None  # a checkpoint keeps its processor
    stems = {p.stem for p in (CONF / "image_grid").glob("*.yaml")}
    for stem in stems:  # every file names a real (policy, env) pair
        assert any(stem == f"{p}_{e}" for p in _options("policy") for e in _options("env")), stem


def test_recipe_turns_grounding_on_only_for_the_tiny_policy_on_7x7():
    # conf/recipe/tiny_vl_visgym_small.yaml, applied after train.yaml's own values
    assert _compose([]).grounding.enabled is True
    assert _compose(["env=visgym"]).grounding.enabled is False  # 9x9: the grounded warm start was worse
    assert _compose(["grounding.enabled=false"]).grounding.enabled is False  # the command line still wins
    assert _compose(["env=visgym", "grounding.enabled=true"]).grounding.enabled is True
    assert _compose(["experiment=hyperpod_visgym"]).grounding.enabled is False
    for stem in {p.stem for p in (CONF / "recipe").glob("*.yaml")}:
        assert any(stem == f"{p}_{e}" for p in _options("policy") for e in _options("env")), stem


def test_recipe_decays_the_tiny_policys_lr_over_300_grpo_steps_on_7x7_and_9x9():
    # conf/recipe/tiny_vl_visgym_small.yaml (7x7) and conf/recipe/tiny_vl_visgym.yaml (9x9: the same GRPO, on the plain
    # warm start; docs/experiments.md issue 77); other pairs keep train.yaml's values
    default, nine = _compose([]), _compose(["env=visgym"])
    for cfg in (default, nine):
        assert (cfg.steps, cfg.optim.lr_schedule, cfg.lr) == (300, "cosine", 2e-5)
        assert (cfg.sampling.max_rounds, cfg.algorithm.filter_zero_variance_groups) == (3, True)
        assert (cfg.tasks_per_step, cfg.aux_loss.demo_coef, cfg.sampling.adaptive_batch) == (16, 0.3, True)
        assert cfg.policy.lora.include_vision and cfg.algorithm.entropy_coef == 0.01
    assert (default.sft.grounding_mix, nine.sft.grounding_mix) == (8, 0)  # 9x9 keeps the plain warm start
    assert (default.grounding.enabled, nine.grounding.enabled) == (True, False)
    plain = _compose(["env=visgym", "policy=qwen3_vl_8b"])  # no recipe for the 8B: train.yaml's values
    assert (plain.steps, plain.optim.lr_schedule, plain.tasks_per_step, plain.lr) == (150, "constant", 8, 1e-5)
    assert (plain.sampling._target_, set(plain.sampling)) == ("rlkit.sampling.PlainSampling", {"_target_"})
    assert (plain.aux_loss.demo_coef, plain.algorithm.entropy_coef, plain.sft.grounding_mix) == (0.0, 0.0, 0)
    assert not _compose(["env=visgym_small", "policy=qwen3_vl_8b"]).policy.lora.include_vision  # tiny policy only
    assert _compose(["steps=40"]).steps == 40  # the command line still wins
    assert _compose(["optim.lr_schedule=constant"]).optim.lr_schedule == "constant"
    assert _compose(["experiment=smoke"]).steps == 2


def test_small_maze_image_is_one_token_per_cell():
    # the tiny processor's resize of a 7x7 maze picture at 3136 px: a 14x14 patch grid, merged 2x2 = 49 tokens
    from envs.visgym import VisGymMaze
    from rlkit.policy.tiny import Qwen2VLImageProcessorPil, TinyVLSizes

    for env, cells in (("visgym_small", 7), ("visgym", 9)):
        cfg = _compose([f"env={env}"])
        spec = VisGymMaze(**{k: v for k, v in cfg.env.items() if k != "_target_"})
        image = spec.make().reset(spec.eval_seeds()[0]).images[0]
        sizes = TinyVLSizes(image_max_pixels=cfg.policy.tiny.image_max_pixels)
        proc = Qwen2VLImageProcessorPil(patch_size=sizes.patch_size, merge_size=sizes.merge_size,
                                        min_pixels=sizes.image_min_pixels, max_pixels=sizes.image_max_pixels)
        _, h, w = proc(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert (h // sizes.merge_size, w // sizes.merge_size) == (cells, cells), env


def test_long_demo_experiment_keeps_the_7x7_recipe_and_adds_the_demonstration_loss():
    cfg = _compose(["experiment=long_demo"])
    assert (cfg.steps, cfg.aux_loss.demo_coef, cfg.trainer.eval_interval) == (1200, 0.3, 30)
    # the recipe's values stay: grounding, lr 2e-5 on a cosine, dynamic sampling, the tower's adapter
    assert cfg.grounding.enabled is True and cfg.lr == 2e-5 and cfg.optim.lr_schedule == "cosine"
    assert cfg.sampling.max_rounds == 3 and cfg.policy.lora.include_vision is True
    # it keeps the 8 tasks a step and plain rounds it was measured with, where the default recipe has 16 and adaptive
    assert (cfg.tasks_per_step, cfg.sampling.adaptive_batch) == (8, False)
    assert cfg.algorithm.entropy_coef == 0.0  # as measured, before the default recipe's entropy bonus
    assert cfg.sft.grounding_mix == 0  # as measured, before the default recipe's grounding mix
    assert _compose(["experiment=long_demo_pipelined"]).sft.grounding_mix == 0
    assert _compose(["experiment=long_demo_pipelined"]).tasks_per_step == 8


def test_tiny_9x9_experiment_is_the_7x7_recipe_on_visgym_easy():
    cfg, small = _compose(["experiment=tiny_9x9"]), _compose([])
    assert (cfg.env.variant, cfg.env.mode) == ("easy", "plan")
    assert cfg.policy.tiny.image_max_pixels == _compose(["env=visgym"]).policy.tiny.image_max_pixels
    for key in ("steps", "tasks_per_step", "lr", "grounding.enabled", "sft.grounding_mix", "policy.lora.include_vision",
                "optim.lr_schedule", "sampling.max_rounds",
                "sampling.adaptive_batch", "aux_loss.demo_coef", "algorithm.entropy_coef"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(small, key), key
    # env=visgym alone takes the same GRPO on the plain warm start (conf/recipe/tiny_vl_visgym.yaml: no grounding)
    nine = _compose(["env=visgym"])
    assert (nine.grounding.enabled, nine.sft.grounding_mix, nine.steps, nine.tasks_per_step) == (False, 0, 300, 16)
    assert _compose(["experiment=tiny_9x9", "steps=5"]).steps == 5  # the command line still wins


def test_tiny_9x9_long_is_tiny_9x9_with_two_more_warm_start_stages():
    from rlkit.config import check_ranges
    from rlkit.stages.sft import sft_stage_config, sft_stage_configs

    cfg, short = _compose(["experiment=tiny_9x9_long"]), _compose(["experiment=tiny_9x9"])
    # the first stage is tiny_9x9's warm start, keyed the same (its cache is shared), and GRPO is unchanged
    assert sft_stage_config(cfg.sft) == sft_stage_config(short.sft)
    for key in ("steps", "tasks_per_step", "lr", "env", "grounding", "algorithm", "policy", "trainer.eval_interval"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(short, key), key
    stages = sft_stage_configs(cfg.sft)
    assert [(s["max_steps"], s["target_success"], s["lr_schedule"], s["seed"]) for s in stages] == [
        (1600, 0.45, "constant", 1234), (600, 1.0, "constant", 1234), (600, 1.0, "cosine", 1235)]
    assert stages[2]["grounding_mix"] == 8 and "stages" not in stages[2]
    assert check_ranges(cfg) == []


def test_default_backend_is_two_replicated_ranks_on_ray_and_the_command_line_wins():
    # conf/backend/native_ray_ddp.yaml: native_ray with 2 DDP ranks and 2 rollout workers, one core each
    b = _compose([]).backend
    assert b._target_ == "rlkit.backends.ray_native.RayNativeBackend"
    assert (b.num_workers, b.strategy, b.cpus_per_worker, b.colocate) == (2, "ddp", 1, True)
    assert _compose(["env=visgym"]).backend.strategy == "ddp"  # every env, not only the 7x7 recipe
    assert _compose(["backend=native"]).backend._target_ == "rlkit.backends.native.NativeBackend"
    plain = _compose(["backend=native_ray"]).backend  # native_ray keeps its own defaults
    assert (plain.num_workers, plain.strategy) == (1, "fsdp")
    assert _compose(["backend.num_workers=4"]).backend.num_workers == 4
    # the smoke run stays in one process (no Ray start-up in tests); the command line still moves it onto Ray
    assert _compose(["experiment=smoke"]).backend._target_ == "rlkit.backends.native.NativeBackend"
    assert _compose(["experiment=smoke", "backend=native_ray"]).backend._target_.endswith("RayNativeBackend")
    assert _compose(["experiment=hyperpod_visgym"]).backend._target_ == "rlkit.backends.skyrl.SkyRLBackend"


def test_long_demo_pipelined_is_long_demo_with_the_rollout_beside_the_update():
    cfg, plain = _compose(["experiment=long_demo_pipelined"]), _compose(["experiment=long_demo"])
    for key in ("steps", "lr", "aux_loss.demo_coef", "sampling._target_", "sampling.max_rounds", "trainer.eval_interval",
                "grounding.enabled", "policy.lora.include_vision", "optim.lr_schedule"):
        assert OmegaConf.select(cfg, key) == OmegaConf.select(plain, key), key
    assert cfg.backend._target_.endswith("RayNativeBackend") and cfg.sampling.adaptive_batch
    b = cfg.backend
    assert (b.num_workers, b.num_rollout_workers, b.colocate, b.one_step_off_policy) == (1, 1, False, True)


def test_a_key_named_as_other_trainers_name_it_gets_rlkits_name():
    """TRL's GRPOConfig names (learning_rate, num_generations, beta, ...) and a key with a suffix (lr_rate) are
    answered with rlkit's key; every suggested key is a real one, and no familiar name is one of rlkit's keys."""
    from rlkit.run import FAMILIAR_KEYS, unknown_override_keys

    assert unknown_override_keys(["learning_rate=1e-5", "num_generations=4", "beta=0.04", "lr_rate=1e-5",
                                  "max_steps=10", "epsilon_high=0.28"], CONF) == [
        "learning_rate (did you mean lr?)", "num_generations (did you mean group_size?)",
        "beta (did you mean algorithm.kl_coef?)", "lr_rate (did you mean lr?)", "max_steps (did you mean steps?)",
        "epsilon_high (did you mean algorithm.eps_clip_high?)"]
    cfg = _compose(["experiment=smoke"])
    for theirs, ours in FAMILIAR_KEYS.items():
        assert OmegaConf.select(cfg, ours, default="missing") != "missing", ours
        assert OmegaConf.select(cfg, theirs, default="missing") == "missing", theirs


def test_a_mistyped_key_is_named_with_the_closest_real_one():
    from rlkit.run import unknown_override_keys

    conf = CONF
    argv = ["-m", "aux_loss.demo_cof=0.3", "demo_coef=0.3", "trainer.eval_intervall=3", "sted=3", "zzzz=1",
            # all real: group choices, keys inside untyped groups, Hydra's own, '+' additions (checked later), sweeps
            "env=visgym", "experiment=long_demo", "env.variant=easy", "hydra.run.dir=/tmp/x", "hydra/launcher=basic",
            "+algorithm.extra=1", "lr=1e-5,3e-5", "aux_loss.demo_coef=0.3", "grounding.tasks=[walls]",
            "image_grid@policy.tiny=tiny_vl_visgym_small", "--cfg", "job"]
    assert unknown_override_keys(argv, conf) == [
        "aux_loss.demo_cof (did you mean aux_loss.demo_coef?)",
        "demo_coef (did you mean aux_loss.demo_coef?)",  # a group's key without its group
        "trainer.eval_intervall (did you mean trainer.eval_interval?)",
        "sted (did you mean seed?)",
        "zzzz",
    ]
    # keys inside the untyped groups, checked against the options chosen (here env=visgym, experiment=long_demo)
    assert unknown_override_keys([*argv, "env.wall_mov=stay", "policy.tiny.text_layer=2", "-m", "lr=1e-3,2e-3"], conf)[5:] \
        == ["env.wall_mov (did you mean env.wall_move?)", "policy.tiny.text_layer (did you mean policy.tiny.text_layers?)"]
    # a key of another option of the group than the one chosen: named with the options that have it
    assert unknown_override_keys(["experiment=smoke", "sampling.max_rounds=2"], conf) == [
        "sampling.max_rounds (not a key of the chosen sampling option: sampling=dapo has it)"]
    # a sweep over the options themselves: each job holds other keys, so Hydra checks them per job
    assert unknown_override_keys(["-m", "env=visgym,visgym_small", "env.wall_mov=stay"], conf) == []
    proc = subprocess.run([sys.executable, str(CONF.parent / "train.py"), "experiment=smoke", "aux_loss.demo_cof=0.3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "[rlkit] config error: unknown config key(s): aux_loss.demo_cof (did you mean aux_loss.demo_coef?)" \
        in proc.stderr, proc.stderr
    assert "+aux_loss.demo_cof" not in proc.stderr  # not Hydra's advice to append the typo


def test_a_typo_that_the_sweep_check_skips_still_stops_the_sweep(tmp_path):
    """`-m env=a,b env.wall_mov=...`: train.py leaves keys inside a swept group to Hydra (each job holds other keys),
    and Hydra refuses the key as it composes the sweep's base config, before any job: exit 1, no sweep folder,
    nothing trained. The '+' Hydra then suggests is refused too, by the env's constructor, naming the key."""
    import os

    train = str(CONF.parent / "train.py")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}  # its traceback is the user's choice
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, train, "-m", "env=visgym_small,visgym", "env.wall_mov=stay",
                           "experiment=smoke", f"hydra.sweep.dir={sweep}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "Could not override 'env.wall_mov'" in proc.stderr and "Traceback" not in proc.stderr
    assert not sweep.exists()  # no job ran
    proc = subprocess.run([sys.executable, train, "experiment=smoke", "+env.wall_mov=stay",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "[rlkit] config error: config group 'env'" in proc.stderr and "Traceback" not in proc.stderr
    assert "unexpected keyword argument 'wall_mov'" in proc.stderr, proc.stderr



def test_a_group_option_chosen_on_the_command_line_is_the_one_that_runs():
    assert _compose(["aux_loss=none"]).aux_loss.demo_coef == 0.0
    assert _compose(["experiment=smoke", "sampling=dapo"]).sampling._target_ == "rlkit.sampling.DapoSampling"


def test_interactive_demo_is_the_7x7_maze_played_one_move_a_turn():
    """experiment=interactive_demo: rlkit's 7x7 maze interactive (a new 56x56 picture each turn), a turn budget that
    admits every evaluation maze (the longest of visgym_small_64 needs 16 moves + stop), its warm start chained from
    the plan-mode default's with recovery demonstrations, the 7x7 recipe's schedule and sampling (the recipe is
    picked from the env choice, visgym_small) at the lower lr it was measured with (docs/experiments.md)."""
    from envs.visgym.maze import VARIANT_SIZES, generate_maze, solve_moves
    from envs.visgym.spec import EVAL_SETS

    cfg, small = _compose(["experiment=interactive_demo"]), _compose([])
    assert (cfg.env.variant, cfg.env.mode) == ("small", "interactive")
    longest = max(len(solve_moves(*generate_maze(s, VARIANT_SIZES["small"]))) + 1 for s in EVAL_SETS["visgym_small_64"].seeds)
    assert cfg.env.max_turns >= longest == 17
    assert cfg.policy.tiny.image_max_pixels == small.policy.tiny.image_max_pixels == 56 * 56
    assert cfg.sft.start_from_env == "visgym_small" and cfg.sft.recovery_share == 0.5
    assert cfg.env.parser == "keyword"  # the words the plan-mode warm start writes
    assert cfg.lr == 5e-6 < small.lr and cfg.optim.lr_schedule == small.optim.lr_schedule == "cosine"
    assert cfg.algorithm.entropy_coef == 0.0 and cfg.sampling._target_ == small.sampling._target_ == "rlkit.sampling.DapoSampling"
    assert cfg.rollout.max_new_tokens < small.rollout.max_new_tokens  # one move a turn, not a route
    assert "native.NativeBackend" in cfg.backend._target_  # one process: the control runs beside it on 2 cores
