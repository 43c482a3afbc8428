"""trainer.build_threads: the one-time builds (grounding, SFT warm start) run alone in the driver, on every core
they may use; training goes back to trainer.num_threads however the build ends."""

import logging

import pytest
import torch
from omegaconf import open_dict

import rlkit.recipes.threads as native
from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.local import LocalExecutor
from rlkit.recipes.threads import build_threads, cgroup_cpu_limit
from rlkit.run import compose_train
from rlkit.stages import warm_start


def test_the_setting_wins_then_omp_num_threads_then_the_usable_cores_under_the_cpu_quota(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert build_threads(5) == 5
    assert build_threads(None) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # OpenMP's nested levels: the first is the pool's
    assert build_threads(None) == 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 4, 7}, raising=False)
    monkeypatch.setattr(native, "cgroup_cpu_limit", lambda: None)
    assert build_threads(None) == 3
    monkeypatch.setattr(native, "cgroup_cpu_limit", lambda: 2)  # a pod limited to 2 CPUs on a bigger host
    assert build_threads(None) == 2
    monkeypatch.delattr("os.sched_getaffinity", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    monkeypatch.setattr(native, "cgroup_cpu_limit", lambda: None)
    assert build_threads(None) == 6


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_malformed_omp_num_threads_is_warned_about_and_the_cores_used(monkeypatch, caplog, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(native, "cgroup_cpu_limit", lambda: None)
    with caplog.at_level(logging.WARNING):
        assert build_threads(None) == 2
    assert f"OMP_NUM_THREADS={value!r} is not a whole number >= 1: ignored" in caplog.text


@pytest.mark.parametrize("v2, v1, expected", [
    ("150000 100000\n", None, 2),       # 1.5 CPUs: rounded up
    ("max 100000\n", None, None),       # no limit
    (None, ("400000", "100000"), 4),    # cgroup v1
    (None, ("-1", "100000"), None),     # v1, no limit
    (None, None, None),                 # no cgroup files
])
def test_the_cgroup_cpu_limit(tmp_path, v2, v1, expected):
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2)
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(v1[0])
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(v1[1])
    assert cgroup_cpu_limit(tmp_path) == expected


@pytest.mark.parametrize("num_threads, sft_enabled", [(None, True), (2, True), (2, False)])
def test_the_builds_run_on_build_threads_and_training_on_num_threads_even_after_a_failed_build(
        tmp_path, monkeypatch, num_threads, sft_enabled):
    cfg = compose_train(["experiment=smoke", "logger=console", "trainer.build_threads=3",
                         f"trainer.num_threads={'null' if num_threads is None else num_threads}",
                         f"sft.enabled={str(sft_enabled).lower()}"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.cache_dir = str(tmp_path / "cache")
    seen = []

    def failing_build(*args):
        seen.append(torch.get_num_threads())
        raise RuntimeError("the build failed")

    # sft.enabled=false: the grounding stage alone is the build (rlkit.stages.warm_start.grounded_base)
    monkeypatch.setattr(warm_start, "build_warm_start" if sft_enabled else "grounded_base", failing_build)
    torch.set_num_threads(1)
    try:
        with pytest.raises(RuntimeError, match="the build failed"):
            GRPORecipe(cfg, LocalExecutor()).setup()
        assert seen == [3]
        assert torch.get_num_threads() == (num_threads or 1)
    finally:
        torch.set_num_threads(1)
