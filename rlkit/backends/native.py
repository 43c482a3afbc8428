"""backend=native: the GRPO recipe with the local executor (one process; CPU or one GPU)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlkit.recipes.grpo import GRPORecipe
from rlkit.recipes.local import LocalExecutor


class NativeBackend:
    """conf/backend/native.yaml. No options: the recipe reads the typed groups. With ``rollout.engine=vllm`` the
    adapter versions go through ``paths.shared`` as on Ray (rlkit.sync) and vLLM's log into the run folder."""

    def run(self, cfg: DictConfig) -> dict:
        from rlkit.sync import run_key_for, sync_root

        out = Path(cfg.paths.output_dir)
        return GRPORecipe(cfg, LocalExecutor(sync_root(cfg.paths.shared, run_key_for(out)), log_dir=out)).run()
