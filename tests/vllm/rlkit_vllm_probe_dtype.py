"""rlkit's side of tests/vllm/test_vllm_rollout.py::test_probe_runs_in_bf16: vLLM's CPU engine against rlkit's own
engine on one policy in ``--dtype`` (bfloat16 by default), to measure how far two bf16 kernels' greedy answers part
and to check that the probe (rlkit.serve.vllm_probe, tolerance logprob_atol_for(dtype)) accepts the same weights and
refuses other ones.

    .venv/bin/python -m tests.vllm.rlkit_vllm_probe_dtype OUT --sizes '{"text_hidden": 64, ...}' [--dtype bfloat16]

Writes ``OUT/probe.json``: for 16 greedy plan-mode prompts (24 tokens each) with a trained-looking adapter loaded,
how many answers are equal token for token, the largest |logprob difference| over the positions before the first
parting (rlkit's and vLLM's logprobs of the same tokens), and at each parting rlkit's margin (its top choice's
logprob minus its teacher-forced logprob of vLLM's pick) and the two engines' top-choice logprobs; the probe's
result after the load; and whether the probe refuses vLLM running the base while rlkit runs the adapter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import randomise_lora_b
from tests.vllm.rlkit_reference import LM_VISION_TARGETS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", required=True, help="TinyVLSizes fields as JSON")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)

    import torch

    from envs.visgym import VisGymMaze
    from rlkit.policy import PromptInput, SamplingParams, load_policy, make_engine
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy
    from rlkit.policy.vllm_engine import VllmEngine, max_images_for
    from rlkit.serve.vllm_probe import ProbeMismatch

    torch.set_num_threads(1)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    ckpt = build_tiny_policy(out / "ckpt", TinyVLSizes(**json.loads(args.sizes)), seed=0)
    pol = load_policy(name="probe_check", path=str(ckpt), dtype=args.dtype, device="cpu",
                      lora={"rank": 8, "alpha": 16, "target_modules": LM_VISION_TARGETS}, seed=1)
    randomise_lora_b(pol.model, 1, 0.1)
    pol.save_adapter(out / "adapter", version=1)

    env = VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")
    prompts = []
    for seed in range(100, 116):
        e = env.make()
        obs = e.reset(seed)
        tt = pol.chat.user_turn(obs.text, obs.images, system=e.system_prompt, first=True)
        prompts.append(PromptInput(input_ids=tt.input_ids, images=list(obs.images), **pol.chat.concat_images(tt.image_inputs)))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, seed=0)
    rl = make_engine(pol)
    vl = VllmEngine(pol, max_images=max_images_for(env), log_path=out / "vllm.log")
    res: dict = {"dtype": args.dtype, "startup_s": vl.wait_ready()}
    vl.load_adapter(out / "adapter")
    got_v = [c[0] for c in vl.generate(prompts, greedy)]  # the probe runs here, after the load
    res["probe"] = vl.last_probe
    got_r = [c[0] for c in rl.generate(prompts, greedy)]
    equal, shared_diff, partings = 0, 0.0, []
    for p, a, b in zip(prompts, got_r, got_v):
        k = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        n = min(len(a.token_ids), len(b.token_ids)) if k is None else k
        shared_diff = max([shared_diff] + [abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n])])
        if k is None and len(a.token_ids) == len(b.token_ids):
            equal += 1
            continue
        if k is None:
            continue
        rescored = vl._rescore(p, list(b.token_ids))
        partings.append({"position": k, "rlkit_margin": a.logprobs[k] - rescored[k],
                         "rlkit_top": a.logprobs[k], "vllm_top": b.logprobs[k]})
    res.update(prompts=len(prompts), tokens_equal=equal, shared_prefix_max_logprob_diff=shared_diff, partings=partings)

    # the probe refuses vLLM sampling other weights: vLLM back on the base while rlkit keeps the adapter
    vl._lora_id, vl._probe_pending = None, True
    try:
        vl.generate(prompts[:1], greedy)
        res["refuses_base_for_adapter"] = False
    except ProbeMismatch as e:
        res["refuses_base_for_adapter"] = True
        res["refusal"] = str(e)[:300]
    vl.close()
    (out / "probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
