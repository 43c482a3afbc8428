"""W&B offline run of the smoke config: config, every step's metrics, eval tables with images, the
adapter artifact, and resume into the same run id. Read with wandb's own protobuf schema."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from PIL import Image

from rlkit.loggers import default_run_name, resolve_wandb_mode, wandb_credentials
from rlkit.run_folder import sweep_group_name
from tests.observability.conftest import run_train
from tests.observability.wandb_reader import assert_wandb_matches_metrics, read_run, records

STEP_KEYS = ("reward/mean", "reward/success_rate", "policy/loss", "policy/approx_kl", "policy/clip_ratio",
             "policy/grad_norm", "timing/rollout", "timing/train", "timing/step", "trainer/step",
             "trainer/wall_time_s", "generate/mean_tokens")
EVAL_KEYS = ("eval/success_rate", "eval/num_tasks", "timing/eval")


def _offline_runs(out: Path) -> list[Path]:
    return sorted((out / "wandb").glob("offline-run-*"))


def test_offline_run_has_config_history_and_summary(smoke_run):
    runs = _offline_runs(smoke_run.out)
    assert len(runs) == 1, runs
    wandb_files = list(runs[0].glob("run-*.wandb"))
    assert len(wandb_files) == 1
    run = read_run(wandb_files[0])
    result = json.loads((smoke_run.out / "result.json").read_text())
    assert run["run_id"] == result["wandb_run_id"]
    cfg = run["config"]
    # the resolved config: plain values, interpolations resolved
    composed = OmegaConf.load(smoke_run.out / ".hydra" / "config.yaml")
    assert cfg["steps"] == 2 and cfg["group_size"] == 2 and cfg["lr"] == pytest.approx(composed.lr)
    assert cfg["env"]["_target_"] == "envs.visgym.VisGymMaze"
    assert cfg["logger"]["loggers"]["wandb"]["project"] == "rlkit-obs-test"
    assert cfg["paths"]["output_dir"] == str(smoke_run.out)
    # every step's metrics, eval before training at step 0 and the final eval at the last step
    by_step: dict[int, dict] = {}
    for h in run["history"]:
        by_step.setdefault(h["_step"], {}).update(h)
    assert sorted(by_step) == [0, 1, 2]
    for step in (1, 2):
        missing = [k for k in STEP_KEYS if k not in by_step[step]]
        assert not missing, f"step {step} lacks {missing}"
    for step in (0, 2):
        assert all(k in by_step[step] for k in EVAL_KEYS), by_step[step].keys()
    assert by_step[2]["trainer/step"] == 2
    # the same numbers as metrics.jsonl (which is always written)
    lines = [json.loads(ln) for ln in (smoke_run.out / "metrics.jsonl").read_text().splitlines()]
    step1 = next(ln for ln in lines if ln["step"] == 1)
    assert by_step[1]["reward/mean"] == pytest.approx(step1["reward/mean"])
    # define_metric summary for eval success
    assert "eval/success_rate" in run["summary"]


def test_eval_table_with_images(smoke_run):
    run_dir = _offline_runs(smoke_run.out)[0]
    tables = sorted((run_dir / "files" / "media" / "table" / "eval").glob("samples_*.table.json"))
    assert len(tables) == 2, tables  # eval before training (step 0) and the final eval (step 2)
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["seed", "path", "success", "reward", "turns", "outputs", "last_info"]
    assert [row[0] for row in table["data"]] == [0, 1, 2, 3]
    assert all(isinstance(row[3], float) and isinstance(row[5], str) for row in table["data"])
    # the images logged next to the table: one per row and evaluation, real PNGs of the maze
    images = sorted((run_dir / "files" / "media" / "images" / "eval").glob("samples_images_*.png"))
    assert len(images) == 8, images
    with Image.open(images[0]) as im:
        assert im.size == (175, 175) and im.mode == "RGB"  # a 7x7 maze at 25 px cells (the default env)
    # the full table (images included) is a run_table artifact staged under WANDB_DATA_DIR
    arts = [r.artifact for r in records(next(run_dir.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "artifact"]
    tables_art = [a for a in arts if a.type == "run_table"]
    assert tables_art, [a.type for a in arts]
    entries = {e.path: e.local_path for e in tables_art[0].manifest.contents}
    assert "eval/samples.table.json" in entries
    pngs = [p for p in entries if p.startswith("media/images/") and p.endswith(".png")]
    assert len(pngs) == 4, entries
    assert all(Path(entries[p]).is_file() for p in pngs)
    staged = json.loads(Path(entries["eval/samples.table.json"]).read_text())
    assert staged["data"][0][1]["_type"] == "image-file"
    # the adapter, logged at the end
    adapters = [a for a in arts if a.type == "lora_adapter"]
    assert len(adapters) == 1
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {e.path for e in adapters[0].manifest.contents}


def test_wandb_sync_available_for_offline_run(smoke_run):
    wandb_cli = Path(sys.executable).with_name("wandb")
    cmd = [str(wandb_cli)] if wandb_cli.exists() else [sys.executable, "-m", "wandb"]
    proc = subprocess.run([*cmd, "sync", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Usage: wandb sync" in proc.stdout, proc.stdout + proc.stderr
    assert list(_offline_runs(smoke_run.out)[0].glob("run-*.wandb"))


def test_resume_continues_the_same_wandb_run(smoke_run, tmp_path):
    """A rerun in the same folder resumes from the checkpoint and logs into the same W&B run id
    (a second offline-run-* folder with that id; wandb sync appends it to the run), and the two
    segments hold each step of metrics.jsonl once."""
    out = tmp_path / "run"
    shutil.copytree(smoke_run.out, out, symlinks=True)
    first = json.loads((out / "result.json").read_text())["wandb_run_id"]
    proc = run_train(["experiment=smoke", "logger=wandb", f"hydra.run.dir={out}"], smoke_run.tmp)
    assert "resuming from" in proc.stdout
    ids = {p.name.rsplit("-", 1)[-1] for p in _offline_runs(out)}
    assert ids == {first}, ids
    assert len(_offline_runs(out)) == 2
    # the rerun evaluates the last step again: its row was cut from the first segment and logged
    # anew, so the two segments hold each step once (issue 16)
    assert assert_wandb_matches_metrics(out, first) == [0, 1, 2]


@pytest.mark.parametrize("mode,env,expected", [
    ("auto", {}, "offline"),
    ("auto", {"WANDB_API_KEY": "x" * 40}, "online"),
    ("auto", {"WANDB_MODE": "disabled", "WANDB_API_KEY": "x" * 40}, "disabled"),
    ("auto", {"WANDB_MODE": "dryrun"}, "offline"),
    ("offline", {"WANDB_API_KEY": "x" * 40}, "offline"),
    ("online", {}, "online"),
])
def test_wandb_mode_resolution(monkeypatch, tmp_path, mode, env, expected):
    _no_wandb_credentials(monkeypatch, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert resolve_wandb_mode(mode) == expected


def test_wandb_unknown_mode_is_an_error():
    from rlkit.loggers import WandbLogger

    with pytest.raises(ValueError, match="logger.mode='ofline'"):
        WandbLogger(mode="ofline")


FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 characters: the format wandb checks, no real key


def _no_wandb_credentials(monkeypatch, tmp_path):
    """No credential from any source: empty HOME, no NETRC, no W&B variables."""
    for k in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(k, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_wandb_auto_is_online_after_wandb_login(monkeypatch, tmp_path):
    """What `wandb login` leaves behind (a ~/.netrc entry for api.wandb.ai) makes auto go online,
    without WANDB_API_KEY; no network is used."""
    home = _no_wandb_credentials(monkeypatch, tmp_path)
    assert wandb_credentials() is None and resolve_wandb_mode("auto") == "offline"
    netrc = home / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    netrc.chmod(0o600)
    assert wandb_credentials() == str(netrc)
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("offline") == "offline"  # an explicit mode still wins
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_wandb_mode("auto") == "offline"


def test_wandb_credentials_follow_netrc_and_base_url(monkeypatch, tmp_path):
    """$NETRC is read instead of ~/.netrc, and the entry must be for $WANDB_BASE_URL's host."""
    _no_wandb_credentials(monkeypatch, tmp_path)
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine wandb.example.com login user password {FAKE_KEY}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_wandb_mode("auto") == "offline"  # an entry for another host than api.wandb.ai
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert wandb_credentials() == str(netrc) and resolve_wandb_mode("auto") == "online"
    netrc.write_text("machine wandb.example.com login user password not-a-key\n")  # wandb would reject it
    assert wandb_credentials() is None and resolve_wandb_mode("auto") == "offline"


def test_default_run_names_are_dated_and_unique():
    """Two plain runs (Hydra's outputs/<date>/<time>) get different names; a resumed run, in the same
    folder, gets the same one; a sweep job's number is kept; another folder gives its last part."""
    first = default_run_name("/w/outputs/2026-03-01/09-15-00", "smoke")
    second = default_run_name("/w/outputs/2026-03-01/09-15-07", "smoke")
    assert first == "smoke-20260301-091500" and second == "smoke-20260301-091507"
    assert default_run_name("/w/outputs/2026-03-01/09-15-00", "smoke") == first
    assert default_run_name("multirun/2026-03-02/09-15-00/3", "tiny_9x9") == "tiny_9x9-20260302-091500-3"
    assert default_run_name("/tmp/runs/lr3e5", "rlkit") == "rlkit-lr3e5"
    assert default_run_name("/tmp/mysweep/0", "rlkit") == "rlkit-mysweep-0"
    with pytest.raises(ValueError, match="no name"):
        default_run_name("/", "rlkit")


def test_sweep_groups_are_dated():
    """Sweeps at the same clock time on different days are different groups (W&B and Prometheus)."""
    a = sweep_group_name("multirun/2026-03-01/09-15-00")
    b = sweep_group_name("/abs/multirun/2026-03-02/09-15-00")
    assert a == "sweep-2026-03-01_09-15-00" and b == "sweep-2026-03-02_09-15-00"
    assert sweep_group_name("/tmp/x/my-sweep") == "sweep-my-sweep"  # a folder its user named
    with pytest.raises(ValueError, match="no name"):
        sweep_group_name("")


def test_plain_run_gets_a_dated_name_and_overrides_in_config_and_tags(obs_tmp, tmp_path):
    """A real (offline) run with logger.name unset: W&B's run record holds the dated name, the
    overrides as config and tags; the sweep group is empty for a single run."""
    out = tmp_path / "outputs" / "2026-03-01" / "09-15-00"
    args = ["experiment=smoke", "logger=wandb", "logger.tags=[mine]", "steps=1", "eval.num_tasks=1",
            f"hydra.run.dir={out}"]
    run_train(args, obs_tmp)  # obs_tmp: the session's build cache
    (wfile,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    run = next(r.run for r in records(wfile) if r.WhichOneof("record_type") == "run")
    assert run.display_name == "smoke-20260301-091500"
    assert list(run.tags) == ["mine", "experiment=smoke", "logger=wandb", "logger.tags=[mine]", "steps=1",
                              "eval.num_tasks=1"]
    assert run.run_group == ""
    assert read_run(wfile)["config"]["hydra_overrides"] == args[:-1]
