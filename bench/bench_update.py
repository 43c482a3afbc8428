"""Time of the GRPO update's forward + backward: the shared-prefix forward vs the full-sequence forward.

    python -m bench.bench_update                     # conf/policy/tiny_vl.yaml sizes, 8 groups x 8 samples
    python -m bench.bench_update --sizes issue15     # issue 15's workload: text 256 x 4 layers (head_dim 64),
                                                     # vision 128 x 2, patch 16, 49 image tokens
    python -m bench.bench_update --reps 7 --micro-batch 16 --kl-coef 0.1
    python -m bench.bench_update --compare dedup --distinct 3   # identical samples run once, or each of them
    python -m bench.bench_update --compare micro_batch --micro-batch-b 64   # 16 sequences a forward, or 64

Workload: ``--groups`` maze-like prompts (system + one maze image + text, built with the policy's chat
format), ``--group-size`` samples each; every sample is the prompt plus a random completion of
``--new-tokens`` +- 25% tokens and <|im_end|> (loss mask 1 on the completion). Old logprobs are the
full-forward logprobs of the same weights (on-policy). One call of rlkit.update.grpo_update (one
optimizer step: SGD with lr 0, so the weights stay fixed across repetitions) with
``algorithm.shared_prefix`` false vs true, otherwise the same AlgorithmConfig (conf/algorithm/grpo.yaml's
micro-batch size unless --micro-batch). One torch thread unless --threads. The two variants alternate
(which one goes first alternates too); the first --warmup rounds are not timed; medians are reported,
plus the largest difference of the update's loss between the variants (equal within float32 rounding).

Last line: ``update: shared-prefix X s vs plain Y s (Zx)``.

``--compare dedup``: each group's samples are ``--distinct`` different completions, repeated (a nearly
deterministic policy: the CPU default's 8 samples a group were 2-4 distinct plans); the variants are
``algorithm.dedup_identical_samples`` true vs false, both with the shared-prefix forward. Last line:
``update: dedup X s vs every sample Y s (Zx; D of N samples distinct)``.

``--compare micro_batch``: the variants are ``algorithm.micro_batch_size`` = ``--micro-batch`` vs
``--micro-batch-b``, both with the shared-prefix forward and dedup (the same gradient, summed in another order).
Last line: ``update: micro-batch B X s vs micro-batch A Y s (Zx)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from bench.common import PROMPT, ROOT, SYSTEM, maze_image, tiny_policy
from rlkit.config import AlgorithmConfig
from rlkit.rollout import Trajectory
from rlkit.update import grpo_update


def build_batch(policy, args) -> tuple[list[Trajectory], torch.Tensor]:
    """groups x group_size trajectories (prompt + random completion), on-policy old logprobs, advantages [N]."""
    chat = policy.chat
    gen = torch.Generator().manual_seed(0)
    allowed = torch.tensor(sorted(set(range(len(policy.tokenizer))) - set(policy.banned_token_ids) - {chat.im_end_id}))
    trajs = []
    for g in range(args.groups):
        turn = chat.user_turn(PROMPT, [maze_image(g)], system=SYSTEM, first=True)
        completions: list[list[int]] = []
        for k in range(args.group_size):
            if args.distinct and k >= args.distinct:  # a repeat of one of the group's distinct completions
                completions.append(completions[k % args.distinct])
                continue
            spread = max(args.new_tokens // 4, 0)
            n = args.new_tokens + int(torch.randint(-spread, spread + 1, (1,), generator=gen))
            completions.append(allowed[torch.randint(len(allowed), (max(n, 1),), generator=gen)].tolist()
                               + [chat.im_end_id])
        for completion in completions:
            ids = list(turn.input_ids) + completion
            mask = [0] * len(turn.input_ids) + [1] * len(completion)
            trajs.append(Trajectory(ids, mask, [0.0] * len(ids), list(turn.image_inputs), episode=None, group=g,
                                    policy_version=0))
    with torch.no_grad():
        for start in range(0, len(trajs), args.micro_batch):
            chunk = trajs[start : start + args.micro_batch]
            lp, _ = policy.logprobs(chunk, with_entropy=False)  # [n, T]
            for t, row in zip(chunk, lp):
                t.sampling_logprobs = [v if m else 0.0 for v, m in zip(row[: len(t.input_ids)].tolist(), t.loss_mask)]
    firsts: dict[tuple, Trajectory] = {}
    for t in trajs:  # a repeat carries its original's logprobs, as a sampler's identical samples do
        t.sampling_logprobs = firsts.setdefault((t.group, tuple(t.input_ids)), t).sampling_logprobs
    adv = torch.randn(len(trajs), generator=gen)  # [N]
    for k, t in enumerate(trajs):  # one reward an episode: identical samples get the same advantage
        adv[k] = adv[trajs.index(firsts[(t.group, tuple(t.input_ids))])]
    return trajs, adv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", choices=["conf", "issue15"], default="conf", help="tiny policy sizes")
    ap.add_argument("--groups", type=int, default=8, help="tasks (groups) in the batch")
    ap.add_argument("--group-size", type=int, default=8, help="samples per group (G)")
    ap.add_argument("--new-tokens", type=int, default=24, help="mean completion length (tokens)")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch (default: conf/algorithm/grpo.yaml)")
    ap.add_argument("--loss-reduction", default="token_mean")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (each runs both variants)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--cache-dir", default=None, help="tiny checkpoint cache (default: a temp dir)")
    ap.add_argument("--compare", choices=["shared_prefix", "dedup", "micro_batch"], default="shared_prefix",
                    help="the two variants timed: shared-prefix vs plain forward, identical samples run once vs each, "
                         "or micro-batch --micro-batch vs --micro-batch-b")
    ap.add_argument("--micro-batch-b", type=int, default=64, help="--compare micro_batch: the other micro-batch size")
    ap.add_argument("--distinct", type=int, default=0,
                    help="distinct completions a group (the rest repeat them); 0 = every sample distinct")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    algo_yaml = OmegaConf.load(ROOT / "conf" / "algorithm" / "grpo.yaml")
    if args.micro_batch is None:
        args.micro_batch = int(algo_yaml.micro_batch_size)

    policy = tiny_policy(args)
    trajs, adv = build_batch(policy, args)
    n = policy.num_parameters()
    prompt_len = trajs[0].loss_mask.index(1)
    mean_len = sum(len(t.input_ids) for t in trajs) / len(trajs)
    print(f"policy: {args.sizes} sizes, {n['total']:,} params (LoRA trainable {n['trainable']:,}); "
          f"{args.groups} groups x {args.group_size} samples, prompt {prompt_len} tokens "
          f"({trajs[0].input_ids.count(policy.chat.image_pad_id)} image tokens), mean length {mean_len:.0f}; "
          f"micro-batch {args.micro_batch}, {args.loss_reduction}, kl_coef {args.kl_coef}, {args.threads} thread(s)")

    params = policy.trainable_parameters()
    opt = torch.optim.SGD(params, lr=0.0)
    times: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, list[float]] = {False: [], True: []}
    dedup, micro = args.compare == "dedup", args.compare == "micro_batch"
    for r in range(args.warmup + args.reps):
        for shared in ((False, True) if r % 2 == 0 else (True, False)):  # True: the faster variant under test
            cfg = AlgorithmConfig(shared_prefix=shared or dedup or micro,
                                  dedup_identical_samples=shared if dedup else True,
                                  micro_batch_size=args.micro_batch_b if micro and shared else args.micro_batch,
                                  loss_reduction=args.loss_reduction, kl_coef=args.kl_coef, max_grad_norm=1e9)
            t0 = time.perf_counter()
            m = grpo_update(policy, opt, trajs, adv, cfg, temperature=1.0, generator=torch.Generator().manual_seed(r))
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                times[shared].append(dt)
                losses[shared].append(m["policy/loss"])
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    diff = max(abs(a - b) for a, b in zip(losses[False], losses[True]))
    fast, slow = (("dedup", "every sample") if dedup else
                  (f"micro-batch {args.micro_batch_b}", f"micro-batch {args.micro_batch}") if micro else
                  ("shared-prefix", "plain"))
    print(f"rounds: {slow} {', '.join(f'{t:.2f}' for t in times[False])} s; "
          f"{fast} {', '.join(f'{t:.2f}' for t in times[True])} s; max |loss difference| {diff:.2e}")
    tail = ""
    if dedup:
        from rlkit.update import identical_samples

        tail = f"; {len(identical_samples(trajs, list(range(len(trajs))), adv))} of {len(trajs)} samples distinct"
        print(f"update: dedup {shared:.2f} s vs every sample {plain:.2f} s ({plain / shared:.1f}x{tail})")
    else:
        print(f"update: {fast} {shared:.2f} s vs {slow} {plain:.2f} s ({plain / shared:.2f}x)")


if __name__ == "__main__":
    main()
