"""Crash and resume: SIGKILL at named points of the loop, resume with resume_mode=latest, and get the
same adapter (bitwise) and the same per-step metrics as an uninterrupted run, and a W&B run (offline)
whose history holds every step of metrics.jsonl exactly once, with its values."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.observability.wandb_reader import assert_wandb_matches_metrics

ROOT = Path(__file__).resolve().parents[1]
# a constant lr: the lr checks below read the base lr itself (the default recipe's cosine would scale it by
# the step's factor, 0.5 at step 2 of 2)
BASE = ["experiment=smoke", "steps=4", "trainer.ckpt_interval=1", "trainer.max_ckpts_to_keep=2",
        "eval.num_tasks=2", "trainer.deterministic=true", "optim.lr_schedule=constant"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("resume_cache")


def _env(cache, crash=None):
    env = dict(os.environ, RLKIT_CACHE_DIR=str(cache), WANDB_MODE="offline", WANDB_SILENT="true",
               WANDB_DATA_DIR=str(cache / "wandb-data"), WANDB_CACHE_DIR=str(cache / "wandb-cache"),
               WANDB_CONFIG_DIR=str(cache / "wandb-config"), PYTHONPATH=str(ROOT))
    for k in ("RLKIT_CRASH_AT", "WANDB_API_KEY"):
        env.pop(k, None)
    if crash:
        env["RLKIT_CRASH_AT"] = crash
    return env


def _train(run_dir, cache, extra=(), crash=None, check=True, logger="console"):
    """train.py on BASE; the SIGKILL tests log to W&B (offline), the others to the console only."""
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *BASE, f"logger={logger}", *extra,
                           f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=_env(cache, crash), capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _steps(run_dir):
    lines = [json.loads(ln) for ln in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in ln.items() if not k.startswith("timing/") and k != "trainer/wall_time_s"} for ln in lines]


def _adapter(run_dir):
    return load_file(str(Path(run_dir) / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference(cache, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    _train(run, cache)
    return run


def _assert_same_as_reference(run, reference):
    a, b = _adapter(run), _adapter(reference)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].equal(b[k]), f"adapter tensor {k} differs after resume"
    assert _steps(run) == _steps(reference)
    assert json.loads((run / "result.json").read_text())["steps_completed"] == 4
    assert assert_wandb_matches_metrics(run) == [0, 1, 2, 3, 4]


def _crash_then_resume(point, tmp_path, cache, reference):
    run = tmp_path / "run"
    proc = _train(run, cache, crash=point, check=False, logger="wandb")
    assert proc.returncode == -signal.SIGKILL, f"expected the injected SIGKILL at {point}: {proc.stderr[-3000:]}"
    assert not (run / "result.json").exists()
    resumed = _train(run, cache, logger="wandb")
    assert "resuming from" in resumed.stdout or "starting fresh" in resumed.stdout
    _assert_same_as_reference(run, reference)
    return resumed


# a kill mid-update in the default suite; a kill right after a checkpoint with -m slow (the same check, 16 s more)
@pytest.mark.dtype_sensitive
@pytest.mark.parametrize("point", ["update@3", pytest.param("checkpoint@2", marks=pytest.mark.slow)])
def test_sigkill_and_resume_is_bitwise_identical(point, tmp_path, cache, reference):
    resumed = _crash_then_resume(point, tmp_path, cache, reference)
    # update@3: the checkpoint of step 2 is the newest; checkpoint@2: the torn step-2 write is skipped -> step 1
    expected = {"update@3": "step 2", "checkpoint@2": "step 1"}[point]
    assert f"at {expected}" in resumed.stdout


def _random_kills(seed, n):
    """``n`` injected SIGKILL points (``<point>@<step>``) from a seeded RNG, each at or after the
    step of the one before, so each is reached by the resumed run (which restarts at or before it)."""
    rng = random.Random(seed)
    kills, step = [], 1
    for _ in range(n):
        step = rng.randint(step, 4)
        kills.append(f"{rng.choice(['rollout', 'update', 'logged', 'checkpoint'])}@{step}")
    return kills


def _killed_and_resumed(kills, tmp_path, cache, reference):
    run = tmp_path / "run"
    for crash in kills:
        proc = _train(run, cache, crash=crash, check=False, logger="wandb")
        assert proc.returncode == -signal.SIGKILL, f"expected the injected SIGKILL at {crash}: {proc.stderr[-3000:]}"
    _train(run, cache, logger="wandb")
    _assert_same_as_reference(run, reference)
    run_id = json.loads((run / "result.json").read_text())["wandb_run_id"]
    # an attempt killed before the first checkpoint is started over (a new W&B run); every later
    # attempt continues the same W&B run, one offline segment each
    return len(list((run / "wandb").glob(f"offline-run-*-{run_id}")))


@pytest.mark.slow
@pytest.mark.parametrize("seed,n", [(16, 1), (17, 1), (1, 2), (3, 2)])
def test_sigkill_at_random_points(seed, n, tmp_path, cache, reference):
    """Killed ``n`` times at seeded random points of the loop, resumed each time: the same run as the
    reference, and W&B's history (one segment per attempt) holds each step of metrics.jsonl once."""
    kills = _random_kills(seed, n)  # these seeds kill after the first checkpoint: one W&B run throughout
    assert _killed_and_resumed(kills, tmp_path, cache, reference) == n + 1, kills


@pytest.mark.slow
@pytest.mark.parametrize("point", ["rollout@1", "rollout@4", "update@1", "logged@2", "checkpoint@3", "logged@4"])
def test_sigkill_more_points(point, tmp_path, cache, reference):
    _crash_then_resume(point, tmp_path, cache, reference)


@pytest.mark.slow
def test_sigkill_at_random_times(tmp_path, cache, reference):
    rng = random.Random(1234)
    run = tmp_path / "run"
    kills = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *BASE, "logger=wandb", f"hydra.run.dir={run}"],
                                cwd=ROOT, env=_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(4.0, 14.0))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    _train(run, cache, logger="wandb")
    assert kills >= 1
    _assert_same_as_reference(run, reference)


@pytest.mark.slow
def test_sigkill_mid_segment_of_a_longer_run_keeps_wandb_history(tmp_path, cache):
    """Issue 16's case: killed at step 25 of 40 with a checkpoint every 10 (W&B had kept steps 0-16
    and 21-40). Now every step 0..40 once, equal to metrics.jsonl."""
    run = tmp_path / "run"
    extra = ["steps=40", "trainer.ckpt_interval=10", "trainer.deterministic=false"]
    proc = _train(run, cache, extra, crash="update@25", check=False, logger="wandb")
    assert proc.returncode == -signal.SIGKILL
    resumed = _train(run, cache, extra, logger="wandb")
    assert "at step 20" in resumed.stdout
    assert assert_wandb_matches_metrics(run) == list(range(41))


@pytest.mark.slow  # 27 s; adaptive rounds are opt-in, and the sigkill tests cover the default resume path bitwise
def test_resume_with_adaptive_dynamic_sampling_sizes_the_next_round_as_the_uninterrupted_run(tmp_path, cache):
    """The adaptive rounds are sized from the previous step's informative share, which the checkpoint
    keeps: without it the resumed step 3 would draw a round of 2 tasks where the uninterrupted run drew
    the step's whole budget (the 2-step warm start solves nothing, so the share is 0: dynamic/rounds 1)."""
    extra = ["sampling=dapo", "sampling.max_rounds=2", "sampling.adaptive_batch=true"]
    ref = tmp_path / "ref"
    _train(ref, cache, extra)
    assert [s["dynamic/rounds"] for s in _steps(ref) if "reward/mean" in s][1:] == [1.0, 1.0, 1.0]
    run = tmp_path / "run"
    proc = _train(run, cache, extra, crash="update@3", check=False)
    assert proc.returncode == -signal.SIGKILL
    _train(run, cache, extra)
    assert _steps(run) == _steps(ref)


def test_resume_boundaries_train_exactly_the_remaining_steps(tmp_path, cache):
    run = tmp_path / "run"
    _train(run, cache, ["steps=2"])
    assert [s["step"] for s in _steps(run) if "reward/mean" in s] == [1, 2]
    again = _train(run, cache, ["steps=2"])  # after the last step: nothing left to train
    assert "at step 2" in again.stdout and "already trained its 2 steps: nothing left to train" in again.stdout
    assert [s["step"] for s in _steps(run) if "reward/mean" in s] == [1, 2]
    # extend by one step, under a cache where today's config keys no build: the adapter goes back on the warm start
    # it was trained on (its rlkit_adapter.json), nothing is built
    moved = _train(run, tmp_path / "other_cache", ["steps=3"])
    assert f"resuming on the warm start the run started from: {cache}" in moved.stdout
    assert not (tmp_path / "other_cache" / "sft").exists() and "building" not in moved.stdout
    assert [s["step"] for s in _steps(run) if "reward/mean" in s] == [1, 2, 3]
    assert json.loads((run / "result.json").read_text())["steps_completed"] == 3


def test_resume_refuses_a_changed_experiment(tmp_path, cache):
    run = tmp_path / "run"
    _train(run, cache, ["steps=1"])
    proc = _train(run, cache, ["steps=1", "algorithm.eps_clip_high=0.3"], check=False)
    assert proc.returncode != 0 and "change the experiment: algorithm" in proc.stderr
    ok = _train(run, cache, ["steps=1", "trainer.eval_interval=5"])  # not an experiment key: allowed
    assert "resuming from" in ok.stdout


def test_a_changed_warm_start_is_refused_before_it_is_built(tmp_path, cache):
    # the warm start's keys are experiment keys: the resume check runs before minutes of building a new warm start
    run = tmp_path / "run"
    _train(run, cache, ["steps=1"])
    proc = _train(run, cache, ["steps=1", "sft.seed=99"], check=False)
    assert proc.returncode != 0 and "change the experiment: sft.seed (" in proc.stderr
    assert "SFT warm start: building" not in proc.stdout and "sft step" not in proc.stdout + proc.stderr


def test_a_checkpoint_from_before_a_key_existed_resumes_while_the_key_keeps_its_default(tmp_path, cache):
    """A run checkpointed by an older rlkit (conf/compat.yaml) has no env.holdout in its config, the demonstration
    loss's coefficient under its old name (algorithm.demo_coef) and a removed lever's key at the value runs have
    now (algorithm.mask_unexecuted: false): resuming it with today's config is the same experiment; a new key at
    another value than what the old run did is not. (The default recipe's sft.grounding_mix is 8, not the 0 that
    older runs did, so deleting it would be refused.)"""
    from omegaconf import OmegaConf, open_dict

    from rlkit.checkpoint import MANIFEST, write_manifest

    run = tmp_path / "run"
    _train(run, cache, ["steps=1"])
    for saved in run.glob("checkpoints/step_*/config.yaml"):
        old = OmegaConf.load(saved)
        with open_dict(old):
            del old.env["holdout"]
            old.algorithm.demo_coef = old.aux_loss.pop("demo_coef")
            old.algorithm.mask_unexecuted = False
        OmegaConf.save(old, saved)
        extra = {k: v for k, v in json.loads((saved.parent / MANIFEST).read_text()).items() if k != "files"}
        write_manifest(saved.parent, extra)  # as the older rlkit wrote it: a complete checkpoint
    refused = _train(run, cache, ["steps=1", "env.holdout=dihedral"], check=False)
    assert refused.returncode != 0 and "env.holdout ('layout' -> 'dihedral')" in refused.stderr
    assert "resuming from" in _train(run, cache, ["steps=1"]).stdout


def test_keys_added_later_read_as_their_old_behaviour_only_where_missing():
    from omegaconf import OmegaConf

    from rlkit.resume import config_changes

    new = OmegaConf.create({"env": {"parser": "plan", "holdout": "layout"}, "lr": 1e-3})
    assert config_changes(OmegaConf.create({"env": {"parser": "plan"}, "lr": 1e-3}), new) == {}
    explicit = OmegaConf.create({"env": {"parser": "plan", "holdout": "dihedral"}, "lr": 1e-3})
    assert config_changes(explicit, new) == {"env.holdout": ("dihedral", "layout")}
    dihedral = OmegaConf.create({"env": {"parser": "plan", "holdout": "dihedral"}, "lr": 1e-3})
    assert config_changes(OmegaConf.create({"env": {"parser": "plan"}, "lr": 1e-3}), dihedral) == {
        "env.holdout": ("layout", "dihedral")}


#: A config as rlkit wrote it before the GRPO loop became a recipe (renamed keys, removed levers at the values
#: that do what runs do now, the grounding curriculum of one phase), and the same experiment written today.
OLD_CONFIG = {"lr": 1e-3,
              "algorithm": {"eps_clip_low": 0.2, "dynamic_sampling_max_rounds": 3, "dynamic_sampling_adaptive_batch": True,
                            "demo_coef": 0.3, "mask_unexecuted": False, "screening_samples": 0,
                            "adam_betas": [0.9, 0.999], "lr_schedule": "cosine"},
              "grounding": {"enabled": True, "curriculum": [["walls"]], "advance_accuracy": 0.9},
              "sft": {"enabled": True, "route_mix": 0, "grounding_mix": 8},
              "env": {"parser": "plan", "holdout": "layout", "train_room_endpoints": 0.0}}
NEW_CONFIG = {"lr": 1e-3,
              "algorithm": {"eps_clip_low": 0.2},
              "sampling": {"_target_": "rlkit.sampling.DapoSampling", "max_rounds": 3, "adaptive_batch": True},
              "aux_loss": {"demo_coef": 0.3},
              "optim": {"adam_betas": [0.9, 0.999], "lr_schedule": "cosine"},
              "grounding": {"enabled": True, "tasks": ["walls"]},
              "sft": {"enabled": True, "grounding_mix": 8},
              "env": {"parser": "plan", "holdout": "layout"}}


def test_an_old_config_reads_as_the_same_experiment_through_conf_compat():
    from omegaconf import OmegaConf

    from rlkit.resume import config_changes

    assert config_changes(OmegaConf.create(OLD_CONFIG), OmegaConf.create(NEW_CONFIG)) == {}
    # a renamed key compares under its new name: another value is a change of that key
    other = OmegaConf.create({**NEW_CONFIG, "aux_loss": {"demo_coef": 0.5}})
    assert config_changes(OmegaConf.create(OLD_CONFIG), other) == {"aux_loss.demo_coef": (0.3, 0.5)}
    # rounds > 0 before conf/sampling/ existed meant DAPO: today's plain sampling is another experiment
    plain = OmegaConf.create({**NEW_CONFIG, "sampling": {"_target_": "rlkit.sampling.PlainSampling"}})
    assert set(config_changes(OmegaConf.create(OLD_CONFIG), plain)) == {
        "sampling._target_", "sampling.max_rounds", "sampling.adaptive_batch"}
    # a checkpoint that named its strategy (sampling.name, before the strategies were classes) reads as today's
    named = {"name": "plain", "max_rounds": 0, "adaptive_batch": False}
    assert config_changes(OmegaConf.create({**NEW_CONFIG, "sampling": named}), plain) == {}
    named = {"name": "dapo", "max_rounds": 3, "adaptive_batch": True}
    assert config_changes(OmegaConf.create({**NEW_CONFIG, "sampling": named}), OmegaConf.create(NEW_CONFIG)) == {}
    # a curriculum of more than one phase has no flat equivalent: it stays, and differs
    phases = OmegaConf.create({**OLD_CONFIG, "grounding": {"enabled": True, "curriculum": [["cell"], ["walls"]],
                                                          "advance_accuracy": 0.9}})
    changes = config_changes(phases, OmegaConf.create(NEW_CONFIG))
    assert changes["grounding.curriculum"] == ([["cell"], ["walls"]], None)
    assert changes["grounding.tasks"] == (None, ["walls"])


def test_a_removed_lever_in_use_is_refused_naming_the_tag_that_holds_it(tmp_path):
    from omegaconf import OmegaConf

    from rlkit.checkpoint import CheckpointError
    from rlkit.resume import REMOVED_LEVERS_TAG, check_same_experiment

    assert REMOVED_LEVERS_TAG == "levers-before-removal"
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    old = {**OLD_CONFIG, "algorithm": {**OLD_CONFIG["algorithm"], "decoupled_loss": True}}
    OmegaConf.save(OmegaConf.create(old), ckpt / "config.yaml")
    with pytest.raises(CheckpointError) as refused:
        check_same_experiment(ckpt, OmegaConf.create(NEW_CONFIG), tmp_path / "run", tmp_path / "run" / "checkpoints")
    msg = str(refused.value)
    assert "algorithm.decoupled_loss (True -> None)" in msg
    assert "algorithm.decoupled_loss belong(s) to levers removed from rlkit" in msg
    assert "git tag levers-before-removal" in msg
    # at its neutral value (what runs do now) the same checkpoint resumes
    OmegaConf.save(OmegaConf.create({**OLD_CONFIG, "algorithm": {**OLD_CONFIG["algorithm"], "decoupled_loss": False}}),
                   ckpt / "config.yaml")
    assert check_same_experiment(ckpt, OmegaConf.create(NEW_CONFIG), tmp_path / "run",
                                 tmp_path / "run" / "checkpoints") == {}


def test_resume_mode_none_refuses_existing_checkpoints(tmp_path, cache):
    run = tmp_path / "run"
    _train(run, cache, ["steps=1"])
    proc = _train(run, cache, ["steps=1", "trainer.resume_mode=none"], check=False)
    assert proc.returncode != 0 and "trainer.overwrite=true" in proc.stderr


def test_resume_applies_changed_lr_and_steps_and_records_them(tmp_path, cache):
    run = tmp_path / "run"
    _train(run, cache, ["steps=1", "lr=1e-3"])
    proc = _train(run, cache, ["steps=2", "lr=5e-3"])
    assert "resuming with changed settings from step 2: lr 0.001 -> 0.005, steps 1 -> 2" in proc.stdout
    lrs = {s["step"]: s["policy/lr"] for s in _steps(run) if "policy/lr" in s}
    assert lrs == {1: pytest.approx(1e-3), 2: pytest.approx(5e-3)}  # what ran is what .hydra/config.yaml says
    assert "lr: 0.005" in (run / ".hydra" / "config.yaml").read_text()
    (record,) = [json.loads(ln) for ln in (run / "resumes.jsonl").read_text().splitlines()]
    assert record["from_step"] == 2 and record["changes"]["lr"] == {"was": 0.001, "now": 0.005}
    proc = _train(run, cache, ["steps=3", "lr=5e-3", "rollout.top_p=0.9", "algorithm.update_epochs=2"], check=False)
    assert proc.returncode != 0
    assert ("change the experiment: algorithm.update_epochs (1 -> 2), rollout.top_p (1.0 -> 0.9). On resume only "
            "these may change: steps, lr, trainer") in proc.stderr


def test_resume_with_more_steps_stretches_a_cosine_schedule(tmp_path, cache):
    # the default recipe's schedule: a resumed run with a new `steps` decays to 0 at the new total, not the old
    run = tmp_path / "run"
    _train(run, cache, ["steps=1", "lr=1e-3", "optim.lr_schedule=cosine"])
    _train(run, cache, ["steps=3", "lr=1e-3", "optim.lr_schedule=cosine"])
    lrs = {s["step"]: s["policy/lr"] for s in _steps(run) if "policy/lr" in s}
    # policy/lr is the lr step k ran with: 1e-3 x 0.5 * (1 + cos(pi * (k - 1) / total)); step 1 under steps=1,
    # steps 2 and 3 under the new total 3 (the old total would have given step 2 an lr of 0)
    assert lrs == {1: pytest.approx(1e-3), 2: pytest.approx(1e-3 * 0.75), 3: pytest.approx(1e-3 * 0.25)}


def test_the_recorded_base_is_found_where_the_cache_moved_and_not_for_a_checkpoint_base(tmp_path):
    """rlkit.resume.recorded_base: the adapter's recorded warm start at its path, else under this run's cache (the
    entry's name is its key), else None; a warning when it was built for another prompt than the env's today. The
    recipe asks it only for a run that builds (rlkit.stages.warm_start.starting_checkpoint): none for a run whose base
    is policy.path."""
    import types

    from omegaconf import OmegaConf

    from envs.visgym.spec import VisGymMaze
    from rlkit.resume import recorded_base
    from rlkit.stages.warm_start import starting_checkpoint
    from rlkit.stages.cache import prompt_fingerprint

    env = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    said = []
    old = tmp_path / "old_cache" / "sft" / "0123abcd"
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    (ckpt / "adapter").mkdir(parents=True)
    (ckpt / "adapter" / "rlkit_adapter.json").write_text(json.dumps({"base_model": str(old)}))

    def run(cache):
        return recorded_base(ckpt, cache, prompt_fingerprint(env), said.append)

    def recipe_base(cache, sft, grounding, policy_path=None):
        """What starting_checkpoint resumes on for a run that builds nothing."""
        cfg = OmegaConf.create({"paths": {"cache_dir": str(cache)}, "policy": {"path": policy_path},
                                "sft": {"enabled": sft}, "grounding": {"enabled": grounding}})
        job = types.SimpleNamespace(cfg=cfg, env_spec=env)
        return starting_checkpoint(job, ckpt, 1, 1, None, types.SimpleNamespace(say=said.append))

    assert run(tmp_path / "new_cache") is None  # no finished build anywhere: build as configured
    moved = tmp_path / "new_cache" / "sft" / "0123abcd"
    moved.mkdir(parents=True)
    (moved / "sft_summary.json").write_text(json.dumps({"build": {"inputs": {"prompt": prompt_fingerprint(env)}}}))
    assert run(tmp_path / "new_cache") == str(moved) and said == []
    old.mkdir(parents=True)
    (old / "sft_summary.json").write_text(json.dumps({"build": {"inputs": {"prompt": "another"}}}))
    assert run(tmp_path / "new_cache") == str(old)  # the recorded path first
    assert len(said) == 1 and "built for another prompt or answer format" in said[0]
    assert recipe_base(tmp_path / "new_cache", sft=False, grounding=True, policy_path="/some/ckpt") is None
    assert recipe_base(tmp_path / "new_cache", sft=False, grounding=False) is None
