"""backend=native: the GRPO recipe with the local executor (one process; CPU or one GPU)."""

from __future__ import annotations

from omegaconf import DictConfig

from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.local import LocalExecutor


class NativeBackend:
    """conf/backend/native.yaml. No options: the recipe reads the typed groups."""

    def run(self, cfg: DictConfig) -> dict:
        return GRPORecipe(cfg, LocalExecutor()).run()
