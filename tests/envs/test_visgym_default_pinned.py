"""The default envs' GRPO-facing behaviour, pinned: what conf/env/visgym_small.yaml and conf/env/visgym.yaml give
training and evaluation must not change unless on purpose.

tests/envs/test_visgym_parity.py checks parsing and pixels against upstream VisGym; this checks what rlkit itself
decides for the two plan-mode configs: the training tasks drawn (rlkit.tasks.training_sampler over the env), which
seeds count as evaluation mazes, the system prompt and first user text, the first image's bytes, the solver's
demonstrations and the step() outputs (reward, done, info) for them and for a few wrong routes (a bump, a stop off the
goal, an unparsable output). Each is hashed per config in data/visgym_default_pinned.json; a failure names what
changed. Recorded at the commit that removed the dead-end env levers (route pass, plan_cells, room and loop
tasks) and checked equal to the code before it (its only difference: bumped plans no longer report
``unexecuted_from``, which only the removed algorithm.mask_unexecuted read).

A change on purpose (a new prompt text, say) also changes every warm start's key (rlkit's prompt_fingerprint);
re-record with ``python -m tests.envs.test_visgym_default_pinned`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).resolve().parent / "data" / "visgym_default_pinned.json"
CONFIGS = ("visgym_small", "visgym")
SEEDS = range(301)
#: Wrong routes stepped from every seed: bumps (into the border or a wall), a stop off the goal, unparsable text.
WRONG = ("<answer>up up up stop</answer>", "<answer>left down stop</answer>", "<answer>right right stop</answer>",
         "no route here")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _step(out) -> list:
    assert out.observation is None  # plan mode: one turn
    return [out.reward, out.done, out.info]


def record(name: str) -> dict[str, str]:
    """``{what: sha256 prefix}`` of config ``name``'s behaviour on task seeds 0..300 and 300 training draws."""
    from rlkit.tasks import training_sampler

    spec = instantiate(OmegaConf.load(ROOT / "conf" / "env" / f"{name}.yaml"))
    prompts, images, demos, steps, wrong = [], [], [], [], []
    for seed in SEEDS:
        env = spec.make()
        obs = env.reset(seed)
        prompts.append([env.system_prompt, obs.text, len(obs.images)])
        images.append([obs.images[0].mode, list(obs.images[0].size), hashlib.sha256(obs.images[0].tobytes()).hexdigest()])
        demo = spec.demonstration(seed)
        demos.append([demo, env.demonstration(seed)])
        steps.append([_step(env.step(text)) for text in demo] + [env.success()])
        for text in WRONG:
            env.reset(seed)
            wrong.append(_step(env.step(text)))
    drawn = training_sampler(spec, 0).sample(300)
    return {
        "spec": _digest([spec.max_turns, spec.action_budget, list(spec.stop_strings), spec.eval_set_name,
                         spec.eval_seeds(), repr(spec)]),
        "eval_flags": _digest([spec.is_eval_seed(s) for s in SEEDS]),
        "training_draws": _digest([drawn, training_sampler(spec, 5, pool_size=8).sample(40)]),
        "prompts": _digest(prompts),
        "images": _digest(images),
        "demonstrations": _digest(demos),
        "demonstration_steps": _digest(steps),
        "wrong_route_steps": _digest(wrong),
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_the_default_envs_behave_as_recorded(name):
    pinned = json.loads(PINNED.read_text())[name]
    now = record(name)
    changed = sorted(k for k in pinned if now.get(k) != pinned[k])
    assert not changed, (f"conf/env/{name}.yaml now gives other {changed} than recorded in {PINNED.name}; if on "
                         f"purpose, re-record (module docstring)")
    assert set(now) == set(pinned)


if __name__ == "__main__":
    PINNED.write_text(json.dumps({name: record(name) for name in CONFIGS}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
