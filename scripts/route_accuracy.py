#!/usr/bin/env python
"""How well a plan_map policy routes from its notes: the route after the true notes, on text alone.

Splits a plan_map policy's success into its two halves. Reading is what the grounding tables measure (the
walls, the agent, the goal in the picture); this measures the other half: given the exact notes of a maze
(its walls and both ends, as the policy would write them), is the route the policy writes next the solver's,
token for token (teacher-forced argmax, which is what greedy decoding writes after those notes)? Measured on
the 64 evaluation mazes (their walls are never in a route question) and on fresh route questions of each kind
(envs/visgym/routes.py).

    .venv/bin/python scripts/route_accuracy.py .cache/sft/<a plan_map warm start>
    .venv/bin/python scripts/route_accuracy.py <run>/checkpoints/step_000300     # or <run>/adapter

Prints one line per set: ``route from notes: <set> <exact>% of <n>``. About 10 s on one core.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import argparse
import json

import numpy as np
import torch

from envs.visgym.maze import VARIANT_SIZES, generate_maze
from envs.visgym.routes import ROUTE_KINDS, RouteExample, route_example
from envs.visgym.spec import VisGymMaze
from rlkit.grounding import GroundingItem, token_hits
from rlkit.sft import encode_route_example, route_prompt


def adapter_folder(path: Path) -> Path | None:
    """The LoRA adapter folder at ``path`` (a run's ``adapter/``) or inside it (a GRPO checkpoint's), else None."""
    for folder in (path, path / "adapter"):
        if (folder / "adapter_config.json").is_file():
            return folder
    return None


def recorded_base(adapter: Path) -> str | None:
    """The base checkpoint a run's adapter was trained on: rlkit_adapter.json's base_model, else peft's
    adapter_config.json base_model_name_or_path; None when neither names one."""
    for name, key in (("rlkit_adapter.json", "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            base = json.loads((adapter / name).read_text()).get(key)
        except (OSError, ValueError):
            continue
        if base:
            return str(base)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a full checkpoint folder (a warm start), a GRPO checkpoint folder or a run's "
                                      "LoRA adapter folder")
    p.add_argument("--base", default=None, help="the base checkpoint under a LoRA adapter (default: the base_model its "
                                                "rlkit_adapter.json records, the run's warm start)")
    p.add_argument("--variant", default="small", choices=sorted(VARIANT_SIZES))
    p.add_argument("--fresh", type=int, default=256, help="fresh route questions per kind (0 = none)")
    a = p.parse_args()
    torch.set_num_threads(1)
    from rlkit.policy import load_policy

    adapter = adapter_folder(Path(a.checkpoint))
    if adapter is not None:
        base = a.base or recorded_base(adapter)
        if base is None:
            p.error(f"{adapter} holds a LoRA adapter that names no base checkpoint: name it with --base")
        if not Path(base).is_dir():
            p.error(f"the adapter's base checkpoint {base} is not here (another machine's or a moved cache?): name "
                    "it with --base")
        policy = load_policy(name="route_accuracy", path=base, device="cpu", lora={"enabled": False})
        from peft import PeftModel

        policy.model = PeftModel.from_pretrained(policy.model, str(adapter))
    else:
        policy = load_policy(name="route_accuracy", path=a.checkpoint, device="cpu", lora={"enabled": False})
    env = VisGymMaze(variant=a.variant, mode="plan", parser="plan_map", max_turns=17 if a.variant == "small" else 18)
    prompt = route_prompt(env, policy)
    size = VARIANT_SIZES[a.variant]

    def exact(examples: list[RouteExample]) -> float:
        items = [GroundingItem(encode_route_example(policy, prompt, ex), "route", False, 0) for ex in examples]
        return float(np.mean([all(h) for h in token_hits(policy, items)]))

    fmt_eval = []
    for seed in env.eval_seeds():
        maze_map, start, goal = generate_maze(seed, size)
        text = env.demonstration(seed)[0]
        cut = text.index("<answer>")
        fmt_eval.append(RouteExample("eval", text[:cut], text[cut:], maze_map.astype(np.uint8).tobytes()))
    print(f"route from notes: {env.eval_set.name} {exact(fmt_eval):.1%} of {len(fmt_eval)}")
    rng = np.random.default_rng(12345)
    held = frozenset(k[:-4] for k in env.eval_set.layouts())  # as in training: no evaluation maze's walls
    for kind in ROUTE_KINDS if a.fresh else ():
        drawn = [route_example(size, rng, held, budget=env.action_budget, kinds=(kind,)) for _ in range(a.fresh)]
        print(f"route from notes: fresh {kind} {exact(drawn):.1%} of {len(drawn)}")


if __name__ == "__main__":
    main()
