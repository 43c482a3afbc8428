"""A multi-turn GRPO step against a plan-mode step, with and without KV reuse across turns.

    python -m bench.bench_multiturn                          # tiny_vl conf sizes, 4 tasks x 4, 6 turns
    python -m bench.bench_multiturn --turns 2 4 6 --reps 3 # several episode lengths
    python -m bench.bench_multiturn --sizes issue15          # issue 15's model sizes (bench_update.py)

Workload (issue 15): a fresh tiny policy (random weights, LoRA as in the config) on VisGym
maze_2d/easy, ``--tasks`` training mazes x ``--group`` samples, temperature 1, rollout.max_new_tokens
tokens per turn. The random policy never writes a parsable action, so every interactive episode uses
all of its turns. One GRPO step = rollout + reward (maze_exit) + group advantages + rlkit.update.grpo_update
(conf/algorithm/grpo.yaml, shared-prefix update on; SGD with lr 0, so every round samples from the same
weights and the variants see the same kind of episodes). Variants, in alternating order each round:

- plan:           conf/env/visgym.yaml (one turn: the maze in, the whole route out);
- T turns cached: conf/env/visgym_interactive.yaml with max_turns T, the engine's reuse_kv on (each
                  episode's KV cache kept, only the new user turn prefilled);
- T turns prefill: the same with reuse_kv off (the whole conversation re-prefilled every turn).

The first --warmup rounds are not timed; medians over --reps rounds. Per-turn rollout times are the
engine calls of each turn (all episodes of the step together). One torch thread unless --threads.

Then the floor of that ratio under this workload: T turns decode T times what the plan turn decodes, and the
update computes (its token positions / the plan update's) times the plan update's work (each group's
common prefix counted once, as the shared-prefix update runs it):
``floor: T x plan rollout + U x plan update (...) = F s = Fx plan``.
Last line: ``multi-turn: T-turn step X s vs plan Y s = Rx (re-prefill: X' s = R'x)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from bench.common import ROOT, tiny_policy
from envs.visgym import VisGymMaze
from rewards import MazeExit
from rlkit.algorithms.grpo import group_advantages
from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams, TransformersEngine
from rlkit.rollout import rollout
from rlkit.update import grpo_update


class TimedEngine:
    """Wraps an engine; records (seconds, prefilled tokens, cached tokens) of each call (= one turn)."""

    def __init__(self, engine) -> None:
        self.engine, self.reuse_kv, self.calls = engine, engine.reuse_kv, []

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        st = self.engine.last_stats
        self.calls.append((time.perf_counter() - t0, st.prompt_tokens, st.extra.get("cached_tokens", 0)))
        return out

    def generate(self, prompts, sampling):
        return self._timed(self.engine.generate, prompts, sampling)

    def generate_cached(self, prompts, sampling, states=None):
        return self._timed(self.engine.generate_cached, prompts, sampling, states)


def update_tokens(trajs, group: int) -> int:
    """Token positions the shared-prefix update computes: each group's common token prefix once, every
    member's own suffix (groups of ``group`` contiguous trajectories). A lower bound on its work: the
    image check and the micro-batch cuts can only make it compute more."""
    total = 0
    for k in range(0, len(trajs), group):
        ids = [t.input_ids for t in trajs[k : k + group]]
        common = 0
        while all(len(x) > common for x in ids) and len({x[common] for x in ids}) == 1:
            common += 1
        total += common + sum(len(x) - common for x in ids)
    return total


def grpo_step(policy, engine, env, seeds, group, sampling, algo, opt, reward, round_: int) -> dict:
    """One GRPO step; returns its timings (seconds) and per-turn engine calls."""
    timed = TimedEngine(engine)
    t0 = time.perf_counter()
    trajs = rollout(env, policy, timed, seeds, group, sampling, policy_version=0)
    t1 = time.perf_counter()
    rewards = torch.tensor([reward(t.episode).total for t in trajs], dtype=torch.float32)  # [B*G]
    adv = group_advantages(rewards, group, algo.norm_adv_by_std, algo.adv_eps)  # [B*G]
    grpo_update(policy, opt, trajs, adv, algo, temperature=sampling.temperature,
                generator=torch.Generator().manual_seed(round_))
    t2 = time.perf_counter()
    return {
        "step": t2 - t0, "rollout": t1 - t0, "update": t2 - t1, "turns": timed.calls,
        "mean_turns": sum(len(t.episode.turns) for t in trajs) / len(trajs),
        "mean_len": sum(len(t.input_ids) for t in trajs) / len(trajs),
        "update_tokens": update_tokens(trajs, group),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", choices=["conf", "issue15"], default="conf", help="tiny policy sizes")
    ap.add_argument("--turns", type=int, nargs="+", default=[6], help="interactive episode lengths (turns)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per step (B)")
    ap.add_argument("--group", type=int, default=4, help="samples per task (G)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: conf/train.yaml rollout)")
    ap.add_argument("--no-prefill-baseline", action="store_true", help="skip the re-prefill variants")
    ap.add_argument("--reps", type=int, default=3, help="timed rounds (each runs every variant)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--cache-dir", default=None, help="tiny checkpoint cache (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train_yaml = OmegaConf.load(ROOT / "conf" / "train.yaml")
    max_new = args.max_new_tokens or int(train_yaml.rollout.max_new_tokens)
    algo_yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "algorithm" / "grpo.yaml"))
    algo = AlgorithmConfig(**algo_yaml)

    policy = tiny_policy(args)
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    reward = MazeExit()
    seeds = [1000 + i for i in range(args.tasks)]
    plan_yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "visgym.yaml"))
    inter_yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "visgym_interactive.yaml"))
    for d in (plan_yaml, inter_yaml):
        d.pop("_target_")
    variants = {"plan": (VisGymMaze(**plan_yaml), True)}
    for t in args.turns:
        variants[f"{t} turns cached"] = (VisGymMaze(**{**inter_yaml, "max_turns": t}), True)
        if not args.no_prefill_baseline:
            variants[f"{t} turns prefill"] = (VisGymMaze(**{**inter_yaml, "max_turns": t}), False)
    engines = {True: TransformersEngine(policy, reuse_kv=True), False: TransformersEngine(policy, reuse_kv=False)}
    n = policy.num_parameters()
    print(f"policy: {args.sizes} sizes, {n['total']:,} params (LoRA trainable {n['trainable']:,}); "
          f"{args.tasks} tasks x {args.group} samples, {max_new} new tokens per turn, micro-batch "
          f"{algo.micro_batch_size}, shared_prefix {algo.shared_prefix}, {args.threads} thread(s)")

    results: dict[str, list[dict]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(args.warmup + args.reps):
        order = names if r % 2 == 0 else names[::-1]
        sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=r)
        for name in order:
            env, reuse = variants[name]
            res = grpo_step(policy, engines[reuse], env, seeds, args.group, sampling, algo, opt, reward, r)
            if r >= args.warmup:
                results[name].append(res)
        print(f"round {r}{' (warm-up)' if r < args.warmup else ''}: "
              + ", ".join(f"{k} {results[k][-1]['step'] if r >= args.warmup else float('nan'):.2f} s" for k in names),
              flush=True)

    med = {k: {f: statistics.median(x[f] for x in v)
               for f in ("step", "rollout", "update", "mean_turns", "mean_len", "update_tokens")}
           for k, v in results.items()}
    print(f"{'variant':<18} {'step s':>7} {'rollout s':>9} {'update s':>8} {'turns':>5} {'seq len':>7}  per-turn rollout s (prefilled+cached tokens)")
    for k, m in med.items():
        calls = results[k]
        per_turn = [statistics.median(c["turns"][i][0] for c in calls) for i in range(min(len(c["turns"]) for c in calls))]
        toks = calls[0]["turns"]
        turns_s = " ".join(f"{s:.2f}({p}+{c})" for s, (_, p, c) in zip(per_turn, toks))
        print(f"{k:<18} {m['step']:>7.2f} {m['rollout']:>9.2f} {m['update']:>8.2f} {m['mean_turns']:>5.1f} {m['mean_len']:>7.0f}  {turns_s}")
    plan = med["plan"]["step"]
    for t in args.turns:
        cached = med[f"{t} turns cached"]["step"]
        # what no engine can go below: t turns decode t times the plan turn's tokens, and an update whose
        # cost is linear in tokens costs (its tokens / the plan update's) plan updates
        ratio = med[f"{t} turns cached"]["update_tokens"] / med["plan"]["update_tokens"]
        floor = t * med["plan"]["rollout"] + ratio * med["plan"]["update"]
        print(f"floor: {t} x plan rollout + {ratio:.1f} x plan update (its tokens: {med[f'{t} turns cached']['update_tokens']:.0f}"
              f" vs {med['plan']['update_tokens']:.0f}) = {floor:.2f} s = {floor / plan:.1f}x plan")
        line = f"multi-turn: {t}-turn step {cached:.2f} s vs plan {plan:.2f} s = {cached / plan:.1f}x"
        if not args.no_prefill_baseline:
            pre = med[f"{t} turns prefill"]["step"]
            line += f" (re-prefill: {pre:.2f} s = {pre / plan:.1f}x)"
        print(line)


if __name__ == "__main__":
    main()
