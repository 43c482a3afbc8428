"""Logger options: composition of logger=multi / tensorboard / ray_metrics, strict keys, fan-out,
and the TensorBoard files of the shared smoke run."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import rlkit.config  # noqa: F401  (registers the schema)
from rlkit.loggers import ConsoleLogger, MultiLogger, TensorBoardLogger, WandbLogger
from rlkit.metrics_export import RayMetricsLogger
from rlkit.run import ConfigError, instantiate_plugin

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def _logger_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    return cfg.logger


def test_multi_composes_wandb_and_tensorboard_from_their_files():
    node = _logger_cfg(["logger=multi"])
    assert node._target_ == "rlkit.loggers.MultiLogger"
    assert list(node.loggers) == ["wandb", "tensorboard"]
    assert node.loggers.wandb == _logger_cfg(["logger=wandb"])
    assert node.loggers.tensorboard == _logger_cfg(["logger=tensorboard"])
    lg = instantiate_plugin(node, "logger")
    assert isinstance(lg, MultiLogger)
    assert [type(x) for x in lg.loggers.values()] == [WandbLogger, TensorBoardLogger]


def test_multi_entries_can_be_added_removed_and_set():
    node = _logger_cfg(["logger=multi", "+logger@logger.loggers.ray=ray_metrics", "~logger.loggers.tensorboard",
                        "logger.loggers.wandb.project=maze"])
    assert list(node.loggers) == ["wandb", "ray"]
    assert node.loggers.wandb.project == "maze"
    lg = instantiate_plugin(node, "logger")
    assert isinstance(lg.loggers["ray"], RayMetricsLogger) and lg.loggers["ray"].mode == "on"


@pytest.mark.parametrize("override", ["logger.loggers.wandb.projetc=x", "logger.loggers.tensorboard.flush=1"])
def test_unknown_key_in_a_multi_entry_fails_at_compose(override):
    with pytest.raises(ConfigCompositionException, match="Could not override"):
        _logger_cfg(["logger=multi", override])


def test_unknown_key_added_with_plus_fails_when_built():
    node = _logger_cfg(["logger=multi", "+logger.loggers.wandb.projetc=x"])
    with pytest.raises(ConfigError, match="projetc"):
        instantiate_plugin(node, "logger")


def test_tensorboard_and_ray_metrics_options_build():
    assert isinstance(instantiate_plugin(_logger_cfg(["logger=tensorboard"]), "logger"), TensorBoardLogger)
    rm = instantiate_plugin(_logger_cfg(["logger=ray_metrics"]), "logger")
    assert isinstance(rm, RayMetricsLogger) and (rm.mode, rm.prefix) == ("on", "rlkit")
    with pytest.raises(ConfigError, match="mode"):
        instantiate_plugin(_logger_cfg(["logger=ray_metrics", "logger.mode=sometimes"]), "logger")


class _Rec:
    def __init__(self, name, calls, fail_finish=False, run_id=None):
        self.name, self.calls, self.fail_finish, self.rid = name, calls, fail_finish, run_id
        self.run_id = None

    def start(self, output_dir, config, run_name, group, resume_id, resume_step=0):
        self.calls.append((self.name, "start", resume_step))
        return self.rid

    def log(self, metrics, step):
        self.calls.append((self.name, "log", step))

    def log_table(self, key, columns, rows, step):
        self.calls.append((self.name, "table", key))

    def log_artifact(self, path, name, kind):
        self.calls.append((self.name, "artifact", kind))

    def finish(self):
        self.calls.append((self.name, "finish", None))
        if self.fail_finish:
            raise RuntimeError(f"{self.name} failed to finish")


def test_multi_fans_out_and_finishes_every_logger(tmp_path):
    calls: list = []
    multi = MultiLogger({"a": _Rec("a", calls, fail_finish=True), "b": _Rec("b", calls, run_id="wb123")})
    assert multi.start(tmp_path, {}, "x", None, None, resume_step=3) == "wb123"
    multi.log({"reward/mean": 1.0}, 4)
    multi.log_table("eval/samples", ["seed"], [[0]], 4)
    multi.log_artifact(tmp_path, "adapter", "lora_adapter")
    with pytest.raises(RuntimeError, match="a failed"):
        multi.finish()
    assert ("b", "finish", None) in calls  # finished although a raised first
    assert ("a", "start", 3) in calls and ("b", "log", 4) in calls and ("a", "table", "eval/samples") in calls


def test_multi_rejects_non_loggers():
    with pytest.raises(ValueError, match="at least one"):
        MultiLogger({})
    with pytest.raises(ValueError, match="logger.loggers.x"):
        MultiLogger({"x": object()})


def test_console_logger_is_silent(tmp_path):
    lg = ConsoleLogger()
    assert lg.start(tmp_path, {}, "x", None, None) is None
    lg.log({"a": 1}, 1)
    lg.finish()


def test_tensorboard_event_files_of_the_smoke_run(smoke_run):
    pytest.importorskip("tensorboard", reason="logger=tensorboard needs the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = smoke_run.out / "tensorboard"
    assert list(tb.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    for key in ("reward/mean", "policy/approx_kl", "policy/clip_ratio", "timing/rollout", "eval/success_rate"):
        assert key in tags["scalars"], (key, tags["scalars"])
    assert [e.step for e in acc.Scalars("reward/mean")] == [1, 2]
    assert [e.step for e in acc.Scalars("eval/success_rate")] == [0, 2]
    assert "eval/samples/0" in tags["images"]
    img = acc.Images("eval/samples/0")[0]
    assert (img.width, img.height) == (175, 175)  # a 7x7 maze at 25 px cells (the default env)
    # add_text goes to the text plugin's tensors
    assert any(t.startswith("eval/samples") for t in tags["tensors"]) and "config" in " ".join(tags["tensors"])


def test_metrics_file_always_written_next_to_the_loggers(smoke_run):
    lines = (smoke_run.out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) >= 4  # eval before, 2 steps, final eval
    assert OmegaConf.load(smoke_run.out / ".hydra" / "config.yaml").logger._target_ == "rlkit.loggers.MultiLogger"
