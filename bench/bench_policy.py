"""Throughput of the tiny policy on this machine: generation, training, model FLOPs, matmul peak, MFU.

    python -m bench.bench_policy                        # conf/policy/tiny_vl.yaml sizes, 1 thread
    python -m bench.bench_policy --threads 2 --prompts 16 --group 8 --new-tokens 32

What is measured (wall clock, best of --reps after a full-size warm-up call):
- generation: ``TransformersEngine.generate`` on ``--prompts`` maze-like prompts (system + one 225x225 maze
  image = 81 image tokens + text), ``--group`` samples each, exactly ``--new-tokens`` tokens per sample
  (<|im_end|> banned for the benchmark so every row runs the full length). Reports generated tokens/s,
  episodes/s (one episode = one sampled turn here), the same with per-row prefill (no prompt sharing), and
  transformers' ``generate`` on the same prompts as a reference.
- training: compute_logprobs forward + backward (sum of logprobs) over ``--prompts * --group`` sequences of
  prompt + ``--new-tokens`` tokens, LoRA as in the config. Tokens/s counts every position of every sequence.
- model FLOPs per token: 2 x (matmul parameters of the decoder incl. lm_head) + attention 4 x ctx x q_dim
  per layer, plus the vision tower's FLOPs per image spread over the sequence; fwd+bwd = 3 x fwd
  (the 6N rule; with LoRA the frozen weights' gradient is not needed, so this is an upper bound on work).
- peak: fp32 ``torch.matmul`` of two 2048x2048 matrices with the same thread count; MFU = achieved / peak.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import (PROMPT, SYSTEM, decoder_matmul_params, matmul_peak, maze_image, tiny_policy_kwargs,
                          vision_flops)
from rlkit.policy import PromptInput, SamplingParams, TransformersEngine, load_policy
from rlkit.policy.logprobs import sequence_batch


def flops_per_sequence(policy, seq_len: int, n_images: int, patches_per_image: int) -> float:
    """Forward FLOPs of one sequence of ``seq_len`` tokens with ``n_images`` images (causal attention)."""
    t = policy.hf_model.config.text_config
    q_dim = t.num_attention_heads * t.head_dim
    text = 2 * decoder_matmul_params(policy) * seq_len + t.num_hidden_layers * 4 * q_dim * seq_len * (seq_len + 1) / 2
    return text + n_images * vision_flops(policy, patches_per_image)


def bench(args) -> None:
    torch.set_num_threads(args.threads)
    policy = load_policy(**tiny_policy_kwargs(args.cache_dir))
    n = policy.num_parameters()
    print(f"tiny policy: vision {n['vision']:,} / text {n['text']:,} / total {n['total']:,} params "
          f"(LoRA trainable {n['trainable']:,}); threads {args.threads}")

    chat = policy.chat
    prompts, turns = [], []
    for i in range(args.prompts):
        tt = chat.user_turn(PROMPT, [maze_image(i)], system=SYSTEM, first=True)
        turns.append(tt)
        prompts.append(PromptInput(tt.input_ids, **chat.concat_images(tt.image_inputs)))
    prompt_len = len(prompts[0].input_ids)
    patches = int(prompts[0].pixel_values.shape[0])
    print(f"prompt: {prompt_len} tokens ({patches // 4} image tokens, {patches} patches per image)")

    # Every row generates exactly --new-tokens tokens: ban <|im_end|> for the benchmark only.
    policy.banned_token_ids = sorted(set(policy.banned_token_ids) | {chat.im_end_id})
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, n=args.group, seed=0)
    rows = args.prompts * args.group
    gen_tokens = rows * args.new_tokens
    for share in (True, False):
        eng = TransformersEngine(policy, max_batch_rows=rows, share_prefill=share)
        eng.generate(prompts, sp)  # warm-up at full size (allocator and kernels)
        dt, s = float("inf"), None
        for _ in range(args.reps):
            t = time.perf_counter()
            eng.generate(prompts, sp)
            if time.perf_counter() - t < dt:
                dt, s = time.perf_counter() - t, eng.last_stats
        label = "shared prefill" if share else "per-row prefill"
        print(f"generate ({label}): {rows} episodes x {args.new_tokens} tokens in {dt:.2f}s -> "
              f"{gen_tokens / dt:,.0f} tokens/s, {rows / dt:.1f} episodes/s "
              f"(prefill {s.prefill_s:.2f}s, decode {s.decode_s:.2f}s)")
        if share:
            gen_dt = dt

    if args.compare_hf:
        # Reference point: transformers' generate on the same prompts (it expands each prompt to its n
        # samples before the prefill, so every sample re-encodes the image and re-prefills the prompt).
        proc = policy.processor
        proc.tokenizer.padding_side = "left"
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        enc = proc(images=[maze_image(i) for i in range(args.prompts)], text=[text] * args.prompts, return_tensors="pt", padding=True)
        model = policy.model.eval()
        dt = float("inf")
        with torch.inference_mode():
            for _ in range(1 + args.reps):  # first call is the warm-up
                t = time.perf_counter()
                model.generate(**enc, do_sample=True, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                               num_return_sequences=args.group, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=chat.pad_id)
                dt = min(dt, time.perf_counter() - t)
        print(f"generate (transformers generate, reference): {gen_tokens / dt:,.0f} tokens/s, {rows / dt:.1f} episodes/s")

    seq_len = prompt_len + args.new_tokens
    fwd_seq = flops_per_sequence(policy, seq_len, 1, patches)
    fwd_tok = fwd_seq / seq_len
    # Generation work: one prefill per prompt (shared by its G samples) + G decode rows with growing context.
    cfg = policy.hf_model.config.text_config
    q_dim = cfg.num_attention_heads * cfg.head_dim
    per_tok_matmul = 2 * decoder_matmul_params(policy)
    gen_flops = args.prompts * flops_per_sequence(policy, prompt_len, 1, patches)
    for k in range(args.new_tokens):
        gen_flops += rows * (per_tok_matmul + cfg.num_hidden_layers * 4 * q_dim * (prompt_len + k + 1))

    seqs = []
    for i, tt in enumerate(turns):
        for g in range(args.group):
            tail = torch.randint(0, len(policy.tokenizer) - 8, (args.new_tokens,), generator=torch.Generator().manual_seed(i * 100 + g))
            seqs.append(PromptInput(tt.input_ids + tail.tolist(), **chat.concat_images(tt.image_inputs)))
    policy.model.train()
    micro = args.micro_batch
    batches = [sequence_batch(policy.model, seqs[i : i + micro]) for i in range(0, len(seqs), micro)]
    lp, _ = policy.logprobs(batches[0])  # warm-up
    lp.sum().backward()
    train_dt = float("inf")
    for _ in range(args.reps):
        t = time.perf_counter()
        for b in batches:
            lp, _ = policy.logprobs(b, with_entropy=False)
            lp.sum().backward()
        train_dt = min(train_dt, time.perf_counter() - t)
    train_tokens = len(seqs) * seq_len
    print(f"train fwd+bwd: {len(seqs)} sequences x {seq_len} tokens (micro-batch {micro}) in {train_dt:.2f}s -> "
          f"{train_tokens / train_dt:,.0f} tokens/s")

    peak = matmul_peak()
    gen_achieved = gen_flops / gen_dt
    train_achieved = 3 * fwd_seq * len(seqs) / train_dt
    print(f"model FLOPs/token: fwd {fwd_tok / 1e6:.2f} MFLOP (2 x {per_tok_matmul // 2:,} decoder matmul params = "
          f"{per_tok_matmul / 1e6:.2f} MFLOP + attention + vision), fwd+bwd {3 * fwd_tok / 1e6:.2f} MFLOP")
    print(f"fp32 matmul peak ({args.threads} thread(s), 2048^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"achieved: generation {gen_achieved / 1e9:.2f} GFLOP/s ({100 * gen_achieved / peak:.1f}% of peak), "
          f"training {train_achieved / 1e9:.2f} GFLOP/s ({100 * train_achieved / peak:.1f}% of peak; 6N convention, "
          f"with LoRA the frozen weights need no weight gradient, so the work done is ~2/3 of that)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts (tasks)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sample")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per training forward")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions after a warm-up (best is reported)")
    ap.add_argument("--cache-dir", default=None, help="tiny checkpoint cache (default: a temp dir)")
    ap.add_argument("--no-compare-hf", dest="compare_hf", action="store_false", help="skip the transformers generate reference")
    bench(ap.parse_args())


if __name__ == "__main__":
    main()
