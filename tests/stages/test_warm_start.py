"""sft.start_from_env: a curriculum over envs. The warm start of another env (as that env's own job builds
it) is built or reused first, and this env's warm start trains on from it at this env's image size, keyed as
the chained job `policy.path=<that warm start> ~policy.tiny policy.image_max_pixels=<this env's>` keys it.
sft.start_from_experiment: the same from an experiment's warm start, whose job may itself start from another's."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

import rlkit.plugins
import rlkit.stages.warm_start
from rlkit.console import Progress
from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.local import LocalExecutor
from rlkit.recipes.validation import check_config
from rlkit.run import ConfigError, compose_train, instantiate_plugin
from rlkit.stages import warm_start as ws


def _cfg(tmp_path, *overrides):
    cfg = compose_train(["experiment=smoke", *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.cache_dir = str(tmp_path / "cache")
        cfg.policy.cache_dir = str(tmp_path / "cache" / "tiny_vl")
    return cfg


def _warm_start(cfg):
    """The warm start GRPORecipe.setup builds for ``cfg`` (its checks first, as setup runs them): the planned
    chain's builds (rlkit.stages.warm_start), or the grounded base without sft."""
    check_config(cfg)
    job = ws.make_job(cfg, instantiate_plugin(cfg.env, "env"))
    problem = ws.grounding_problem(job)
    if problem:
        raise ConfigError(problem)
    progress = Progress(quiet=True)
    if not cfg.sft.enabled:
        return ws.grounded_base(job, progress)
    return ws.build_warm_start(ws.plan_warm_start(job, check_config, progress.say), progress)


def _longest_edge(ckpt):
    return json.loads((Path(ckpt) / "processor_config.json").read_text())["image_processor"]["size"]["longest_edge"]


def test_the_warm_start_starts_from_the_other_envs_build_and_keys_as_the_chained_job(tmp_path, monkeypatch):
    # the other env's job is the smoke's 7x7 one here (its own job composes env=visgym_small alone: ~6 minutes)
    small = ["env=visgym_small"]
    monkeypatch.setattr(rlkit.stages.warm_start, "compose_train", lambda overrides: _cfg(tmp_path, *small)
                        if list(overrides) == small else pytest.fail(f"composed {overrides}"))
    ws = _warm_start(_cfg(tmp_path, "env=visgym", "sft.start_from_env=visgym_small"))
    built = sorted((tmp_path / "cache" / "sft").glob("*/sft_summary.json"))
    assert len(built) == 2  # the 7x7 warm start and the 9x9 stage on it
    first = _warm_start(_cfg(tmp_path, *small))  # the 7x7 job reuses the build the curriculum made
    assert sorted((tmp_path / "cache" / "sft").glob("*/sft_summary.json")) == built
    assert Path(first, "sft_summary.json") in built and Path(ws) != Path(first)
    assert len(list((tmp_path / "cache" / "grounding").glob("*/grounding_summary.json"))) == 1  # 7x7's only
    assert _longest_edge(first) == 3136  # 7x7: 56x56 px (conf/image_grid/tiny_vl_visgym_small.yaml)
    assert _longest_edge(ws) == 5184  # 9x9: 72x72 px, one image token per cell
    history = json.loads(Path(ws, "sft_summary.json").read_text())["history"]
    assert [h["step"] for h in history] == [2]  # the smoke's 2 steps, trained on 9x9
    chained = _warm_start(_cfg(tmp_path, "env=visgym", f"policy.path={first}", "~policy.tiny",
                               "policy.image_max_pixels=5184"))
    assert chained == ws  # reused, not trained again


def test_start_from_env_is_refused_before_any_work_when_it_cannot_apply(tmp_path):
    with pytest.raises(ConfigError, match=r"sft.start_from_env='visgym_tiny' is not an env config: use one of "
                                          r".*visgym_small"):
        _warm_start(_cfg(tmp_path, "env=visgym", "sft.start_from_env=visgym_tiny"))
    with pytest.raises(ConfigError, match="names a checkpoint to start from: drop one of them"):
        _warm_start(_cfg(tmp_path, "env=visgym", "sft.start_from_env=visgym_small", "policy.path=/nowhere"))
    with pytest.raises(ConfigError, match="is this job's env: a warm start cannot start from itself"):
        _warm_start(_cfg(tmp_path, "sft.start_from_env=visgym_small"))
    assert not (tmp_path / "cache" / "sft").exists()


def test_start_from_leaves_the_stage_key_as_before():
    from rlkit.config import SFTConfig
    from rlkit.stages.sft import sft_stage_config

    off = OmegaConf.structured(SFTConfig)
    for key, name in (("start_from_env", "visgym_small"), ("start_from_experiment", "tiny_9x9_curriculum")):
        on = OmegaConf.merge(off, {key: name})
        assert sft_stage_config(on) == sft_stage_config(off) and key not in sft_stage_config(off)


def _composes(tmp_path, monkeypatch, jobs):
    """compose_train as the running job sees it: ``jobs`` maps an override (e.g. "env=visgym_small") to the
    smoke-sized overrides its job composes here (the real ones build for minutes to an hour)."""
    monkeypatch.setattr(rlkit.stages.warm_start, "compose_train", lambda overrides: _cfg(tmp_path, *jobs[overrides[0]])
                        if len(overrides) == 1 and overrides[0] in jobs else pytest.fail(f"composed {overrides}"))


def test_start_from_experiment_builds_the_experiments_chain_then_trains_on_at_this_envs_image_size(
        tmp_path, monkeypatch):
    # 7x7 -> 9x9 -> 7x7, as experiment=tiny_7x7_from_9x9: the experiment's job itself starts from env=visgym_small's
    nine = ["env=visgym", "sft.start_from_env=visgym_small"]
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": nine, "env=visgym_small": ["env=visgym_small"]})
    ws = _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum"))
    built = sorted((tmp_path / "cache" / "sft").glob("*/sft_summary.json"))
    assert len(built) == 3  # 7x7, 9x9 on it, and this job's 7x7 stage on that
    assert len(list((tmp_path / "cache" / "grounding").glob("*/grounding_summary.json"))) == 1  # the first 7x7's
    nine_ws = _warm_start(_cfg(tmp_path, *nine))  # the experiment's own job reuses what the chain built
    assert sorted((tmp_path / "cache" / "sft").glob("*/sft_summary.json")) == built
    assert Path(nine_ws, "sft_summary.json") in built and Path(ws) != Path(nine_ws)
    assert _longest_edge(nine_ws) == 5184 and _longest_edge(ws) == 3136  # back at 7x7's 56x56 px
    chained = _warm_start(_cfg(tmp_path, f"policy.path={nine_ws}", "~policy.tiny", "policy.image_max_pixels=3136"))
    assert chained == ws  # keyed as the hand-chained job


def test_a_chain_holds_out_what_its_outermost_job_holds_out_on_the_same_evaluation_set(tmp_path, monkeypatch):
    # 7x7 under env.holdout=dihedral -> 9x9 -> 7x7: the inner 7x7 stages must not train on the evaluation mazes'
    # turned or mirrored twins either (its own job holds out layouts only); 9x9 evaluates elsewhere, unchanged
    nine = ["env=visgym", "sft.start_from_env=visgym_small"]
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": nine, "env=visgym_small": ["env=visgym_small"]})
    _warm_start(_cfg(tmp_path, "env.holdout=dihedral", "sft.start_from_experiment=tiny_9x9_curriculum"))
    built = sorted((tmp_path / "cache" / "sft").glob("*/sft_summary.json"))
    assert len(built) == 3
    dihedral = _warm_start(_cfg(tmp_path, "env=visgym_small", "env.holdout=dihedral"))
    assert Path(dihedral, "sft_summary.json") in built  # the inner 7x7 job was the dihedral one
    _warm_start(_cfg(tmp_path, "env=visgym_small"))  # the layout-holdout 7x7 job was not built by the chain
    assert len(list((tmp_path / "cache" / "sft").glob("*/sft_summary.json"))) == 4
    grounded = sorted((tmp_path / "cache" / "grounding").glob("*/grounding_summary.json"))
    assert len(grounded) == 2  # one for each holdout


def test_start_from_experiment_is_refused_before_any_work_when_it_cannot_apply(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"sft.start_from_experiment='tiny_5x5' is not an experiment config: use one "
                                          r"of .*tiny_9x9_curriculum"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_5x5"))
    with pytest.raises(ConfigError, match="both name a warm start to start from: set one of them"):
        _warm_start(_cfg(tmp_path, "env=visgym", "sft.start_from_env=visgym_small",
                         "sft.start_from_experiment=tiny_9x9_curriculum"))
    # a chain that comes back: the experiment's job starts from an env whose job starts from the experiment's
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": ["env=visgym", "sft.start_from_env=visgym_small"],
                                      "env=visgym_small": ["sft.start_from_experiment=tiny_9x9_curriculum"]})
    with pytest.raises(ConfigError, match=r"the warm starts chain experiment=tiny_9x9_curriculum -> env=visgym_small "
                                          r"-> experiment=tiny_9x9_curriculum comes back to"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum"))
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": ["env=visgym", "sft.enabled=false"]})
    with pytest.raises(ConfigError, match="the job experiment=tiny_9x9_curriculum has no warm start to start from"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum"))
    # this job's policy.tiny would build nothing: the experiment's job builds the warm start with its own
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": ["env=visgym"]})
    with pytest.raises(ConfigError, match=r"this job's policy.tiny.text_layers=2 would change nothing \(that job has 4\)"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum", "policy.tiny.text_layers=2"))
    assert not (tmp_path / "cache" / "sft").exists()


def test_a_refusal_inside_the_chain_names_the_chain_it_came_from(tmp_path, monkeypatch):
    _composes(tmp_path, monkeypatch, {"experiment=tiny_9x9_curriculum": ["env=visgym", "sft.start_from_env=visgym"],
                                      "env=visgym": ["env=visgym"]})
    with pytest.raises(ConfigError, match=r"in the warm start this job starts from \(experiment=tiny_9x9_curriculum\): "
                                          r"sft.start_from_env=visgym is this job's env"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum"))
    assert not (tmp_path / "cache" / "sft").exists()


def test_answers_the_rollouts_would_cut_are_refused_before_any_build_of_the_chain(tmp_path, monkeypatch):
    # an inner job of the chain whose solver answers need more tokens than its rollouts allow (plan_walls
    # transcribes every wall before the route): refused before its own chain's 7x7 build, not after an hour of builds
    _composes(tmp_path, monkeypatch, {
        "experiment=tiny_9x9_curriculum": ["env=visgym", "sft.start_from_env=visgym_small", "env.parser=plan_walls"],
        "env=visgym_small": ["env=visgym_small"]})
    with pytest.raises(ConfigError, match=r"in the warm start this job starts from \(experiment=tiny_9x9_curriculum\): "
                                          r"rollout.max_new_tokens=24 cuts answers: .* set rollout.max_new_tokens=\d+"):
        _warm_start(_cfg(tmp_path, "sft.start_from_experiment=tiny_9x9_curriculum"))
    assert not (tmp_path / "cache" / "sft").exists() and not (tmp_path / "cache" / "grounding").exists()
    # the outermost job's own answers: refused by setup before the grounding stage and the warm start
    cfg = _cfg(tmp_path, "env=visgym_small", "env.parser=plan_walls", "grounding.enabled=true", "logger=console")
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens=24 cuts answers: the solver's answer to evaluation "
                                          r"task \d+ is \d+ tokens in the env's answer format"):
        GRPORecipe(cfg, LocalExecutor()).setup()
    assert not (tmp_path / "cache" / "sft").exists() and not (tmp_path / "cache" / "grounding").exists()
    # with room for them, the same check passes
    cfg = _cfg(tmp_path, "env=visgym_small", "env.parser=plan_walls", "rollout.max_new_tokens=80")
    check_config(cfg)
    job = ws.make_job(cfg, instantiate_plugin(cfg.env, "env"))
    ws.check_answer_fits(job, ws.tokenizer_before_builds(cfg.policy))  # no error: 80 tokens hold every answer


def test_an_edited_prompt_text_builds_another_warm_start(tmp_path, monkeypatch):
    """The env's prompt is code, not config: the warm-start key hashes it (rlkit.stages.cache.prompt_fingerprint), so a
    warm start that learned to answer the old text is not reused for the new one."""
    import envs.visgym.episode as episode

    cfg = ["grounding.enabled=false"]
    first = _warm_start(_cfg(tmp_path, *cfg))
    assert _warm_start(_cfg(tmp_path, *cfg)) == first  # the same prompt: reused
    original = episode.system_prompt
    monkeypatch.setattr(episode, "system_prompt", lambda *a: original(*a) + " Think before you answer.")
    edited = _warm_start(_cfg(tmp_path, *cfg))
    assert edited != first
    assert len(list((tmp_path / "cache" / "sft").glob("*/sft_summary.json"))) == 2


def test_the_fingerprint_hashes_the_prompt_and_the_demonstrated_answer(monkeypatch):
    import envs.visgym.episode as episode
    from rlkit.stages.cache import prompt_fingerprint

    def env(parser="plan"):
        return instantiate_plugin(OmegaConf.create({"_target_": "envs.visgym.VisGymMaze", "variant": "small",
                                                    "mode": "plan", "parser": parser, "max_turns": 17}), "env")

    plain = prompt_fingerprint(env())
    assert prompt_fingerprint(env()) == plain and prompt_fingerprint(env("plan_walls")) != plain
    import envs.visgym.spec as spec

    original = episode.demonstration_texts
    # the name VisGymMaze.demonstration calls (envs/visgym/spec.py imports it)
    monkeypatch.setattr(spec, "demonstration_texts", lambda *a: [t.upper() for t in original(*a)])
    assert prompt_fingerprint(env()) != plain  # another answer format: another warm start
