"""rlkit/cache_dir.py: the builds cache is a user cache folder, found from any working directory
($RLKIT_CACHE_DIR, else $XDG_CACHE_HOME/rlkit, else ~/.cache/rlkit), and an old ./.cache is named, never moved."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import rlkit.config  # noqa: F401  (the schema and the ${rlkit_cache_dir:} resolver)
from rlkit.cache_dir import legacy_cache_note, user_cache_dir
from rlkit.policy.tiny import default_cache_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import cache as cache_script  # noqa: E402


@pytest.fixture
def home(monkeypatch, tmp_path):
    """A fresh HOME, no cache variables, and a working directory that is not HOME."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("RLKIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return h


def test_resolution_order(home, monkeypatch, tmp_path):
    assert user_cache_dir() == home / ".cache" / "rlkit"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid per the XDG spec: ignored
    assert user_cache_dir() == home / ".cache" / "rlkit"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert user_cache_dir() == home / ".cache" / "rlkit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "rlkit"
    monkeypatch.setenv("RLKIT_CACHE_DIR", str(tmp_path / "mine"))  # wins over XDG
    assert user_cache_dir() == tmp_path / "mine"
    assert default_cache_dir() == tmp_path / "mine" / "tiny_vl"  # the tiny models follow it


def test_the_composed_config_uses_it_from_any_folder(home, monkeypatch, tmp_path):
    """paths.cache_dir (and the tiny policy's cache under it) no longer depends on the working directory."""
    def cache_dirs():
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="train")
        return cfg.paths.cache_dir, cfg.policy.cache_dir

    assert cache_dirs() == (str(home / ".cache" / "rlkit"), str(home / ".cache" / "rlkit" / "tiny_vl"))
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert cache_dirs()[0] == str(home / ".cache" / "rlkit")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dirs()[0] == str(tmp_path / "xdg" / "rlkit")
    monkeypatch.setenv("RLKIT_CACHE_DIR", "./.cache")  # the way back to the old place
    assert cache_dirs()[0] == ".cache"


def test_an_old_dot_cache_is_named_not_moved(home, tmp_path, monkeypatch):
    work = Path.cwd()
    new = user_cache_dir()
    assert legacy_cache_note(new) is None  # no old cache
    old_build = work / ".cache" / "sft" / "bbbb000000000002"
    old_build.mkdir(parents=True)
    note = legacy_cache_note(new)
    assert note is not None and "RLKIT_CACHE_DIR=./.cache" in note and str(work / ".cache") in note
    assert old_build.is_dir() and not new.exists()  # nothing moved, nothing created
    assert legacy_cache_note(work / ".cache") is None  # using the old folder: nothing to say
    (new / "grounding" / "aaaa000000000001").mkdir(parents=True)
    assert legacy_cache_note(new) is None  # the new default holds builds now
    monkeypatch.setenv("RLKIT_CACHE_DIR", str(tmp_path / "mine"))
    assert legacy_cache_note(tmp_path / "mine") is None  # a chosen cache: not the default


def test_cache_script_lists_the_default_and_names_the_old_one(home, capsys):
    work = Path.cwd()
    (work / ".cache" / "sft" / "bbbb000000000002").mkdir(parents=True)
    with pytest.raises(SystemExit):  # the new default does not exist yet: the error names where builds go
        cache_script.main([])
    assert "~/.cache/rlkit" in capsys.readouterr().err
    (home / ".cache" / "rlkit" / "sft").mkdir(parents=True)
    assert cache_script.main([]) == 0
    assert "RLKIT_CACHE_DIR=./.cache" in capsys.readouterr().err
