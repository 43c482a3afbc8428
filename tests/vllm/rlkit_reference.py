"""rlkit's side of the vLLM parity tests, computed in rlkit's own environment (.venv, transformers 5.8.1).

    .venv/bin/python -m tests.vllm.rlkit_reference OUT --sizes '{"text_hidden": 64, ...}'

tests/vllm/test_vllm_parity.py runs this in a subprocess and compares vLLM (in .venv-vllm, transformers 5.19)
against what it writes, so the reference is the engine rlkit trains and evaluates with, in the versions it is
pinned to. It writes, under OUT:

- ``ckpt/``: a tiny Qwen3-VL checkpoint (``rlkit.policy.tiny.build_tiny_policy``, ``--sizes``), saved as rlkit
  saves checkpoints: what vLLM then loads.
- ``images/seed_<n>.png``: the opening observation's maze image of each task (vLLM gets these pixels).
- ``adapters/<name>/``: LoRA adapters exported with ``rlkit.policy.lora.save_adapter`` (what training exports),
  with random B matrices (seeded; A keeps peft's seeded init), so each adapter changes the outputs:
  ``lm_vision_v1`` and ``lm_vision_v2`` adapt the language model and the vision side (tower blocks, merger,
  deepstack mergers) but not the patch embedding (the target list rlkit.serve.vllm recommends);
  ``patch_embed`` adds ``proj``, which also matches the Conv3d ``visual.patch_embed.proj`` vLLM never applies.
- ``reference.json``: versions, the banned ids, and per task the chat text with one ``<|image_pad|>`` per image
  (``chat.render_user_turn``: what rlkit hands vLLM), rlkit's prompt ids (``chat.user_turn``: images expanded),
  and for the base and each adapter the greedy tokens and their float32 logprobs from rlkit's engine
  (``make_engine``; each adapter hot-swapped in with ``engine.load_adapter``, as the trainer syncs them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Tasks: the opening turn of these ``small`` plan-mode maze seeds.
SEEDS = list(range(100, 108))
#: LoRA targets with the vision side but without the patch embedding (no bare ``proj``).
LM_VISION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                     "qkv", "linear_fc1", "linear_fc2"]


def maze_spec():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="small", mode="plan", max_turns=17, parser="plan", wall_move="fail")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", required=True, help="TinyVLSizes fields as JSON")
    ap.add_argument("--max-new", type=int, default=12, help="greedy tokens per prompt")
    ap.add_argument("--b-std", type=float, default=0.1, help="std of the random LoRA B entries")
    args = ap.parse_args(argv)

    import importlib.metadata as md

    import torch
    import transformers

    from rlkit.policy import PromptInput, SamplingParams, load_policy, make_engine
    from rlkit.policy.lora import save_adapter
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy
    from bench.common import randomise_lora_b

    torch.set_num_threads(1)
    out = args.out
    (out / "images").mkdir(parents=True, exist_ok=True)
    ckpt = build_tiny_policy(out / "ckpt", TinyVLSizes(**json.loads(args.sizes)), seed=0)

    base = load_policy(name="reference", path=str(ckpt), dtype="float32", device="cpu", lora={"enabled": False})
    chat = base.chat
    spec = maze_spec()
    prompts, inputs = [], []
    for seed in SEEDS:
        env = spec.make()
        obs = env.reset(seed)
        system = env.system_prompt
        tt = chat.user_turn(obs.text, obs.images, system=system, first=True)
        text = chat.render_user_turn(chat.escape_text(obs.text), len(obs.images),
                                     system=chat.escape_text(system) if system else system, first=True)
        img = f"images/seed_{seed}.png"
        obs.images[0].save(out / img)
        prompts.append({"seed": seed, "text": text, "ids": list(tt.input_ids), "image": img})
        inputs.append(PromptInput(input_ids=tt.input_ids, **chat.concat_images(tt.image_inputs)))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new, n=1, seed=0)

    def run(engine) -> list[dict]:
        return [{"tokens": c[0].token_ids, "logprobs": c[0].logprobs} for c in engine.generate(inputs, greedy)]

    runs = {"base": run(make_engine(base))}
    adapters = {}
    for name, targets, seed in (("lm_vision_v1", LM_VISION_TARGETS, 1), ("lm_vision_v2", LM_VISION_TARGETS, 2),
                                ("patch_embed", LM_VISION_TARGETS + ["proj"], 3)):
        pol = load_policy(name="reference", path=str(ckpt), dtype="float32", device="cpu",
                          lora={"rank": 8, "alpha": 16, "target_modules": targets}, seed=seed)
        randomise_lora_b(pol.model, seed, args.b_std)
        path = out / "adapters" / name
        save_adapter(pol.model, path, version=seed, base_model=str(ckpt))
        adapters[name] = str(path)
    # one engine, the adapters hot-swapped in from their exported files (the trainer's weight sync)
    pol = load_policy(name="reference", path=str(ckpt), dtype="float32", device="cpu",
                      lora={"rank": 8, "alpha": 16, "target_modules": LM_VISION_TARGETS})
    engine = make_engine(pol)
    for name in ("lm_vision_v1", "lm_vision_v2"):
        engine.load_adapter(adapters[name])
        runs[name] = run(engine)
    pe = load_policy(name="reference", path=str(ckpt), dtype="float32", device="cpu",
                     lora={"rank": 8, "alpha": 16, "target_modules": LM_VISION_TARGETS + ["proj"]})
    pe_engine = make_engine(pe)
    pe_engine.load_adapter(adapters["patch_embed"])
    runs["patch_embed"] = run(pe_engine)

    ref = {
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "peft": md.version("peft")},
        "checkpoint": str(ckpt),
        "max_new": args.max_new,
        "vocab_size": int(base.model.get_output_embeddings().weight.shape[0]),
        "banned_token_ids": sorted(int(i) for i in base.banned_token_ids),
        "image_pad_id": int(chat.image_pad_id),
        "prompts": prompts,
        "adapters": adapters,
        "runs": runs,
    }
    (out / "reference.json").write_text(json.dumps(ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
