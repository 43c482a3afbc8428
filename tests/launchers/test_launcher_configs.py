"""The launcher options compose from the real config tree (conf/train.yaml + conf/launcher/*.yaml) and
resolve to the registered plugin classes; typos in hydra.launcher keys fail at compose time."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.core.utils import setup_globals

import rlkit.config  # noqa: F401  (the typed schema conf/train.yaml builds on)


@pytest.fixture
def compose_train(repo_root):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(repo_root / "conf"), version_base="1.3"):
        setup_globals()
        yield lambda overrides: compose("train", overrides=overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()


def test_plugins_are_discovered():
    names = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover()}
    assert "hydra_plugins.rlkit_launchers.ray_launchers.RayJobsLauncher" in names
    assert "hydra_plugins.rlkit_launchers.ray_launchers.HyperPodLauncher" in names
    assert "hydra_plugins.rlkit_launchers.ray_launchers.LocalLauncher" in names


def test_launcher_options_compose(compose_train):
    local = compose_train(["launcher=local"])
    assert local.hydra.launcher._target_ == "hydra_plugins.rlkit_launchers.ray_launchers.LocalLauncher"

    ray = compose_train(["launcher=ray"])
    assert ray.hydra.launcher._target_ == "hydra_plugins.rlkit_launchers.ray_launchers.RayJobsLauncher"
    assert ray.hydra.launcher.address == "http://127.0.0.1:8265"
    assert ray.hydra.launcher.working_dir == "auto" and ray.hydra.launcher.sweep_dir is None
    assert "WANDB_API_KEY" in ray.hydra.launcher.pass_env

    hp = compose_train(["launcher=hyperpod", "hydra.launcher.address=sagemaker_ray://rlkit/team-a"])
    assert hp.hydra.launcher._target_ == "hydra_plugins.rlkit_launchers.ray_launchers.HyperPodLauncher"
    assert hp.hydra.launcher.working_dir == "upload" and hp.hydra.launcher.python == "python"
    assert hp.hydra.launcher.sweep_dir == f"/shared/rlkit/{hp.hydra.sweep.dir}"
    assert hp.hydra.launcher.sweep_dir.startswith("/shared/rlkit/multirun/")
    assert "WANDB_API_KEY" not in hp.hydra.launcher.pass_env  # secrets come from a Kubernetes Secret
    assert compose_train(["launcher=hyperpod"]).hydra.launcher.address is None  # launch() says what to set


def test_launcher_key_typos_fail_at_compose(compose_train):
    with pytest.raises(Exception, match="max_concurent_jobs"):
        compose_train(["launcher=ray", "hydra.launcher.max_concurent_jobs=3"])
    with pytest.raises(Exception, match="max_concurrent_jobs"):
        compose_train(["launcher=ray", "hydra.launcher.max_concurrent_jobs=two"])
