"""rlkit's side of tests/vllm/test_vllm_rollout.py: ``rollout.engine=vllm``'s engine driven from rlkit's environment.

    .venv/bin/python -m tests.vllm.rlkit_vllm_engine OUT --sizes '{"text_hidden": 64, ...}'

The rollout engine of ``rollout.engine=vllm`` (rlkit.policy.vllm_engine.VllmEngine) lives where training runs (.venv,
transformers 5.8.1) and starts vLLM from .venv-vllm; so does this script, which measures it against rlkit's own engine
(TransformersEngine) on the same policy and writes the numbers to ``OUT/engine.json`` for the test to judge:

- a tiny Qwen3-VL (``--sizes``) with a trained-looking LoRA adapter on the language model and the vision side (random
  B, seeded; no patch embedding), exported and hot-swapped into vLLM as the training loop's sync does;
- greedy evaluation (rlkit.evaluation.evaluate) on 16 plan-mode 7x7 mazes with each engine: per-task outcomes, the
  trajectories' tokens and their logprobs, and the probe after the load;
- sampled rollouts (T=0.7, 4 tasks x G=4, rlkit.rollout.rollout): vLLM's sampling logprobs against the trainer's own
  recomputation of the same tokens (``policy.logprobs``: what the update's ratio compares them with), how many
  distinct samples a group has, and whether the same seed gives the same samples and another seed others;
- stop strings at T=1 (every completion checked against SamplingParams' semantics: a stop string ends the text, is
  completed by the last token, and occurs nowhere earlier);
- 3-turn interactive episodes, greedy, each engine: the whole conversations' tokens;
- the vLLM process after ``close``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlkit.distributed.reaper import (
    pid_alive,  # a zombie (exited, not reaped) counts as gone
)
from bench.common import randomise_lora_b
from tests.vllm.rlkit_reference import LM_VISION_TARGETS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", required=True, help="TinyVLSizes fields as JSON")
    args = ap.parse_args(argv)

    import torch

    from envs.visgym import VisGymMaze
    from rlkit.evaluation import evaluate
    from rlkit.policy import SamplingParams, load_policy, make_engine
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy
    from rlkit.policy.vllm_engine import VllmEngine, max_images_for
    from rlkit.rollout import rollout, to_tensor

    torch.set_num_threads(1)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    ckpt = build_tiny_policy(out / "ckpt", TinyVLSizes(**json.loads(args.sizes)), seed=0)
    pol = load_policy(name="engine_check", path=str(ckpt), dtype="float32", device="cpu",
                      lora={"rank": 8, "alpha": 16, "target_modules": LM_VISION_TARGETS}, seed=1)
    randomise_lora_b(pol.model, 1, 0.1)
    pol.save_adapter(out / "adapter", version=1)

    plan = VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")
    interactive = VisGymMaze(variant="small", mode="interactive", max_turns=3, parser="tuple")
    seeds = list(range(100, 116))
    stop = tuple(plan.stop_strings)
    rl = make_engine(pol)
    vl = VllmEngine(pol, max_images=max(max_images_for(plan), max_images_for(interactive)), log_path=out / "vllm.log")
    res: dict = {"startup_s": vl.wait_ready(), "versions": vl.versions, "pid": vl.pid}
    vl.load_adapter(out / "adapter")

    # greedy evaluation, both engines
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, seed=0, stop=stop)
    _, rows_r, tr_r = evaluate(plan, pol, rl, seeds, greedy, policy_version=1)
    _, rows_v, tr_v = evaluate(plan, pol, vl, seeds, greedy, policy_version=1)
    res["probe"] = vl.last_probe
    res["greedy_tasks"] = len(seeds)
    res["greedy_rows_equal"] = sum(a == b for a, b in zip(rows_r, rows_v))
    res["greedy_tokens_equal"] = sum(a.input_ids == b.input_ids for a, b in zip(tr_r, tr_v))
    res["greedy_max_logprob_diff"] = max(abs(x - y) for a, b in zip(tr_r, tr_v) if a.input_ids == b.input_ids
                                         for x, y in zip(a.sampling_logprobs, b.sampling_logprobs))
    res["greedy_answers"] = [r["actions"] for r in rows_v][:4]

    # sampled rollouts: vLLM's logprobs against the trainer's recomputation of the same tokens
    samp = SamplingParams(temperature=0.7, max_new_tokens=24, seed=5, stop=stop)
    trajs = rollout(plan, pol, vl, seeds[:4], 4, samp, policy_version=1)
    with torch.no_grad():
        lp, _ = pol.logprobs(trajs, temperature=0.7)
    mask = to_tensor([t.loss_mask for t in trajs], torch.float32).bool()
    old = to_tensor([t.sampling_logprobs for t in trajs], torch.float32)
    res["sampled_tokens"] = int(mask.sum())
    res["sampled_max_logprob_diff"] = float((lp - old).abs()[mask].max())
    res["sampled_distinct_per_group"] = [len({tuple(t.input_ids) for t in trajs[g * 4:(g + 1) * 4]}) for g in range(4)]
    again = rollout(plan, pol, vl, seeds[:4], 4, samp, policy_version=1)
    res["same_seed_same_samples"] = all(a.input_ids == b.input_ids for a, b in zip(trajs, again))
    other = rollout(plan, pol, vl, seeds[:4], 4, SamplingParams(temperature=0.7, max_new_tokens=24, seed=6, stop=stop),
                    policy_version=1)
    res["other_seed_differs"] = any(a.input_ids != b.input_ids for a, b in zip(trajs, other))

    # stop strings at T=1: each completion against SamplingParams' semantics
    chat = pol.chat
    stops = ("e", "a")
    prompts = [p for p in _first_prompts(plan, pol, seeds[:8])]
    comps = [c for per in vl.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, n=4, seed=3,
                                                              stop=stops)) for c in per]
    hits, violations = 0, []
    for c in comps:
        full = chat.decode(c.token_ids)
        if c.stop_reason is not None:
            hits += 1
            earlier = chat.decode(c.token_ids[:-1])
            ok = (c.finish_reason == "stop" and c.text.endswith(c.stop_reason) and full.startswith(c.text)
                  and not any(s in earlier for s in stops) and c.text.count(c.stop_reason) == 1)
        elif c.finish_reason == "stop":
            ok = c.token_ids[-1] == chat.im_end_id and not any(s in full for s in stops)
        else:
            ok = len(c.token_ids) == 24 and not any(s in full for s in stops) and c.text == full
        if not ok:
            violations.append({"tokens": c.token_ids, "text": c.text, "finish": c.finish_reason, "stop": c.stop_reason})
    res["stop_completions"], res["stop_hits"], res["stop_violations"] = len(comps), hits, violations

    # multi-turn: whole conversations, greedy
    greedy_i = SamplingParams(temperature=0.0, max_new_tokens=16, seed=0, stop=tuple(interactive.stop_strings))
    mt_r = rollout(interactive, pol, rl, seeds[:6], 1, greedy_i, policy_version=1)
    mt_v = rollout(interactive, pol, vl, seeds[:6], 1, greedy_i, policy_version=1)
    res["multiturn_equal"] = sum(a.input_ids == b.input_ids for a, b in zip(mt_r, mt_v))
    res["multiturn_episodes"] = len(mt_r)
    res["multiturn_turns"] = [len(t.episode.turns) for t in mt_v]
    res["multiturn_images"] = [len(t.image_inputs) for t in mt_v]

    vl.close()
    res["alive_after_close"] = pid_alive(res["pid"])
    (out / "engine.json").write_text(json.dumps(res))
    return 0


def _first_prompts(spec, pol, seeds):
    from rlkit.policy import PromptInput

    for seed in seeds:
        env = spec.make()
        obs = env.reset(seed)
        tt = pol.chat.user_turn(obs.text, obs.images, system=env.system_prompt, first=True)
        yield PromptInput(input_ids=tt.input_ids, images=list(obs.images), **pol.chat.concat_images(tt.image_inputs))


if __name__ == "__main__":
    sys.exit(main())
