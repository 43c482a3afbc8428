"""scripts/cache.py: lists the one-time builds with what built them, and prunes only what no build needs."""

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlkit.stages.cache import build_record, cache_key_inputs, cache_key_of, sft_cache_key

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import cache as cache_script  # noqa: E402


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _built(cache: Path, kind: str, key: str, summary: dict) -> Path:
    folder = cache / kind / key
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / f"{kind}_summary.json").write_text(json.dumps(summary))
    (cache / kind / f"{key}.lock").touch()
    return folder


def _partial(cache: Path, kind: str, key: str, step: int) -> Path:
    folder = cache / kind / f"{key}.partial"
    folder.mkdir(parents=True)
    torch.save({"step": step}, folder / "state.pt")
    (cache / kind / f"{key}.lock").touch()
    return folder


@pytest.fixture
def cache(tmp_path):
    c = tmp_path / "cache"
    g = _built(c, "grounding", "aaaa000000000001", {"steps": 125, "stop_metric": "wall_bits",
                                                    "final": {"wall_bits": 1.0}, "wall_time_s": 80,
                                                    "build": build_record({"stage": "grounding"})})
    _built(c, "sft", "bbbb000000000002", {"steps": 200, "val_success": 0.531, "wall_time_s": 278,
                                          "build": build_record({"stage": "sft", "start": str(g),
                                                                 "inputs": {"sft": {"lr": 1e-3}}})})
    _built(c, "sft", "cccc000000000003", {"steps": 25, "val_success": 0.5, "wall_time_s": 35})  # before records
    _partial(c, "sft", "bbbb000000000002", 200)  # a build killed as it finished
    _partial(c, "sft", "dddd000000000004", 150)  # a stopped build some config can resume
    (c / "sft" / f"eeee000000000005.tmp-{_dead_pid()}").mkdir()  # a save cut short
    (c / "grounding" / "ffff000000000006.lock").touch()  # the lock of a build that does not exist
    (c / "sft" / "mycheckpoint").mkdir()  # not rlkit's
    (c / "sft" / "mycheckpoint" / "model.safetensors").write_bytes(b"mine")
    return c


def test_the_listing_names_each_build_what_built_it_and_the_leftovers(cache, capsys):
    assert cache_script.main(["--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if " leftover " not in line}
    assert (f"from grounding/aaaa000000000001; built on {torch.get_num_threads()} thread(s)"
            in lines["sft/bbbb000000000002"])  # the build it started from, by its key in this cache
    assert "200 steps, val success 53.1%" in lines["sft/bbbb000000000002"]
    assert "125 steps, held-out wall_bits 100.0%" in lines["grounding/aaaa000000000001"]
    assert "from -; built on -" in lines["sft/cccc000000000003"]  # built before the record existed
    assert "stopped at step 150" in lines["sft/dddd000000000004"]
    leftovers = [line for line in out.splitlines() if " leftover " in line]
    assert len(leftovers) == 2 and any("progress of a build that finished" in x for x in leftovers)
    assert any("a save cut short" in x for x in leftovers)
    assert "not a build rlkit wrote" in lines["sft/mycheckpoint"]


def test_show_prints_the_config_the_key_hashes(cache, capsys):
    assert cache_script.main(["--cache-dir", str(cache), "--show", "bbbb"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["build"]["inputs"] == {"sft": {"lr": 1e-3}} and shown["result"] == "val success 53.1%"
    assert shown["build"]["key"] == cache_key_of({"sft": {"lr": 1e-3}})
    with pytest.raises(SystemExit, match="0 finished builds match"):
        cache_script.main(["--cache-dir", str(cache), "--show", "dddd"])  # stopped: no record yet


def test_prune_removes_leftovers_only_and_stale_stops_only_when_asked(cache, capsys):
    before = sorted(p.name for p in (cache / "sft").iterdir())
    assert cache_script.main(["--cache-dir", str(cache), "--prune", "--dry-run"]) == 0
    assert "would remove" in capsys.readouterr().out and sorted(p.name for p in (cache / "sft").iterdir()) == before

    assert cache_script.main(["--cache-dir", str(cache), "--prune"]) == 0
    left = {p.name for p in (cache / "sft").iterdir()} | {p.name for p in (cache / "grounding").iterdir()}
    assert "bbbb000000000002.partial" not in left and not any(".tmp-" in n for n in left)
    assert {"bbbb000000000002", "cccc000000000003", "aaaa000000000001", "dddd000000000004.partial",
            "mycheckpoint", "ffff000000000006.lock"} <= left  # what rlkit did not write, and locks, stay

    # a stopped build is removed only past --stopped-older-than, and never while a build holds its lock
    stopped = cache / "sft" / "dddd000000000004.partial"
    old = time.time() - 10 * 86400
    os.utime(stopped / "state.pt", (old, old))
    with open(cache / "sft" / "dddd000000000004.lock") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a job resuming it right now
        cache_script.main(["--cache-dir", str(cache), "--prune", "--stopped-older-than", "7"])
        assert stopped.exists()
        fcntl.flock(fh, fcntl.LOCK_UN)
    cache_script.main(["--cache-dir", str(cache), "--prune", "--stopped-older-than", "30"])
    assert stopped.exists()
    cache_script.main(["--cache-dir", str(cache), "--prune", "--stopped-older-than", "7"])
    assert not stopped.exists()


def test_bad_arguments_are_refused_with_the_fix(tmp_path):
    run = [sys.executable, str(ROOT / "scripts" / "cache.py")]
    proc = subprocess.run([*run, "--cache-dir", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 2 and "no such folder" in proc.stderr and "RLKIT_CACHE_DIR" in proc.stderr
    proc = subprocess.run([*run, "--cache-dir", str(tmp_path), "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 2 and "go with --prune" in proc.stderr


def test_the_recorded_key_is_the_cache_key():
    inputs = cache_key_inputs({"lr": 1e-3, "max_steps": 5}, {"name": "visgym"}, {"name": "tiny_vl", "lora": {"r": 8}})
    assert "lora" not in inputs["policy"]  # what the key ignores is not recorded as if it counted
    assert build_record({"inputs": inputs})["key"] == sft_cache_key({"lr": 1e-3, "max_steps": 5}, {"name": "visgym"},
                                                                   {"name": "tiny_vl", "lora": {"r": 8}})
