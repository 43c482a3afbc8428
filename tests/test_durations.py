"""tests/conftest.py's durations record (RLKIT_DURATIONS_FILE): which file, and what it holds."""

from tests.conftest import ROOT, durations_path, format_durations


def test_the_file_is_the_named_one_or_tests_durations_txt(tmp_path):
    assert durations_path(None) is None and durations_path("") is None and durations_path("0") is None
    assert durations_path("1") == ROOT / "tests" / "durations.txt"
    assert durations_path("out/d.txt") == ROOT / "out" / "d.txt"  # relative: to the repo root
    assert durations_path(str(tmp_path / "d.txt")) == tmp_path / "d.txt"


def test_the_slowest_first_and_only_as_many_as_kept():
    durations = {"t::a": [1.5, "passed"], "t::b": [12.25, "failed"], "t::c": [1.5, "skipped"], "t::d": [0.1, "passed"]}
    lines = format_durations(durations, keep=3).splitlines()
    assert lines == ["    12.25s failed  t::b", "     1.50s passed  t::a", "     1.50s skipped t::c"]
