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

#: How many candidate answers ``answer_prior`` replays (the most frequent ones).
PRIOR_CANDIDATES = 8


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


def answer_prior(env_spec: EnvSpec, seeds: list[int], answers: list[list[str]],
                 top: int = PRIOR_CANDIDATES) -> tuple[float, list[str] | None]:
    """The answer prior of a task set: the best success rate one fixed answer reaches when it is given to every task
    of ``seeds`` without looking at it, over the ``top`` most frequent of ``answers``.

    What a policy that ignores its observation can score: with 4 colours drawn evenly it is about 25-30% on 64
    tasks; with 7x7 maze routes, where few tasks share an answer, 12.5% (4 of 32 training mazes). A success rate is evidence of
    reading only above it (the same question ``control=fixed_image`` answers for a GRPO run, asked here of one
    checkpoint without training a control).

    Args:
        env_spec: the env. seeds: the tasks (N seeds). answers: candidate answers, each the action texts of one
            episode, one per policy turn (a policy's greedy outputs, the solver's demonstrations); an answer is
            replayed turn by turn on a fresh episode of every seed, and the episode ends at its first ``done`` or
            when the answer runs out (then it counts as unsolved unless the env says ``success()``).
        top: how many distinct answers to try, the most frequent first (ties: first seen first).

    Returns:
        (prior, answer): the best success rate in [0, 1] and the answer that reached it (None for no answers).
        Costs ``top * N`` episodes of env steps, no policy forward.
    """
    counts: dict[tuple[str, ...], int] = {}
    for a in answers:
        counts[tuple(a)] = counts.get(tuple(a), 0) + 1
    best, best_answer = 0.0, None
    env = env_spec.make()
    for cand in sorted(counts, key=lambda k: -counts[k])[:top]:
        solved = 0
        for seed in seeds:
            env.reset(seed)
            for text in cand:
                if env.step(text).done:
                    break
            solved += bool(env.success())
        rate = solved / max(len(seeds), 1)
        if best_answer is None or rate > best:
            best, best_answer = rate, list(cand)
    return best, best_answer


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
