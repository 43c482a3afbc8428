"""The main job end to end: train.py in a subprocess with the smoke experiment, single run and sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args, tmp_path, timeout=900):
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", RLKIT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"train.py failed:\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc


@pytest.mark.dtype_sensitive
def test_smoke_run_writes_result_adapter_and_wandb(tmp_path):
    out = tmp_path / "run"
    proc = _run(["experiment=smoke", "trainer.export_interval=1", "eval.seen_tasks=3", f"hydra.run.dir={out}"],
                tmp_path)
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed"
    assert result["steps_completed"] == 2
    assert result["eval_set"] == "visgym_small_64"  # the default env: rlkit's 7x7 maze
    assert result["eval_num_tasks"] == 4
    for key in ("eval_success_before", "eval_success_after"):
        assert 0.0 <= result[key] <= 1.0
    assert result["wall_time_s"] > 0
    warm = Path(result["warm_start_dir"])  # the SFT checkpoint this run started from, with its summary
    assert warm.parent.name == "sft" and (warm / "sft_summary.json").is_file()
    adapter = Path(result["adapter_dir"])
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    export = out / "exports" / "step_000001"  # every export_interval steps, plain PEFT format
    assert (export / "adapter_config.json").is_file() and (export / "adapter_model.safetensors").is_file()
    assert not (out / "exports" / "step_000002").exists()  # the last step's export is adapter/
    # metrics: one line per step + evals, with the namespaced keys
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [ln for ln in lines if "reward/mean" in ln]
    assert [ln["step"] for ln in steps] == [1, 2]
    for key in ("policy/loss", "policy/clip_ratio", "policy/approx_kl", "policy/grad_norm", "policy/lr",
                "generate/mean_tokens", "env/parse_failures", "env/mean_turns", "timing/rollout", "timing/train"):
        assert key in steps[0], key
    assert any("eval/success_rate" in ln for ln in lines)
    eval_final = json.loads((out / "eval" / "final.json").read_text())
    assert len(eval_final["tasks"]) == 4 and {t["seed"] for t in eval_final["tasks"]} == {0, 1, 2, 3}
    # eval.seen_tasks=3: greedy success on the first 3 tasks the run drew for training, beside the held-out set
    from envs.visgym import VisGymMaze
    from rlkit.tasks import TaskSampler

    spec = VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")
    seen = json.loads((out / "eval" / "seen_final.json").read_text())
    assert [t["seed"] for t in seen["tasks"]] == TaskSampler(0, spec.is_eval_seed).sample(3)
    assert not any(spec.is_eval_seed(t["seed"]) for t in seen["tasks"])
    assert seen["metrics"]["eval_seen/num_tasks"] == 3
    assert result["eval_seen_num_tasks"] == 3
    assert result["eval_seen_success_after"] == seen["metrics"]["eval_seen/success_rate"]
    assert any("eval_seen/success_rate" in ln for ln in lines)
    assert "trained-on tasks" in proc.stdout
    # W&B offline run files
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "expected one offline W&B run with its .wandb file"
    assert "eval success on visgym_small_64" in proc.stdout
    # the SFT warm start's summary records its held-out fit next to its greedy success
    (sft_summary,) = (tmp_path / "cache" / "sft").glob("*/sft_summary.json")
    last = json.loads(sft_summary.read_text())["history"][-1]
    for key in ("val_success", "val_distinct_outputs", "val_loss", "val_token_accuracy", "val_first_token_accuracy"):
        assert key in last, key
    assert last["val_loss"] > 0 and 0.0 <= last["val_first_token_accuracy"] <= 1.0
    # checkpoint written and verified; a second invocation in the same folder resumes at the end
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    proc2 = _run(["experiment=smoke", "trainer.export_interval=1", f"hydra.run.dir={out}"], tmp_path)
    assert "resuming from" in proc2.stdout
    assert json.loads((out / "result.json").read_text())["steps_completed"] == 2


def test_smoke_sweep_summary(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _run(["experiment=smoke", "logger=console", "-m", "lr=1e-5,3e-5", f"hydra.sweep.dir={sweep}"], tmp_path)
    rows = json.loads((sweep / "sweep_summary.json").read_text())
    assert [r["swept"] for r in rows] == ["lr=1e-05", "lr=3e-05"]
    assert all(r["overrides"].startswith("experiment=smoke logger=console") for r in rows)
    assert all(r["status"] == "completed" and r["steps"] == 2 for r in rows)
    assert (sweep / "sweep_summary.csv").read_text().count("\n") == 3
    assert "lr=3e-05" in proc.stdout


def test_local_sweep_keeps_going_and_summarises_when_a_job_fails(tmp_path):
    """launcher=local: job 0 fails (bad lr), job 1 still runs, the table and CSV list both, exit != 0."""
    sweep = tmp_path / "sweep"
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "logger=console", "-m",
                           "lr=-1,1e-5", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    rows = json.loads((sweep / "sweep_summary.json").read_text())
    assert [(r["swept"], r["status"]) for r in rows] == [("lr=-1", "failed: ConfigError: lr=-1.0 must be > 0"),
                                                       ("lr=1e-05", "completed")]
    assert "Traceback" in (sweep / "0" / "error.txt").read_text()  # the whole story stays with the job
    assert not (sweep / "1" / "error.txt").exists()
    assert rows[1]["steps"] == 2
    assert "1 of 2 jobs failed" in out and "lr=-1.0 must be > 0" in out


# Through train.py: a compose-time refusal (a typo'd key) and a setup-time one, each printed as one line and kept
# in the run folder's error.txt. The other refusals below are checked in-process (the same GRPORecipe.setup that
# train.py runs; about 7 s of the 15-minute suite saved apiece).
@pytest.mark.parametrize("override, message", [
    ("eval.num_tasks=0", "eval.num_tasks=0"),
    ("+algorithm.eps_clip_hihg=0.3", "algorithm.eps_clip_hihg"),
])
def test_bad_config_fails_fast_with_a_clear_message(override, message, tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", *override.split(),
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "[rlkit] config error:" in proc.stderr  # the message, no stack
    assert "SFT warm start" not in proc.stdout  # refused before the long part of the run
    assert message.split("=")[0].strip("'+") in (tmp_path / "run" / "error.txt").read_text()


@pytest.mark.parametrize("override, message", [
    ("eval.num_tasks=1000", "eval.num_tasks=1000"),
    ("logger.mode=ofline", "logger.mode='ofline'"),
    ("env.parser=keyword", "does not fit"),
    ("aux_loss.demo_coef=0 aux_loss.demo_max_successes=1", "which is off (aux_loss.demo_coef=0)"),
    ("train_tasks=2 eval.seen_tasks=3", "eval.seen_tasks=3 is more than the train_tasks=2"),
    ("sft.stages=[{max_steps:4,lr_schedule:cosine}]", "lr_schedule=cosine with warmup_steps=20 >= max_steps=4"),
    ("sft.start_from_env=visgym_tiny", "sft.start_from_env='visgym_tiny' is not an env config: use one of shapes, visgym,"),
    ("+sampling.max_rounds=2", "belong to DAPO dynamic sampling, which sampling=plain does not run"),
    # grounding.tasks, read by the grounding stage or by the warm start's grounding questions
    ("grounding.tasks=[[walls]]", "a flat list of task names, e.g. 'grounding.tasks=[walls]'"),
    ("grounding.enabled=false sft.grounding_mix=2 grounding.tasks=[wals]",
     "unknown task(s) ['wals']; VisGymMaze offers ['cell', 'agent', 'goal', 'moves', 'walls'] (read by sft.grounding_mix"),
])
def test_bad_config_is_refused_in_setup_before_any_build(override, message, tmp_path):
    from rlkit.recipes.grpo import GRPORecipe
    from rlkit.recipes.local import LocalExecutor
    from rlkit.run import ConfigError
    from tests.stages.test_warm_start import _cfg

    with pytest.raises(ConfigError) as refused:
        GRPORecipe(_cfg(tmp_path, *override.split()), LocalExecutor()).setup()
    assert message in str(refused.value)
    assert not (tmp_path / "cache" / "sft").exists() and not (tmp_path / "cache" / "grounding").exists()


def test_grounding_tasks_no_build_reads_are_not_refused(tmp_path):
    """grounding.tasks is checked where a build reads it: not for a job whose warm start starts from another
    job's (its own grounding stage is skipped) and that mixes no grounding questions, nor with grounding off."""
    from rlkit.run import instantiate_plugin
    from rlkit.stages import warm_start as ws
    from tests.stages.test_warm_start import _cfg

    def problem(*overrides):
        cfg = _cfg(tmp_path, "grounding.tasks=[wals]", *overrides)
        return ws.grounding_problem(ws.make_job(cfg, instantiate_plugin(cfg.env, "env")))  # as setup checks it

    assert problem("sft.start_from_env=visgym_small", "sft.grounding_mix=0") is None
    assert problem("grounding.enabled=false", "sft.grounding_mix=0") is None
    assert "unknown task(s) ['wals']" in problem()  # the smoke's own grounding stage reads it


#: Range and later-stage problems: all found by one check (rlkit.config.check_ranges) and reported together, so one
#: run refuses them all (one train.py start instead of one each: about 5 s apiece of the 15-minute suite).
RANGE_PROBLEMS = {
    "lr=-1": "lr=-1.0 must be > 0",
    "sft.batch_size=0": "sft.batch_size=0 must be an integer >= 1",
    "rollout.temperature=-1": "rollout.temperature=-1.0 must be >= 0",
    "seed=-1": "seed=-1 must be an integer >= 0",
    "algorithm.update_epochs=0": "algorithm.update_epochs=0 must be an integer >= 1",
    "aux_loss.demo_coef=-0.1": "aux_loss.demo_coef=-0.1 must be >= 0",
    "eval.seen_tasks=-1": "eval.seen_tasks=-1 must be an integer >= 0",
}
#: Settings that contradict each other, checked together by the recipe before any build (one start for all five).
CROSS_PROBLEMS = {
    "policy.lora.enabled=false": "policy.lora.enabled=false: GRPO trains a LoRA adapter",  # was silently forced on
    # smoke runs sampling=plain: a dapo key would change nothing
    "+sampling.adaptive_batch=true": "belong to DAPO dynamic sampling, which sampling=plain does not run",
    "aux_loss.demo_max_successes=2": "aux_loss.demo_max_successes=2: a group of group_size=2",  # smoke: G=2
    "trainer.resume_mode=from_path": "trainer.resume_mode=from_path needs trainer.resume_path=<checkpoint dir>",
    "sft.start_from_env=visgym sft.start_from_experiment=tiny_9x9_curriculum":
        "sft.start_from_env=visgym and sft.start_from_experiment=tiny_9x9_curriculum both name a warm start",
}
STAGE_PROBLEMS = ("sft.stages=[{max_step:2},{lr_schedule:linear},{enabled:false},{max_steps:abc}]", [
    "sft.stages[0].max_step is not a key a later stage can set",
    "sft.stages[1].lr_schedule='linear' must be one of constant, cosine",
    "sft.stages[2].enabled is not a key a later stage can set",
    "sft.stages[3].max_steps='abc' is not a int (the type of sft.max_steps)",
])


@pytest.mark.parametrize("overrides, messages, count", [
    ([*RANGE_PROBLEMS, STAGE_PROBLEMS[0]], [*RANGE_PROBLEMS.values(), *STAGE_PROBLEMS[1]], 11),
    ([o for k in CROSS_PROBLEMS for o in k.split()], list(CROSS_PROBLEMS.values()), 5),
], ids=["ranges", "contradictions"])
def test_every_bad_value_is_named_in_one_refusal(overrides, messages, count, tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", *overrides,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and f"[rlkit] config error: {count} bad values: " in proc.stderr, proc.stderr[-3000:]
    for message in messages:
        assert message in proc.stderr, message
    assert "Traceback" not in proc.stderr and "SFT warm start" not in proc.stdout
    assert messages[0] in (tmp_path / "run" / "error.txt").read_text()


def test_answers_longer_than_max_new_tokens_are_refused_before_the_warm_start(tmp_path):
    """plan_walls writes the 12 wall bits of a 7x7 maze before its route: the longest evaluation answer in the
    smoke's 4 mazes is far over the smoke's rollout.max_new_tokens=24, so every such task would be cut and count
    as failed."""
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "env.parser=plan_walls",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert "rollout.max_new_tokens=24 cuts answers" in proc.stderr, proc.stderr[-3000:]
    assert "set rollout.max_new_tokens=" in proc.stderr and "Traceback" not in proc.stderr
    assert "SFT warm start: building" not in proc.stdout


@pytest.mark.dtype_sensitive
def test_grounding_stage_is_built_once_and_feeds_the_warm_start(tmp_path):
    """The grounding stage (on by default for tiny policies) is built and cached, SFT starts from it, a
    second run reuses both; the grounding summary holds a held-out accuracy table by task."""
    out = tmp_path / "run"
    args = ["experiment=smoke", "steps=1", f"hydra.run.dir={out}"]
    proc = _run(args, tmp_path)
    assert "grounding: building" in proc.stdout and "held-out exact-match accuracy by task" in proc.stdout
    (summary,) = (tmp_path / "cache" / "grounding").glob("*/grounding_summary.json")
    final = json.loads(summary.read_text())["final"]
    assert set(final) == {"all", "wall_bits", "walls"}  # the default grounding.tasks: the walls transcription
    assert all(0.0 <= v <= 1.0 for v in final.values())
    (sft,) = (tmp_path / "cache" / "sft").glob("*/sft_summary.json")
    proc2 = _run(["experiment=smoke", "steps=1", f"hydra.run.dir={tmp_path / 'run2'}"], tmp_path)
    assert "grounding: reusing" in proc2.stdout and "SFT warm start: reusing" in proc2.stdout


def test_sft_stages_continue_the_warm_start_and_share_the_chained_jobs_caches(tmp_path):
    """sft.stages: a second warm-start stage trains on from the first one's checkpoint (cosine lr, another
    seed) and is cached under the key of the job that starts from the first stage through policy.path with
    the same sft keys, so that job reuses it instead of training it again."""
    import re

    proc = _run(["experiment=smoke", "steps=0", "sft.stages=[{max_steps:3,seed:7,lr_schedule:cosine,warmup_steps:0}]",
                 f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    first = re.search(r"SFT warm start stage 1/2: building (\S+)", proc.stdout).group(1)
    second = re.search(r"SFT warm start stage 2/2 \(sft\.stages\[0\]\): building (\S+)", proc.stdout).group(1)
    assert first != second
    history = json.loads((Path(second) / "sft_summary.json").read_text())["history"]
    assert [h["step"] for h in history] == [2, 3]  # its own max_steps (3), checked every 2 as the smoke's
    # the stage's own cosine from sft.lr=1e-3 over its 3 steps: steps 2 and 3 train at 0.75 and 0.25 of it
    assert [h["lr"] for h in history] == pytest.approx([0.75e-3, 0.25e-3])
    # each stage records what built it: the checkpoint it started from and the config its key hashes
    records = {p: json.loads((Path(p) / "sft_summary.json").read_text())["build"] for p in (first, second)}
    assert records[second]["start"] == first and records[second]["key"] == Path(second).name
    assert records[second]["inputs"]["sft"]["seed"] == 7 and records[second]["stage"] == "sft stage 2/2 (sft.stages[0])"
    assert Path(records[first]["start"]).parent.name == "grounding" and records[first]["key"] == Path(first).name
    listing = subprocess.run([sys.executable, str(ROOT / "scripts" / "cache.py"), "--cache-dir", str(tmp_path / "cache")],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"sft/{Path(second).name}  built" in listing and f"from sft/{Path(first).name};" in listing
    chained = _run(["experiment=smoke", "steps=0", f"policy.path={first}", "~policy.tiny", "sft.max_steps=3",
                    "sft.seed=7", "sft.lr_schedule=cosine", "sft.warmup_steps=0", f"hydra.run.dir={tmp_path / 'run2'}"], tmp_path)
    assert f"SFT warm start: reusing {second}" in chained.stdout, chained.stdout[-3000:]
    again = _run(["experiment=smoke", "steps=0", "sft.stages=[{max_steps:3,seed:7,lr_schedule:cosine,warmup_steps:0}]",
                  f"hydra.run.dir={tmp_path / 'run3'}"], tmp_path)
    assert f"SFT warm start stage 1/2: reusing {first}" in again.stdout
    assert f"SFT warm start stage 2/2 (sft.stages[0]): reusing {second}" in again.stdout


def test_demo_loss_runs_end_to_end(tmp_path):
    # the 2-step warm start solves nothing: every group fails as a whole and gets its demonstration
    out = tmp_path / "run"
    _run(["experiment=smoke", "aux_loss=relift", "aux_loss.demo_coef=0.5", "trainer.ckpt_interval=0",
          f"hydra.run.dir={out}"], tmp_path)
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [ln for ln in lines if "reward/mean" in ln]
    for ln in steps:  # 2 tasks a step
        assert ln["demo/tasks"] <= 2
        if ln["reward/success_rate"] == 0:  # no sample succeeded: both tasks get their demonstration
            assert ln["demo/tasks"] == 2
        if ln["demo/tasks"]:
            assert ln["demo/nll"] > 0 and ln["timing/demo"] >= 0
    assert sum(ln["demo/tasks"] for ln in steps) >= 1
    assert len(steps) == 2


def test_skipped_updates_advance_the_schedule_without_a_torch_warning(tmp_path):
    # the 2-step warm start solves nothing, so with the filter every group is dropped and no update runs;
    # the cosine schedule is per GRPO step all the same (torch warns about that unless told not to). Without
    # the recipe's demonstration loss: its demonstrations of the all-fail tasks would be an update of their own.
    out = tmp_path / "run"
    proc = _run(["experiment=smoke", "algorithm.filter_zero_variance_groups=true", "optim.lr_schedule=cosine",
                 "aux_loss.demo_coef=0", "trainer.ckpt_interval=0", f"hydra.run.dir={out}"], tmp_path)
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [ln for ln in steps if "reward/mean" in ln]
    skipped = [ln for ln in steps if ln.get("policy/skipped") == 1.0]
    assert skipped and skipped[0]["step"] == 1, [ln.get("policy/skipped") for ln in steps]
    assert "lr_scheduler.step()" not in proc.stderr, proc.stderr[-3000:]


def test_a_warm_start_keys_the_grounding_tasks_it_mixes_in(tmp_path):
    """Without a grounded base (grounding off, a start_from chain, a later stage) a stage's key did not hold the
    questions sft.grounding_mix draws (grounding.tasks): [cell] reused a walls-mixed build. The tasks join the key
    unless they are [walls], the tasks of every earlier build (whose keys stay)."""
    from rlkit.run import instantiate_plugin
    from rlkit.stages import warm_start as ws
    from tests.stages.test_warm_start import _cfg

    def key(*overrides):
        cfg = _cfg(tmp_path, *overrides)
        job = ws.make_job(cfg, instantiate_plugin(cfg.env, "env"))
        return ws._with_mixed_tasks(job, {"lr": 1e-3, "grounding_mix": job.sft.grounding_mix})

    walls = key("sft.grounding_mix=2", "grounding.tasks=[walls]")
    assert walls == {"lr": 1e-3, "grounding_mix": 2}  # as before the key existed
    assert key("sft.grounding_mix=2", "grounding.tasks=[cell,walls]") == {
        "lr": 1e-3, "grounding_mix": 2, "grounding_mix_tasks": ["cell", "walls"]}
    assert key("sft.grounding_mix=0", "grounding.tasks=[cell]") == {"lr": 1e-3, "grounding_mix": 0}


#: experiment=interactive_demo at smoke sizes: the plan-mode smoke's warm start as the chain's first link (instead of
#: the full plan default's), 2 interactive GRPO steps of 2 tasks x 2, greedy interactive evaluation on 3 mazes.
INTERACTIVE_SMOKE = ["experiment=interactive_demo", "sft.start_from_env=null", "sft.start_from_experiment=smoke",
                     "steps=2", "group_size=2", "tasks_per_step=2", "trainer.eval_interval=0", "trainer.quiet=true",
                     "eval.num_tasks=3", "sft.num_demos=16", "sft.max_steps=2", "sft.batch_size=4", "sft.val_tasks=2",
                     "sft.eval_every=2", "sampling=plain",
                     "algorithm.filter_zero_variance_groups=false", "logger=console"]


def test_interactive_chain_runs_end_to_end(tmp_path):
    """The interactive setting's whole chain at tiny sizes (~50 s): a plan-mode warm start, the interactive warm start
    chained from it with recovery demonstrations, 2 GRPO steps of multi-turn episodes, and the interactive
    evaluation before and after, so the chain cannot break silently."""
    out = tmp_path / "run"
    proc = _run([*INTERACTIVE_SMOKE, f"hydra.run.dir={out}"], tmp_path)
    assert "SFT warm start: first the warm start of experiment=smoke" in proc.stdout
    builds = {}
    for f in (tmp_path / "cache" / "sft").glob("*/sft_summary.json"):
        build = json.loads(f.read_text())["build"]
        builds[build["inputs"]["env"]["mode"]] = (f.parent, build)
    assert set(builds) == {"plan", "interactive"}
    inner, outer = builds["plan"], builds["interactive"]
    assert outer[1]["start"] == str(inner[0])  # the interactive warm start trains on from the plan one
    assert outer[1]["inputs"]["sft"]["recovery_share"] == 0.5 and outer[1]["inputs"]["env"]["max_turns"] == 17
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["steps_completed"] == 2
    assert Path(result["warm_start_dir"]) == outer[0]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/mean_turns"] > 1 for r in steps)  # multi-turn episodes were trained on
    final = json.loads((out / "eval" / "final.json").read_text())["tasks"]
    assert [t["seed"] for t in final] == [0, 1, 2]
    assert all(t["turns"] == len(t["actions"]) and t["turns"] > 1 for t in final if not t["success"])
    assert "eval success on visgym_small_64 (3 tasks)" in proc.stdout
