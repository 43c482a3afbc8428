"""WandbLogger.resume_history on offline segments damaged the ways a SIGKILL (or a disk) leaves
them: the resumed W&B run must hold every metrics.jsonl step exactly once, with its values.

Each test copies one finished 7-row segment (steps 0..6, made once) and resumes into it in this
process (wandb offline, ~1 s an init)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rlkit.loggers import WandbLogger
from rlkit.wandb_file import history_step, scan
from tests.observability.wandb_reader import assert_wandb_matches_metrics, segments

STEPS = 6


def _lines(upto: int) -> list[dict]:
    out = [{"step": 0, "eval/success_rate": 0.25}]
    for s in range(1, upto + 1):
        out.append({"step": s, "reward/mean": s / 7, "policy/loss": -s / 100, "trainer/step": s})
    return out


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
    tmp = tmp_path_factory.getbasetemp() / "wandb-resume-env"
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for k, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(k, str(tmp / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _finish(lg: WandbLogger) -> None:
    """finish, then wait for wandb-core to write the file out (``finish`` returns before it has, in
    a process that goes on; ``wandb.teardown`` stops the service, as the end of a process does)."""
    import wandb

    lg.finish()
    wandb.teardown()


def _write_metrics(out: Path, lines: list[dict]) -> None:
    (out / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, str]:
    """A run folder whose one W&B segment holds steps 0..6 (a cleanly finished run)."""
    import os

    out = tmp_path_factory.mktemp("wandb_seg") / "run"
    out.mkdir()
    tmp = tmp_path_factory.getbasetemp() / "wandb-resume-env"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DATA_DIR": str(tmp / "data"),
           "WANDB_CACHE_DIR": str(tmp / "cache"), "WANDB_CONFIG_DIR": str(tmp / "config")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        lg = WandbLogger(project="rlkit-resume-test", mode="offline")
        run_id = lg.start(out, {"steps": STEPS}, "seg", None, None)
        for ln in _lines(STEPS):
            lg.log({k: v for k, v in ln.items() if k != "step"}, ln["step"])
        _finish(lg)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return out, run_id


def _resume(run: Path, run_id: str, resume_step: int, lines: list[dict] | None = None) -> dict:
    """Resume at ``resume_step`` as the backend does, log the rest of the run live, finish."""
    lines = _lines(resume_step) if lines is None else lines
    _write_metrics(run, lines)  # metrics.jsonl, cut back to the checkpoint
    lg = WandbLogger(project="rlkit-resume-test", mode="offline")
    assert lg.start(run, {"steps": STEPS}, "seg", None, run_id, resume_step=resume_step) == run_id
    report = lg.resume_history(lines, resume_step)
    for ln in _lines(STEPS)[len(lines):]:
        lg.log({k: v for k, v in ln.items() if k != "step"}, ln["step"])
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(ln) + "\n")
    _finish(lg)
    return report


def _copy(finished, tmp_path) -> tuple[Path, str, Path]:
    src, run_id = finished
    run = tmp_path / "run"
    shutil.copytree(src, run, symlinks=True)
    # an older start time in the folder name: a resume in the same second as the fixture's run would
    # get the same folder name (wandb names it by the second), which a real resume never does
    (old,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    old.rename(old.with_name(f"offline-run-20000101_000000-{run_id}"))
    (seg,) = segments(run, run_id)
    return run, run_id, seg


def _row_offsets(seg: Path) -> dict[int, int]:
    return {history_step(r): off for off, r in scan(seg).records if history_step(r) is not None}


def test_rows_after_the_checkpoint_are_cut_and_redone(finished, tmp_path):
    run, run_id, seg = _copy(finished, tmp_path)
    at = _row_offsets(seg)[3]
    report = _resume(run, run_id, resume_step=3)
    assert report["kept"] == [0, 1, 2] and report["relogged"] == [3]
    assert report["cut"] == [(str(seg), at, "step 3 is at or after the checkpoint's step 3")]
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_rerun_after_the_last_checkpoint_keeps_one_row_per_step(finished, tmp_path):
    """A finished run rerun in its folder (or killed in its final eval) logs its last step again."""
    run, run_id, _ = _copy(finished, tmp_path)
    report = _resume(run, run_id, resume_step=STEPS)
    assert report["kept"] == list(range(STEPS)) and report["relogged"] == [STEPS]
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_header_only_segment_is_relogged_whole(finished, tmp_path):
    """A short run killed early leaves the 7-byte header alone: every step comes from metrics.jsonl."""
    run, run_id, seg = _copy(finished, tmp_path)
    seg.write_bytes(seg.read_bytes()[:7])
    report = _resume(run, run_id, resume_step=4)
    assert report["kept"] == [] and report["relogged"] == [0, 1, 2, 3, 4] and report["cut"] == []
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_torn_tail_is_cut_and_the_lost_rows_relogged(finished, tmp_path):
    run, run_id, seg = _copy(finished, tmp_path)
    row3 = _row_offsets(seg)[3]
    seg.write_bytes(seg.read_bytes()[:row3 + 20])  # inside step 3's record, as a SIGKILL mid-flush leaves it
    report = _resume(run, run_id, resume_step=5)
    assert report["kept"] == [0, 1, 2] and report["relogged"] == [3, 4, 5]
    (cut,) = report["cut"]  # at the end of the last complete record: where step 3's row began
    assert cut[:2] == (str(seg), row3) and cut[2].startswith(f"torn chunk at byte {row3}"), cut
    assert scan(seg).problem is None  # the file is clean again for wandb sync
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_garbled_record_is_cut_there(finished, tmp_path):
    run, run_id, seg = _copy(finished, tmp_path)
    data = bytearray(seg.read_bytes())
    at = _row_offsets(seg)[2]
    data[at + 4: at + 7] = b"\xff\xff\x09"  # the chunk header of step 2's row: length and type garbled
    seg.write_bytes(bytes(data))
    report = _resume(run, run_id, resume_step=4)
    assert report["kept"] == [0, 1] and report["relogged"] == [2, 3, 4]
    assert "unknown chunk type" in report["cut"][0][2]
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


@pytest.mark.parametrize("content", [b"", b"not a wandb file at all"])
def test_unreadable_segment_is_set_aside(finished, tmp_path, content, caplog):
    run, run_id, seg = _copy(finished, tmp_path)
    seg.write_bytes(content)
    with caplog.at_level("WARNING", logger="rlkit.loggers"):
        report = _resume(run, run_id, resume_step=4)
    assert report["kept"] == [] and report["relogged"] == [0, 1, 2, 3, 4]
    assert not seg.exists() and seg.with_name(seg.name + ".unreadable").read_bytes() == content
    assert "is not a W&B run file" in caplog.text and "logged again from metrics.jsonl" in caplog.text
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_rows_that_differ_from_metrics_are_replaced(finished, tmp_path):
    """metrics.jsonl is the record: a W&B row with other values is cut and logged again."""
    run, run_id, _ = _copy(finished, tmp_path)
    lines = _lines(4)
    lines[2]["reward/mean"] = 0.5
    report = _resume(run, run_id, resume_step=4, lines=lines)
    assert report["kept"] == [0, 1] and report["relogged"] == [2, 3, 4]
    assert report["cut"][0][2] == "step 2 differs from metrics.jsonl"
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


def test_two_resumes_chain_their_segments(finished, tmp_path):
    """Resumed twice (each time from an earlier point than the last segment reached): three
    segments that together hold each step once."""
    run, run_id, seg = _copy(finished, tmp_path)
    seg.write_bytes(seg.read_bytes()[:_row_offsets(seg)[2] + 9])  # killed with rows 0, 1 on disk
    first = _resume(run, run_id, resume_step=3)
    assert first["kept"] == [0, 1] and first["relogged"] == [2, 3]
    time.sleep(1.1)  # wandb names a segment's folder by the second it starts; a real resume is seconds later
    second = _resume(run, run_id, resume_step=5)  # the second segment finished with 2..6; now redo 5, 6
    assert second["kept"] == [0, 1, 2, 3, 4] and second["relogged"] == [5]
    assert len(segments(run, run_id)) == 3
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))
    # a row of the first segment that differs: it is cut there, and the later segments from their first row
    lines = _lines(4)
    lines[1]["reward/mean"] = 0.75
    time.sleep(1.1)
    third = _resume(run, run_id, resume_step=4, lines=lines)
    assert third["kept"] == [0] and third["relogged"] == [1, 2, 3, 4]
    assert [why for _, _, why in third["cut"]] == ["step 1 differs from metrics.jsonl",
                                                   "step 2 where metrics.jsonl has 1",
                                                   "step 5 is at or after the checkpoint's step 4"]
    assert assert_wandb_matches_metrics(run, run_id) == list(range(STEPS + 1))


class _OnlineRun:
    def __init__(self, starting_step: int):
        self.starting_step, self.logged = starting_step, []

    def log(self, metrics, step):
        self.logged.append(step)


@pytest.mark.parametrize("starting,relogged,warns", [(0, [0, 1, 2, 3], False), (3, [3], False), (6, [], True)])
def test_online_relogs_from_the_servers_next_step(tmp_path, starting, relogged, warns, caplog):
    """Online, W&B's server says where the run stands (``run.starting_step``); lower steps are refused."""
    lg = WandbLogger(mode="online")
    lg._run, lg._mode, lg.run_dir, lg.run_id = _OnlineRun(starting), "online", tmp_path / "run-x", "x"
    with caplog.at_level("WARNING", logger="rlkit.loggers"):
        report = lg.resume_history(_lines(3), 3)
    assert report["relogged"] == relogged and lg._run.logged == relogged
    assert ("already holds steps 4..5" in caplog.text) == warns
