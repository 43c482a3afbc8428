"""``backend=skyrl``: the composed experiment on SkyRL's colocated vLLM + FSDP2 trainer (conf/backend/skyrl.yaml).

run(cfg): compile (rlkit.backends.skyrl.compile) -> validate with SkyRL's config classes
(rlkit.backends.skyrl.schema) -> write ``skyrl_config.yaml`` and ``skyrl_command.sh`` into the job's
output folder -> (dry_run: print them and stop) -> pre-flight checks -> write the task datasets under
the run folder on the shared filesystem -> SkyRL's trainer on the Ray cluster
(rlkit.backends.skyrl.entrypoint.launch) -> the result dict (also ``result.json``), with the eval
success before and after training read from SkyRL's eval dumps.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rlkit.backends.skyrl.compile import SkyRLConfigError, SkyRLJob, compile_job, job_overrides
from rlkit.backends.skyrl.settings import SkyRLSettings
from rlkit.errors import ConfigError

#: SkyRL's evaluation metric that is rlkit's eval/success_rate (the env's per-episode ``success``).
SUCCESS_METRIC = "eval/all/environment/success"


class SkyRLBackend:
    """conf/backend/skyrl.yaml; the keys are ``SkyRLSettings`` (an unknown key is a TypeError naming it)."""

    def __init__(self, **settings: Any):
        self.settings = SkyRLSettings(**{k: _plain(v) for k, v in settings.items()})

    def compile(self, cfg: DictConfig) -> SkyRLJob:
        """The compiled job (see rlkit.backends.skyrl.compile.compile_job)."""
        return compile_job(cfg, self.settings)

    def run(self, cfg: DictConfig) -> dict:
        """Run (or, with ``backend.dry_run``, only print) the job; returns the result dict.

        Raises:
            SkyRLConfigError: options SkyRL cannot honour; SkyRL rejecting the compiled config.
            ConfigError: a missing WANDB_API_KEY for SkyRL's wandb logger; ``trainer.resume_mode=none``
                over existing checkpoints without ``trainer.overwrite``.
            SkyRLUnavailableError: SkyRL's GPU stack is not installed (dry runs do not need it).
        """
        from rlkit.backends.skyrl.schema import SkyRLNotInstalledError, validate

        job = self.compile(cfg)
        out = Path(cfg.paths.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        try:
            validated = validate(job.config)
            full_yaml = yaml.safe_dump(validated.as_dict, sort_keys=False)
            level = validated.level
        except SkyRLNotInstalledError as e:
            if not self.settings.dry_run:
                raise
            full_yaml, level = job.overrides_yaml(), f"not validated: {e}"
        (out / "skyrl_config.yaml").write_text(full_yaml)
        (out / "skyrl_command.sh").write_text(job.command() + "\n")
        if self.settings.dry_run:
            print(f"# SkyRL config (validation: {level})\n{full_yaml}\n# command\n{job.command()}")
            return {"status": "dry_run", "output_dir": str(out), "run_dir": job.run_dir,
                    "skyrl_config": str(out / "skyrl_config.yaml"), "overrides": ",".join(job_overrides())}

        self._preflight(job, cfg)
        from rlkit.backends.skyrl.data import write_datasets
        from rlkit.backends.skyrl.entrypoint import launch

        write_datasets(job)
        t0 = time.time()
        launch(job.config, job.env_vars)
        result = self._result(job, out, time.time() - t0)
        (out / "result.json").write_text(json.dumps(result, indent=2))
        return result

    def _preflight(self, job: SkyRLJob, cfg: DictConfig) -> None:
        trainer = job.config["trainer"]
        if trainer["logger"] == "wandb" and not os.environ.get("WANDB_API_KEY"):
            raise ConfigError(
                "SkyRL's wandb logger requires WANDB_API_KEY (skyrl validate_generator_cfg), also for "
                "logger.mode=offline; export it, or use logger=console / logger.mode=disabled"
            )
        ckpts = Path(trainer["ckpt_path"])
        existing = sorted(ckpts.glob("global_step_*")) if ckpts.is_dir() else []
        if trainer["resume_mode"] == "none" and existing and not cfg.trainer.overwrite:
            raise ConfigError(
                f"{ckpts} already holds SkyRL checkpoints ({existing[-1].name}) and trainer.resume_mode=none; use "
                "trainer.resume_mode=latest to continue, or trainer.overwrite=true to start over there"
            )

    def _result(self, job: SkyRLJob, out: Path, wall_time_s: float) -> dict[str, Any]:
        steps = job.config["trainer"]["max_training_steps"]
        before = read_eval_success(job, 0)
        after = read_eval_success(job, steps)
        return {
            "status": "completed",
            "backend": "skyrl",
            "eval_set": job.eval_set_name,
            "eval_num_tasks": len(job.eval_seeds),
            "eval_success_before": before,
            "eval_success_after": after,
            "steps_completed": steps,
            "wall_time_s": round(wall_time_s, 2),
            "adapter_dir": f"{job.config['trainer']['export_path']}/global_step_{steps}/policy",
            "checkpoint_dir": job.config["trainer"]["ckpt_path"],
            "run_dir": job.run_dir,
            "output_dir": str(out),
            "max_turns": job.max_turns,
            "overrides": ",".join(job_overrides()) or "default",
            "host": platform.node(),
        }


def read_eval_success(job: SkyRLJob, step: int) -> float | None:
    """``eval/all/environment/success`` of SkyRL's evaluation after ``step`` training steps (0 = before
    training), from ``<export_path>/dumped_evals/global_step_<step>_evals/aggregated_results.jsonl``;
    None when SkyRL did not evaluate at that step (e.g. eval_before_train=false)."""
    path = Path(job.config["trainer"]["export_path"]) / "dumped_evals" / f"global_step_{step}_evals" / "aggregated_results.jsonl"
    if not path.is_file():
        return None
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    value = json.loads(lines[-1]).get(SUCCESS_METRIC) if lines else None
    return None if value is None else float(value)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


__all__ = ["SkyRLBackend", "SkyRLConfigError", "read_eval_success"]
