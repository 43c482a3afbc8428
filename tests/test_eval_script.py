"""scripts/eval.py: the twins of the evaluation mazes (--twins), the grounding questions on them (--reading), and a
control run evaluated as its run did."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from envs.visgym import VisGymMaze
from tests.conftest import TEST_DTYPE

ROOT = Path(__file__).resolve().parents[1]


def load_eval_script():
    spec = importlib.util.spec_from_file_location("rlkit_script_eval", ROOT / "scripts" / "eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_twins_are_reported_beside_each_failed_eval_maze(monkeypatch, capsys):
    import rlkit.evaluation
    import rlkit.policy

    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    by_eval = env.eval_set.twin_seeds(6000)
    s0, s1 = env.eval_seeds()[:2]
    unsolved = set(by_eval[s0][:2])  # a fake policy that fails two twins of the first eval maze, solves the rest

    def fake_evaluate(env_spec, policy, engine, seeds, sampling, policy_version, batch_size):
        return {}, [{"seed": s, "success": s not in unsolved} for s in seeds], None

    monkeypatch.setattr(rlkit.evaluation, "evaluate", fake_evaluate)
    monkeypatch.setattr(rlkit.policy, "make_engine", lambda policy: None)
    per_task = [{"seed": s, "success": s not in (s0, s1)} for s in env.eval_seeds()]
    assert load_eval_script().eval_twins(env, None, None, per_task, 6000, 64) == 0
    out = capsys.readouterr().out.splitlines()
    assert "99.4% (342/344) of the twins of 64 evaluation mazes; 344 of them are training tasks (env.holdout=layout)" \
        in out[0]
    n0, n1 = len(by_eval[s0]), len(by_eval[s1])
    assert out[1:] == [f"  failed evaluation maze {s0}: its twins solved {n0 - 2}/{n0}",
                       f"  failed evaluation maze {s1}: its twins solved {n1}/{n1}"]


def test_twins_held_out_by_the_dihedral_holdout_are_not_counted_as_trained(monkeypatch, capsys):
    import rlkit.evaluation
    import rlkit.policy

    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17, holdout="dihedral")
    monkeypatch.setattr(rlkit.evaluation, "evaluate", lambda env_spec, policy, engine, seeds, *a, **k:
                        ({}, [{"seed": s, "success": False} for s in seeds], None))
    monkeypatch.setattr(rlkit.policy, "make_engine", lambda policy: None)
    per_task = [{"seed": s, "success": True} for s in env.eval_seeds()]
    assert load_eval_script().eval_twins(env, None, None, per_task, 6000, 64) == 0
    assert "0.0% (0/344) of the twins of 64 evaluation mazes; 0 of them are training tasks (env.holdout=dihedral)" \
        in capsys.readouterr().out


def test_twins_need_a_maze_env(capsys):
    class NotAMaze:
        pass

    assert load_eval_script().eval_twins(NotAMaze(), None, None, [], 100, 8) == 2
    assert "--twins needs a VisGym maze env" in capsys.readouterr().err


def test_a_fixed_image_control_run_is_evaluated_on_its_picture(capsys):
    """eval.py on a control=fixed_image run shows the picture the run trained and evaluated on (rlkit.controls)."""
    from rlkit.controls import FixedImageEnvSpec, fixed_image_seed
    from rlkit.serve.config import compose

    script = load_eval_script()
    plain = script.eval_env_spec(compose(["seed=3"]))
    assert not isinstance(plain, FixedImageEnvSpec)
    blind = script.eval_env_spec(compose(["seed=3", "control=fixed_image"]))
    assert isinstance(blind, FixedImageEnvSpec)
    seed = fixed_image_seed(3, plain)
    assert blind.image_seed == seed and not plain.is_eval_seed(seed)
    assert seed != fixed_image_seed(4, plain)  # drawn from the run's seed
    first = blind.make().reset(blind.eval_seeds()[0])
    assert first.images[0].tobytes() == plain.make().reset(seed).images[0].tobytes()
    assert f"task {seed}'s first observation" in capsys.readouterr().out


def test_task_counts_are_checked_before_any_work():
    import argparse

    import pytest

    from rlkit.cli import first_eval_seeds, positive_int

    assert first_eval_seeds([5, 6, 7], 2, "set") == [5, 6] and first_eval_seeds([5, 6, 7], None, "set") == [5, 6, 7]
    with pytest.raises(ValueError, match="set holds 3 tasks; use 1..3"):
        first_eval_seeds([5, 6, 7], 4, "set")  # silently 3 before
    with pytest.raises(ValueError, match="use 1..3"):
        first_eval_seeds([5, 6, 7], -1, "set")  # seeds[:-1] before: all but the last
    for bad in ("0", "-3", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    assert positive_int("16") == 16
    from rlkit.cli import port

    assert port("0") == 0 and port("8000") == 8000
    for bad in ("99999", "-1", "http"):
        with pytest.raises(argparse.ArgumentTypeError):
            port(bad)  # serve.py --port 99999 was an OverflowError from the socket


def test_route_errors_refuses_what_is_not_an_evaluation(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "route_errors.py"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "metrics.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 1 and "is not an evaluation json" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), "--parser", "nosuch"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice: 'nosuch'" in proc.stderr


def test_reading_scores_the_grounding_questions_on_the_evaluation_mazes(monkeypatch, capsys, tiny_test_ckpt):
    """--reading asks each evaluation maze per_maze questions and reports exact answers and wall bits as
    rlkit.stages.grounding scores them: one wrong wall bit in one of 4 transcriptions is 75% exact and 1 bit of 4 x 12."""
    import rlkit.stages.grounding
    from envs.visgym.grounding import walls_answer
    from envs.visgym.maze import generate_maze
    from rlkit.policy import load_policy

    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    policy = load_policy(name="reading_test", path=str(tiny_test_ckpt), device="cpu", dtype=TEST_DTYPE,
                         lora={"enabled": False})
    seeds = env.eval_seeds()[:2]
    asked = []

    def fake_token_hits(policy, items, batch_size=64):
        asked.extend(items)
        hits = [[True] * it.answer_len for it in items]
        hits[0][items[0].bit_tokens[0]] = False  # the first transcription misreads its first wall bit
        return hits

    monkeypatch.setattr(rlkit.stages.grounding, "token_hits", fake_token_hits)
    assert load_eval_script().eval_reading(env, policy, seeds, ["walls"], 2, seed=0) == 0
    bits = len(walls_answer(generate_maze(seeds[0], 7)[0])[1])
    assert bits == 12  # 3 x 3 rooms: 12 passages between them
    assert [it.task for it in asked] == ["walls"] * 4
    assert [it.trajectory.episode.seed for it in asked] == [seeds[0], seeds[0], seeds[1], seeds[1]]
    out = capsys.readouterr().out
    assert f"reading on 2 evaluation mazes (2 question(s) each of walls; teacher-forced): 75.0% exact, " \
           f"{(4 * bits - 1) / (4 * bits):.1%} of wall bits" in out


def test_reading_asks_grounding_tasks_or_every_task_and_refuses_what_it_cannot_ask():
    script = load_eval_script()
    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    assert script.reading_tasks(env, ["walls", "moves"]) == ["walls", "moves"]
    assert script.reading_tasks(env, []) == list(env.grounding_tasks)  # [] = every task
    assert script.reading_tasks(env, None) == list(env.grounding_tasks)
    with pytest.raises(ValueError, match=r"--reading: grounding.tasks \['wals'\]: unknown task\(s\) "
                                         r"\['wals'\]; VisGymMaze offers"):
        script.reading_tasks(env, ["wals"])
    with pytest.raises(ValueError, match=r"a flat list of task names, e.g. 'grounding.tasks=\[walls\]'"):
        script.reading_tasks(env, [["walls"]])  # the old curriculum's list of phases

    class NotAMaze:
        pass

    with pytest.raises(ValueError, match="--reading needs an env with grounding questions"):
        script.reading_tasks(NotAMaze(), ["walls"])


def test_reading_asks_every_checkpoint_the_same_questions(monkeypatch, capsys, tiny_test_ckpt):
    """The questions come from --reading-seed alone (a warm start and a GRPO adapter of another run seed are asked
    the same ones); a task without wall bits prints no wall-bit share, and no warning about an empty mean."""
    import warnings

    import rlkit.stages.grounding
    from rlkit.policy import load_policy

    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    policy = load_policy(name="reading_test", path=str(tiny_test_ckpt), device="cpu", dtype=TEST_DTYPE,
                         lora={"enabled": False})
    asked: list[list[int]] = []
    monkeypatch.setattr(rlkit.stages.grounding, "token_hits", lambda policy, items, batch_size=64: (
        asked.append([tuple(it.trajectory.input_ids) for it in items]) or [[True] * it.answer_len for it in items]))
    script = load_eval_script()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in (5, 5, 6):
            assert script.eval_reading(env, policy, env.eval_seeds()[:3], ["agent"], 2, seed=seed) == 0
    assert asked[0] == asked[1] and asked[0] != asked[2]  # the agent's cell is drawn from the seed
    out = capsys.readouterr().out
    assert "(2 question(s) each of agent; teacher-forced): 100.0% exact\n" in out and "wall bits" not in out
    # a control=fixed_image run is asked about the real pictures: the same questions, and it says so
    from rlkit.controls import FixedImageEnvSpec, fixed_image_seed

    blind = FixedImageEnvSpec(env, fixed_image_seed(0, env))
    assert script.eval_reading(blind, policy, env.eval_seeds()[:3], ["agent"], 2, seed=5) == 0
    assert asked[3] == asked[0]
    assert "(the real pictures: control=fixed_image does not apply)" in capsys.readouterr().out


def test_overrides_may_follow_the_flags():
    """`eval.py RUN --reading grounding.tasks=[walls]` parses the override (argparse's plain parse_args
    refuses a positional after an option)."""
    script = load_eval_script()
    args = script.build_parser().parse_intermixed_args(["run", "--reading", "grounding.tasks=[walls]", "--twins",
                                                        "env.max_turns=18"])
    assert args.adapter == "run" and args.overrides == ["grounding.tasks=[walls]", "env.max_turns=18"]
    assert args.reading and args.twins


def test_negative_numbers_are_refused_by_the_parser(capsys):
    """--reading-seed takes 0 and up, --threads 1 and up: argparse's message, not a traceback after the evaluation."""
    parser = load_eval_script().build_parser()
    assert parser.parse_args(["run", "--reading-seed", "0"]).reading_seed == 0
    for flag, value, message in (("--reading-seed", "-1", "-1: use a number >= 0"), ("--threads", "0", "0: use a number >= 1")):
        with pytest.raises(SystemExit):
            parser.parse_args(["run", flag, value])
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("lora", [{"include_vision": True}, {"include_vision": False},
                                  {"target_modules": ["proj", "qkv", "q_proj"]}],
                         ids=["all-linear+vision", "all-linear", "list-with-conv3d"])
def test_an_adapter_is_rebuilt_with_exactly_its_modules(tiny_test_ckpt, tmp_path, lora):
    """scripts/eval.py rebuilds base + LoRA from the adapter's own config and loads it in place: every saved LoRA
    tensor lands on a module of the rebuilt model and nothing else is adapted. The default recipe's adapter
    (all-linear with the vision tower) excludes the Conv3d patch embedding whose leaf name, proj, is a target; a
    rebuild that dropped the adapter's exclude_modules put LoRA there and refused the adapter."""
    from rlkit.policy import load_policy
    from rlkit.serve.models import parse_adapter_arg
    from tests.policy.conftest import perturb_lora

    cfg = {"name": "eval_test", "path": str(tiny_test_ckpt), "device": "cpu", "dtype": TEST_DTYPE,
           "lora": {"rank": 4, "alpha": 8, **lora}}
    trained = load_policy(**cfg)
    perturb_lora(trained.model, 3, scale=1.0)
    trained.save_adapter(tmp_path / "adapter")
    saved = {n: p.detach().clone() for n, p in trained.model.named_parameters() if "lora_" in n}

    # the run's policy config, as eval.py composes it (conf/policy/*.yaml: all-linear, whatever the adapter had)
    run_cfg = {**cfg, "lora": {"rank": 16, "alpha": 32, "include_vision": False}}
    policy = load_eval_script().load_eval_policy(run_cfg, parse_adapter_arg(str(tmp_path / "adapter")),
                                                 str(tiny_test_ckpt))
    loaded = {n: p.detach() for n, p in policy.model.named_parameters() if "lora_" in n}
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[n], saved[n]) for n in saved)
    conv_adapted = any("patch_embed" in n for n in loaded)
    assert conv_adapted == ("target_modules" in lora)  # a list naming proj adapts the Conv3d, as it trained
