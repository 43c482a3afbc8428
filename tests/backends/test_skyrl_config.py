"""backend=skyrl: the Hydra config compiled into SkyRL's config, validated by SkyRL's own classes.

SkyRL's config module (skyrl 0.3.0) imports on CPU with `pip install --no-deps skyrl==0.3.0 loguru`
(not in .venv: installed that way its requirements break `pip check`; docs/install.md); the tests that need it
skip without it. Its full SkyRLTrainConfig (whose __post_init__ imports the
GPU inference backend) is used when that imports (Python 3.12 + rlkit[skyrl]); else the four
sections are built with SkyRL's strict builder (rlkit.backends.skyrl.schema).
"""

import json
import sys

import pytest
from omegaconf import OmegaConf

from rlkit.backends.skyrl import REWARDED_ENV_ID, SkyRLBackend, SkyRLConfigError
from rlkit.backends.skyrl.compile import VISION_EXCLUDE_REGEX
from rlkit.backends.skyrl.data import dataset_rows, write_datasets
from rlkit.backends.skyrl.settings import SkyRLSettings
from rlkit.run import ConfigError

from .conftest import compose_cfg

SCENARIO = ["experiment=hyperpod_visgym"]


def _backend(cfg) -> SkyRLBackend:
    return SkyRLBackend(**{k: v for k, v in OmegaConf.to_container(cfg.backend, resolve=True).items()
                           if k != "_target_"})


def _job(overrides=(), base=SCENARIO):
    cfg = compose_cfg([*base, *overrides])
    return cfg, _backend(cfg).compile(cfg)


def test_hyperpod_scenario_compiles_and_skyrl_validates_it():
    sc = pytest.importorskip("skyrl.train.config.config")
    from rlkit.backends.skyrl.schema import validate

    cfg, job = _job()
    assert cfg.backend._target_ == "rlkit.backends.skyrl.SkyRLBackend"
    validated = validate(job.config)
    d = validated.as_dict
    if validated.level == "full":
        assert isinstance(validated.typed, sc.SkyRLTrainConfig)
    else:
        assert isinstance(validated.typed["trainer"], sc.TrainerConfig)
        assert isinstance(validated.typed["generator"], sc.GeneratorConfig)
    lora = d["trainer"]["policy"]["model"]["lora"]
    assert (lora["rank"], lora["alpha"]) == (32, 64)
    assert lora["lora_sync_path"].startswith("/shared/")
    assert lora["target_modules"] == "all-linear" and lora["exclude_modules"] == VISION_EXCLUDE_REGEX
    assert d["generator"]["n_samples_per_prompt"] == 8
    assert d["generator"]["max_turns"] == 18
    assert d["generator"]["vision_language_generator"] is True
    assert d["trainer"]["resume_mode"] == "latest"
    assert d["trainer"]["placement"]["colocate_all"] is True
    assert d["trainer"]["placement"]["policy_num_nodes"] == 3
    ie = d["generator"]["inference_engine"]
    assert ie["num_engines"] * ie["tensor_parallel_size"] == 3 * d["trainer"]["placement"]["policy_num_gpus_per_node"]
    assert d["trainer"]["algorithm"]["advantage_estimator"] == "grpo"
    assert d["trainer"]["algorithm"]["use_kl_loss"] is False
    assert (d["trainer"]["algorithm"]["eps_clip_low"], d["trainer"]["algorithm"]["eps_clip_high"]) == (0.2, 0.28)
    assert d["trainer"]["max_training_steps"] == 160 and d["trainer"]["epochs"] == 1
    for key in ("ckpt_path", "export_path", "log_path"):
        assert d["trainer"][key].startswith("/shared/skyrl/")
    assert d["data"]["val_data"][0].startswith("/shared/") and d["data"]["train_data"][0].endswith("train.jsonl")
    assert d["environment"]["env_class"] == REWARDED_ENV_ID
    assert d["generator"]["eval_sampling_params"]["temperature"] == 0.0
    assert d["trainer"]["policy"]["model"]["path"].startswith("/shared/")  # the VisGym SFT checkpoint
    assert cfg.sft.enabled is False and cfg.env.max_turns == 18 and cfg.paths.shared == "/shared"


def test_scenario_has_the_clusters_shape_and_a_budget_that_admits_every_eval_maze():
    """Issue 63 item 8: the experiment asked for 3 x 8 GPUs while the manifests render 3 x 2 (ml.g7e.12xlarge),
    and its 15 turns admitted at most 50 of the 64 eval mazes."""
    from envs.visgym.maze import VARIANT_SIZES, generate_maze, solve_moves
    from envs.visgym.spec import EVAL_SETS
    from launchers.manifests import WorkerConf

    cfg, job = _job()
    worker = WorkerConf()
    assert (cfg.backend.num_nodes, cfg.backend.gpus_per_node) == (worker.replicas, worker.gpus)
    placement = job.config["trainer"]["placement"]
    assert (placement["policy_num_nodes"], placement["policy_num_gpus_per_node"]) == (worker.replicas, worker.gpus)
    assert (cfg.tasks_per_step * cfg.group_size) % (worker.replicas * worker.gpus) == 0
    eval_set = EVAL_SETS["visgym_easy_64"]
    assert cfg.env.variant == eval_set.variant == "easy"
    turns = [len(solve_moves(*generate_maze(s, VARIANT_SIZES["easy"]))) + 1 for s in eval_set.seeds]
    assert max(turns) <= cfg.env.max_turns == job.config["generator"]["max_turns"]


def test_skyrl_rejects_unknown_keys():
    pytest.importorskip("skyrl.train.config.config")
    from rlkit.backends.skyrl.schema import validate

    _, job = _job()
    job.config["trainer"]["eval_intervall"] = 3
    with pytest.raises(SkyRLConfigError, match="eval_intervall"):
        validate(job.config)


def test_command_line_parses_back_to_the_config():
    _, job = _job()
    parsed = OmegaConf.to_container(OmegaConf.from_cli(job.overrides()))
    assert parsed == json.loads(json.dumps(job.config))
    cmd = job.command()
    assert cmd.startswith("python -m rlkit.backends.skyrl.entrypoint")
    assert "generator.n_samples_per_prompt=8" in cmd and "trainer.policy.model.lora.rank=32" in cmd


def test_datasets_are_skyrl_prompt_rows(tmp_path):
    cfg, job = _job([f"backend.run_dir={tmp_path}/run", "steps=2"])
    train, evals = dataset_rows(job)
    assert [r["seed"] for r in evals] == list(range(64))
    assert len(train) == 2 * cfg.tasks_per_step and all(r["seed"] >= 64 or r["seed"] not in range(64) for r in train)
    for row in (train[0], evals[0]):
        assert row["env_class"] == REWARDED_ENV_ID
        assert row["prompt"][0]["role"] == "user" and isinstance(row["prompt"][0]["content"], str)
        task = json.loads(row["rlkit_task"])
        assert task["env"]["max_turns"] == 18 and task["env"]["mode"] == "interactive"
        assert task["reward"]["_target_"] == "rewards.MazeExit"
    assert evals[0]["data_source"] == "visgym_easy_64" and train[0]["data_source"] == "visgym_easy_64_train"
    train_path, eval_path = write_datasets(job)
    assert str(train_path) == job.train_data and str(eval_path).startswith(str(tmp_path))
    lines = eval_path.read_text().splitlines()
    assert len(lines) == 64 and json.loads(lines[5])["seed"] == 5


def test_same_training_tasks_as_the_native_sampler():
    from rlkit.tasks import TaskSampler

    cfg, job = _job(["steps=3"])
    from envs.visgym import VisGymMaze

    spec = VisGymMaze(**{k: v for k, v in OmegaConf.to_container(cfg.env).items() if k != "_target_"})
    assert job.train_seeds == TaskSampler(cfg.seed, spec.is_eval_seed).sample(3 * cfg.tasks_per_step)
    # a fixed training pool (train_tasks=N) gives SkyRL's dataset the same draws: N distinct tasks, repeated
    cfg, job = _job(["steps=3", "train_tasks=4"])
    assert job.train_seeds == TaskSampler(cfg.seed, spec.is_eval_seed, pool_size=4).sample(3 * cfg.tasks_per_step)
    assert len(set(job.train_seeds)) == 4


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.entropy_coef=0.01", "algorithm.entropy_coef"),
        ("aux_loss.demo_coef=0.3", "aux_loss.demo_coef"),
        ("aux_loss.demo_max_successes=1", "aux_loss.demo_coef"),
        ("algorithm.filter_zero_variance_groups=true", "algorithm.filter_zero_variance_groups"),
        ("sampling=dapo", "sampling=dapo"),
        ("+sampling.max_rounds=2", "sampling=plain"),
        ("+sampling.adaptive_batch=true", "sampling=plain"),
        ("algorithm.kl_coef=0.01", "algorithm.kl_coef"),
        ("algorithm.adv_eps=1e-5", "algorithm.adv_eps"),
        ("sft.enabled=true", "sft.enabled"),
        ("eval.pass_k=4", "eval.pass_k"),
        ("eval.seen_tasks=64", "eval.seen_tasks"),
        ("trainer.deterministic=true", "trainer.deterministic"),
        ("trainer.num_threads=2", "trainer.num_threads"),
        ("trainer.build_threads=2", "trainer.build_threads"),
        ("policy.image_max_pixels=50176", "policy.image_min_pixels/image_max_pixels"),
        ("policy.seed=7", "policy.seed"),
        ("group_size=1", "group_size"),
        ("algorithm.mini_batch_size=12", "algorithm.mini_batch_size"),
        ("tasks_per_step=5", "tasks_per_step*group_size"),
        ("backend.tensor_parallel_size=5", "backend.tensor_parallel_size"),
        ("policy.lora.target_modules=.*_proj", "policy.lora.target_modules"),
        ("control=fixed_image", "control=fixed_image"),
    ],
)
def test_unsupported_option_is_a_clear_error(override, key):
    with pytest.raises(SkyRLConfigError) as e:
        _job([override])
    assert key in str(e.value) and "docs/skyrl.md" in str(e.value)


def test_every_problem_is_listed_at_once():
    with pytest.raises(SkyRLConfigError) as e:
        _job(["algorithm.entropy_coef=0.01", "eval.pass_k=2", "sft.enabled=true"])
    msg = str(e.value)
    assert "algorithm.entropy_coef" in msg and "eval.pass_k" in msg and "sft.enabled" in msg


def test_tiny_policy_and_native_defaults_are_refused_with_the_fix():
    with pytest.raises(SkyRLConfigError) as e:
        _job(["backend=skyrl"], base=[])
    assert "policy.path=null" in str(e.value) and "sft.enabled=true" in str(e.value)


def test_algorithm_mapping_dr_grpo_dual_clip_kl_schedule():
    _, job = _job(["algorithm=dr_grpo", "algorithm.clip_ratio_c=3.0", "algorithm.kl_coef=0.0",
                   "optim.warmup_steps=2", "optim.lr_schedule=cosine", "algorithm.update_epochs=2",
                   "algorithm.mini_batch_size=96", "rollout.top_k=20", "rollout.temperature=0.9"])
    a = job.config["trainer"]["algorithm"]
    assert a["loss_reduction"] == "seq_mean_token_sum_norm" and a["max_seq_len"] == 1
    assert a["grpo_norm_by_std"] is False
    assert a["policy_loss_type"] == "dual_clip" and a["clip_ratio_c"] == 3.0
    assert a["temperature"] == 0.9
    opt = job.config["trainer"]["policy"]["optimizer_config"]
    # 192 sequences / 96 per mini-batch = 2 optimizer steps per epoch, 2 epochs, 2 warmup GRPO steps
    assert opt["num_warmup_steps"] == 2 * 2 * 2 and opt["scheduler"] == "cosine"
    assert job.config["trainer"]["policy_mini_batch_size"] == 12
    assert job.config["generator"]["sampling_params"]["top_k"] == 20


def test_kl_with_sequence_mean_is_honoured():
    _, job = _job(["algorithm.kl_coef=0.001", "algorithm.loss_reduction=seq_mean_token_mean"])
    a = job.config["trainer"]["algorithm"]
    assert a["use_kl_loss"] is True and a["kl_loss_coef"] == 0.001 and a["loss_reduction"] == "sequence_mean"


def test_intervals_and_lora_lists():
    _, job = _job(["trainer.eval_interval=0", "trainer.ckpt_interval=0", "policy.lora.target_modules=[q_proj,v_proj]"])
    t = job.config["trainer"]
    assert (t["eval_interval"], t["ckpt_interval"], t["hf_save_interval"]) == (160, 160, 160)
    assert t["policy"]["model"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    assert t["policy"]["model"]["lora"]["exclude_modules"] is None


def test_vision_lora_turns_on_vllms_tower_lora_and_a_patch_embedding_target_is_refused():
    """Issue 63: vLLM applies LoRA to the vision tower and merger only with enable_tower_connector_lora (else it
    drops them silently) and never to the Conv3d patch embedding, which a bare 'proj' target also matches."""
    def engine_kwargs(overrides):
        return _job(overrides)[1].config["generator"]["inference_engine"]["engine_init_kwargs"]

    assert "enable_tower_connector_lora" not in engine_kwargs([])  # the scenario: language model only
    assert engine_kwargs(["policy.lora.include_vision=true"])["enable_tower_connector_lora"] is True
    assert engine_kwargs(["policy.lora.target_modules=[q_proj,v_proj,qkv,linear_fc1]"])[
        "enable_tower_connector_lora"] is True
    assert "enable_tower_connector_lora" not in engine_kwargs(["policy.lora.target_modules=[q_proj,v_proj]"])
    for targets in ("[q_proj,v_proj,proj]", "[q_proj,patch_embed.proj]"):
        with pytest.raises(SkyRLConfigError) as e:
            _job([f"policy.lora.target_modules={targets}"])
        assert "visual.patch_embed.proj" in str(e.value) and "policy.lora.include_vision" in str(e.value)
    with pytest.raises(SkyRLConfigError, match="enable_tower_connector_lora=false"):
        _job(["policy.lora.include_vision=true", "+backend.engine_init_kwargs.enable_tower_connector_lora=false"])


def test_plan_mode_is_single_turn():
    _, job = _job(["env=visgym", "env.max_turns=18"])
    g = job.config["generator"]
    assert g["max_turns"] == 1 and g["max_input_length"] == job.config["trainer"]["max_prompt_length"]


def test_stop_strings_follow_the_env_unless_given():
    """Plan mode's parser reads an <answer> block: turns stop at "</answer>" (the native rollout's
    default too) and SkyRL closes them with the end-of-turn token; rollout.stop=[] turns it off."""
    _, job = _job(["env=visgym"])
    g = job.config["generator"]
    assert g["sampling_params"]["stop"] == g["eval_sampling_params"]["stop"] == ["</answer>"]
    assert g["append_eos_token_after_stop_str_in_multi_turn"] is True
    _, job = _job(["env=visgym", "rollout.stop=[]"])
    assert job.config["generator"]["sampling_params"]["stop"] is None
    _, job = _job(["env=visgym_interactive"])  # upstream's tuple parser reads the whole text: no stop string
    assert job.config["generator"]["sampling_params"]["stop"] is None


def test_logger_mapping():
    _, job = _job(["logger.entity=lab", "logger.mode=offline", "logger.name=maze-8b"])
    assert job.config["trainer"]["logger"] == "wandb" and job.config["trainer"]["run_name"] == "maze-8b"
    assert job.env_vars == {"WANDB_ENTITY": "lab", "WANDB_MODE": "offline"}
    assert job.run_dir == "/shared/skyrl/rlkit/maze-8b"
    _, job = _job(["logger=console"])
    assert job.config["trainer"]["logger"] == "console" and job.env_vars == {}


def test_backend_settings_are_checked():
    with pytest.raises(ConfigError, match="backend.gpu_memory_utilization"):
        SkyRLSettings(gpu_memory_utilization=1.5)
    with pytest.raises(TypeError, match="num_gpus"):
        SkyRLBackend(num_gpus=8)


def test_dry_run_writes_the_config_and_starts_nothing(tmp_path, capsys):
    cfg = compose_cfg([*SCENARIO, "backend.dry_run=true", f"paths.output_dir={tmp_path}"])
    from rlkit.run import run

    result = run(cfg)
    assert result["status"] == "dry_run"
    assert (tmp_path / "skyrl_config.yaml").is_file()
    assert (tmp_path / "skyrl_command.sh").read_text().startswith("python -m rlkit.backends.skyrl.entrypoint")
    assert "python -m rlkit.backends.skyrl.entrypoint" in capsys.readouterr().out
    assert not (tmp_path / "data").exists()


def test_config_script_prints_yaml_and_command(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "skyrl_config.py"
    spec = importlib.util.spec_from_file_location("skyrl_config_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([*SCENARIO, "--overrides-only"]) == 0
    out = capsys.readouterr().out
    assert "n_samples_per_prompt: 8" in out and "python -m rlkit.backends.skyrl.entrypoint" in out
    assert module.main([*SCENARIO, "algorithm.entropy_coef=0.1"]) == 2
    assert "algorithm.entropy_coef" in capsys.readouterr().err


def test_launch_without_gpu_stack_names_the_install():
    from rlkit.backends.skyrl.entrypoint import SkyRLUnavailableError, require_skyrl_runtime

    if sys.version_info >= (3, 12):
        try:
            require_skyrl_runtime()
        except SkyRLUnavailableError as e:
            assert "pip install 'rlkit[skyrl]'" in str(e)
            return
        pytest.skip("SkyRL's GPU stack is installed here")
    with pytest.raises(SkyRLUnavailableError, match=r"pip install 'rlkit\[skyrl\]'` on Python 3.12 with CUDA"):
        require_skyrl_runtime()


def test_resume_none_over_checkpoints_needs_overwrite(tmp_path, monkeypatch):
    cfg = compose_cfg([*SCENARIO, "logger=console", "trainer.resume_mode=none", f"backend.run_dir={tmp_path}",
                       f"paths.output_dir={tmp_path}/out"])
    (tmp_path / "ckpts" / "global_step_10").mkdir(parents=True)
    backend = _backend(cfg)
    with pytest.raises(ConfigError, match="trainer.overwrite=true"):
        backend._preflight(backend.compile(cfg), cfg)


def test_wandb_without_api_key_is_refused_before_launch(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg, job = _job()
    backend = SkyRLBackend()
    with pytest.raises(ConfigError, match="WANDB_API_KEY"):
        backend._preflight(job, cfg)


def test_lora_targets_adapt_what_rlkit_adapts(tmp_path):
    """SkyRL builds its LoRA with peft (target_modules, exclude_modules) on the HF model; on a tiny
    Qwen3-VL that must adapt exactly the modules rlkit's own "all-linear" adapts (language model only)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from rlkit.backends.skyrl.compile import _lora_targets
    from rlkit.policy.lora import LoraSettings, resolve_target_modules
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy

    ckpt = build_tiny_policy(tmp_path / "tiny", TinyVLSizes(text_layers=1, vision_depth=1, deepstack_indexes=[0]))

    def adapted(model, **lora_kwargs):
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, **lora_kwargs))
        return {n.removesuffix(".lora_A.default.weight").split("base_model.model.", 1)[1]
                for n, _ in peft_model.named_parameters() if n.endswith("lora_A.default.weight")}

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(ckpt)
    ours = adapted(model, target_modules=resolve_target_modules(model, LoraSettings(rank=4, alpha=8)))
    targets, exclude = _lora_targets("all-linear", include_vision=False)
    theirs = adapted(AutoModelForImageTextToText.from_pretrained(ckpt), target_modules=targets,
                     exclude_modules=exclude)
    assert ours == theirs and ours and all(".language_model." in f".{n}" for n in ours)
    # with the vision side: peft's all-linear (what SkyRL passes) adapts the tower's linears, never the Conv3d
    # patch embedding vLLM cannot apply; a bare 'proj' in a list does reach it (so the compiler refuses it)
    from rlkit.serve.vllm import PATCH_EMBED_MODULE

    targets, exclude = _lora_targets("all-linear", include_vision=True)
    vis = adapted(AutoModelForImageTextToText.from_pretrained(ckpt), target_modules=targets, exclude_modules=exclude)
    assert any(".visual.blocks." in f".{n}" for n in vis) and PATCH_EMBED_MODULE not in vis
    listed = adapted(AutoModelForImageTextToText.from_pretrained(ckpt), target_modules=["q_proj", "proj"])
    assert PATCH_EMBED_MODULE in listed


def test_train_py_dry_run_end_to_end(tmp_path):
    """`python train.py experiment=hyperpod_visgym backend.dry_run=true`: a real Hydra job that compiles,
    writes skyrl_config.yaml / skyrl_command.sh into its folder and starts nothing."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), WANDB_MODE="offline")
    out = tmp_path / "job"
    proc = subprocess.run([sys.executable, str(root / "train.py"), *SCENARIO, "backend.dry_run=true",
                           f"hydra.run.dir={out}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    command = (out / "skyrl_command.sh").read_text()
    # the run folder is named after the job's overrides, without backend.dry_run
    assert "trainer.ckpt_path=/shared/skyrl/rlkit/experiment_hyperpod_visgym/ckpts" in command
    assert "python -m rlkit.backends.skyrl.entrypoint" in proc.stdout


def test_real_run_without_gpu_stack_stops_with_the_install_hint(tmp_path):
    """backend=skyrl without dry_run on a CPU machine: datasets are written, then the launch names the fix."""
    if sys.version_info >= (3, 12):
        pytest.skip("the guard's Python-version branch is what this CPU test checks")
    pytest.importorskip("skyrl.train.config.config")  # validation comes first; without SkyRL it stops there
    from rlkit.backends.skyrl.entrypoint import SkyRLUnavailableError

    cfg = compose_cfg([*SCENARIO, "logger=console", "steps=1", f"backend.run_dir={tmp_path}/run",
                       f"paths.output_dir={tmp_path}/out"])
    with pytest.raises(SkyRLUnavailableError, match=r"pip install 'rlkit\[skyrl\]'"):
        _backend(cfg).run(cfg)
    assert (tmp_path / "run" / "data" / "eval.jsonl").is_file()
    assert (tmp_path / "out" / "skyrl_command.sh").is_file()
