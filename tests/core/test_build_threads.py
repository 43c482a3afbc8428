"""trainer.build_threads: the one-time builds (grounding, SFT warm start) run alone in the driver, on every core
they may use; training goes back to trainer.num_threads (1) however the build ends."""

import pytest
import torch
from omegaconf import open_dict

from rlkit.backends.native import NativeRun, build_threads
from rlkit.run import ConfigError, compose_train


def test_the_setting_wins_then_omp_num_threads_then_the_usable_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert build_threads(5) == 5
    assert build_threads(None) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 4, 7}, raising=False)
    assert build_threads(None) == 3
    monkeypatch.delattr("os.sched_getaffinity", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert build_threads(None) == 6


@pytest.mark.parametrize("value", ["two", "0", "-1"])
def test_a_malformed_omp_num_threads_is_refused_with_the_fix(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ConfigError, match=r"OMP_NUM_THREADS=.* is not a whole number >= 1: unset it, or set "
                                          r"trainer.build_threads=N"):
        build_threads(None)


def test_the_warm_start_runs_on_build_threads_and_training_on_num_threads_even_after_a_failed_build(
        tmp_path, monkeypatch):
    cfg = compose_train(["experiment=smoke", "logger=console", "trainer.build_threads=3"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.cache_dir = str(tmp_path / "cache")
    seen = []

    def failing_build(self, *args):
        seen.append(torch.get_num_threads())
        raise RuntimeError("the build failed")

    monkeypatch.setattr(NativeRun, "_warm_start", failing_build)
    torch.set_num_threads(1)
    with pytest.raises(RuntimeError, match="the build failed"):
        NativeRun(cfg).setup()
    assert seen == [3]
    assert torch.get_num_threads() == 1  # trainer.num_threads=null
