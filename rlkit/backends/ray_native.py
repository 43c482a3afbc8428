"""backend=native_ray / native_ray_ddp: the GRPO recipe with the Ray executor (rlkit.recipes.ray;
docs/distributed.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.ray import RayExecutor, ray_settings


class RayNativeBackend:
    """conf/backend/native_ray.yaml; the keyword arguments are RaySettings' fields (rlkit.distributed.runtime).

    Raises: ConfigError naming the key for an invalid value.
    """

    def __init__(self, **settings: Any) -> None:
        self.settings = ray_settings(settings)

    def run(self, cfg: DictConfig) -> dict:
        from rlkit.sync import run_key_for, sync_root

        out = Path(cfg.paths.output_dir)
        return GRPORecipe(cfg, RayExecutor(self.settings, sync_root(cfg.paths.shared, run_key_for(out)), log_dir=out)).run()
