"""How often consecutive turns of one episode repeat each other's tokens, position by position (issue 72).

    python -m bench.bench_turn_draws                  # tiny_vl conf sizes, random init, 8 tasks x 4, 6 turns, T=1

A random-init tiny policy (conf/policy/tiny_vl.yaml, LoRA as configured) plays conf/env/visgym_interactive.yaml
with ``--turns`` turns; its junk never parses, so every episode uses all of them. For each episode and each pair
of consecutive turns t, t+1 (t >= 1; turn 0 is the first call, shared by the G samples of a task), the share of
word positions k (the completions' whitespace-split words, as the issue counted them) where both turns wrote the
same word. Three ways to seed the engine calls, in one run:

- per turn:    rlkit.rollout as it is (turn t samples with rlkit.rollout.turn_seed(step seed, t));
- one seed:    every call of the rollout reseeded with the step's seed (rlkit before issue 72);
- fresh:       every call with fresh randomness (seed None): the chance level the other two are judged against.
"""

from __future__ import annotations

import argparse

import torch

import rlkit.rollout as rollout_mod
from bench.common import tiny_policy
from envs.visgym import VisGymMaze
from rlkit.policy import SamplingParams, TransformersEngine


def equal_words(trajs) -> tuple[int, int]:
    """(equal, compared) word positions over consecutive turns t, t+1 (t >= 1) of every episode."""
    equal = total = 0
    for t in trajs:
        words = [turn.action_text.split() for turn in t.episode.turns]
        for a, b in zip(words[1:], words[2:]):
            equal += sum(x == y for x, y in zip(a, b))
            total += min(len(a), len(b))
    return equal, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1_000_003)
    ap.add_argument("--sizes", default="conf", choices=["conf", "issue15"])
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    policy = tiny_policy(args)
    engine = TransformersEngine(policy)
    env = VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=args.turns)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=args.seed)
    seeds = list(range(1000, 1000 + args.tasks))
    real = rollout_mod.turn_seed
    variants = {"per turn": real, "one seed": lambda seed, turn: seed}
    for name, fn in variants.items():
        rollout_mod.turn_seed = fn
        try:
            trajs = rollout_mod.rollout(env, policy, engine, seeds, args.group, sampling, policy_version=0)
        finally:
            rollout_mod.turn_seed = real
        eq, n = equal_words(trajs)
        print(f"{name:9s}: {eq} of {n} word positions ({eq / max(n, 1):.1%}) equal in consecutive turns")
    trajs = rollout_mod.rollout(env, policy, engine, seeds, args.group, SamplingParams(temperature=1.0, max_new_tokens=12,
                                                                                     seed=None), policy_version=0)
    eq, n = equal_words(trajs)
    print(f"{'fresh':9s}: {eq} of {n} word positions ({eq / max(n, 1):.1%}) equal in consecutive turns (chance)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
