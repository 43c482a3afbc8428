"""Evaluation on a fixed set of tasks: greedy success rate, optional pass@k, per-task outcomes.

Success is the env's own criterion (``EpisodeEnv.success()``; for VisGym mazes: the agent issued
stop on the goal). pass@k uses the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code"): 1 - C(n-c, k) / C(n, k) with n = k samples per task here, i.e. the share
of tasks solved at least once in k samples.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlkit.errors import ConfigError
from rlkit.rollout import Trajectory, rollout
from rlkit.tasks import training_sampler
from rlkit.types import EnvSpec


def evaluate(
    env_spec: EnvSpec,
    policy: Any,
    engine: Any,
    seeds: list[int],
    sampling: Any,
    policy_version: int,
    batch_size: int = 64,
    pass_k: int = 0,
    pass_k_sampling: Any = None,
) -> tuple[dict[str, float], list[dict[str, Any]], list[Trajectory]]:
    """Greedy (or ``sampling``) rollouts, one per task seed.

    Returns:
        (metrics, per_task, trajectories): metrics eval/{success_rate, num_tasks, mean_turns,
        parse_failures, mean_tokens, distinct_outputs[, pass@k]} (distinct_outputs: the number of
        distinct per-task action-text sequences divided by the number of tasks, in (0, 1]);
        per_task rows {seed, success, turns, parse_failures, actions} in seed order; the
        trajectories (for sample tables).
    """
    trajs: list[Trajectory] = []
    for i in range(0, len(seeds), batch_size):
        trajs += rollout(env_spec, policy, engine, seeds[i : i + batch_size], 1, sampling, policy_version)
    n = max(len(trajs), 1)
    per_task = [
        {
            "seed": t.episode.seed,
            "success": bool(t.episode.success),
            "turns": len(t.episode.turns),
            "parse_failures": t.episode.parse_failures,
            "actions": [turn.action_text for turn in t.episode.turns],
        }
        for t in trajs
    ]
    metrics = {
        "eval/success_rate": sum(r["success"] for r in per_task) / n,
        "eval/num_tasks": float(len(per_task)),
        "eval/mean_turns": sum(r["turns"] for r in per_task) / n,
        "eval/parse_failures": sum(r["parse_failures"] for r in per_task) / n,
        "eval/mean_tokens": sum(t.num_policy_tokens for t in trajs) / n,
        # distinct action sequences / tasks: a policy that ignores its observation (one answer per
        # start corner, say) scores near 0 here whatever its success rate
        "eval/distinct_outputs": len({tuple(r["actions"]) for r in per_task}) / n,
    }
    if pass_k > 0:
        samp = replace(pass_k_sampling or sampling)
        solved = 0
        for i in range(0, len(seeds), max(batch_size // pass_k, 1)):
            chunk = seeds[i : i + max(batch_size // pass_k, 1)]
            group = rollout(env_spec, policy, engine, chunk, pass_k, samp, policy_version)
            for g in range(len(chunk)):
                solved += any(t.episode.success for t in group[g * pass_k : (g + 1) * pass_k])
        metrics[f"eval/pass@{pass_k}"] = solved / max(len(seeds), 1)
    return metrics, per_task, trajs


def write_outcomes(path: Path, eval_set: str, step: int, metrics: dict[str, float], per_task: list[dict[str, Any]]) -> None:
    """Per-task outcomes as JSON, so two runs can be compared task by task."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"eval_set": eval_set, "step": step, "metrics": metrics, "tasks": per_task}, indent=1))


def task_sets(env_spec: Any, eval_cfg: Any, seed: int, pool: int | None) -> tuple[list[int], list[int]]:
    """A run's evaluation tasks: ``eval.num_tasks`` of the env's fixed set (None: all of it), and the trained-on
    ones for ``eval.seen_tasks``: the first N distinct seeds of the run's training stream (rlkit.tasks), so greedy
    success on them is success on tasks it trains on. Raises: ConfigError for a count out of range."""
    seeds, n_eval = env_spec.eval_seeds(), eval_cfg.num_tasks
    if n_eval is not None and not 1 <= n_eval <= len(seeds):
        raise ConfigError(f"eval.num_tasks={n_eval}: use null (all) or 1..{len(seeds)} "
                          f"(the size of {env_spec.eval_set_name})")
    n_seen = eval_cfg.seen_tasks or 0
    if n_seen and pool is not None and n_seen > pool:
        raise ConfigError(f"eval.seen_tasks={n_seen} is more than the train_tasks={pool} the run trains on; "
                          f"use eval.seen_tasks <= {pool}")
    seen: dict[int, None] = {}  # insertion-ordered set: the stream's order, a repeated seed once
    stream = training_sampler(env_spec, seed, pool_size=pool)
    while len(seen) < n_seen:
        seen.update(dict.fromkeys(stream.sample(n_seen - len(seen))))
    return (seeds[:n_eval] if n_eval else seeds), list(seen)
