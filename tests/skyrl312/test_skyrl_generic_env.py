"""A second env on backend=skyrl with no adapter of its own: shapes through rlkit's one skyrl-gym adapter over the
env protocol (rlkit.backends.skyrl.env_adapter, ``rlkit-env``), run by SkyRL 0.3.0's own dataset, generator input,
VLM generator and evaluate (CPU, Python 3.12), as test_skyrl_generator.py runs VisGym.

experiment=hyperpod_visgym with env=shapes and reward=exact_answer: one turn, one picture, the env's stop string
``</answer>`` in SkyRL's sampling params, the rlkit reward on the last generated token.
"""

from __future__ import annotations

import asyncio

import pytest

from envs.shapes import COLOURS, ShapesEnv
from rlkit.backends.skyrl import SPEC_ENV_ID
from rlkit.backends.skyrl.backend import SUCCESS_METRIC, read_eval_success
from rlkit.backends.skyrl.gym_env import register

from .conftest import ScriptedClient, require_skyrl_312

pytestmark = pytest.mark.skyrl312
require_skyrl_312()

from skyrl.train.generators.skyrl_vlm_generator import SkyRLVLMGymGenerator  # noqa: E402

from .test_skyrl_generator import _dataset, _generate, _runs  # noqa: E402

SHAPES = ["env=shapes", "~env.max_turns", "reward=exact_answer"]


def _wrong(spec, seed):
    right = spec.demonstration(seed)[0]
    return next(f"<answer>{c}</answer>" for c in COLOURS if f">{c}<" not in right)


def _policy(ds, spec, behaviours):
    def policy(session, turn, conversation):
        uid, rep = session.rsplit("_", 1)
        seed = int(ds[int(uid)][2]["seed"])
        return spec.demonstration(seed)[0] if behaviours[int(rep)] == "solve" else _wrong(spec, seed)
    return policy


def test_shapes_compiles_to_the_generic_adapter(skyrl_case):
    case = skyrl_case([*SHAPES, "eval.num_tasks=8"])
    job = case.job
    assert job.task["env_id"] == SPEC_ENV_ID and job.task["target"] == "envs.shapes.ShapesEnv"
    assert job.max_turns == 1 == case.cfg.generator.max_turns
    assert list(case.cfg.generator.sampling_params.stop) == ["</answer>"]


def test_shapes_group_through_skyrls_generator(skyrl_case, processor, vllm_mm_serde):
    """G=2 on 3 tasks: a solver and a wrong colour each; rewards, metrics, one image and one turn per episode."""
    case = skyrl_case([*SHAPES, "eval.num_tasks=8"])
    job = case.job
    spec = ShapesEnv(**job.task["env"])
    ds, _ = _dataset(case, job.eval_data)
    client = ScriptedClient(processor, _policy(ds, spec, ["solve", "wrong"]))
    out, gen_input, uids, _ = _generate(case, client, job.eval_data, [0, 1, 2], 2)

    assert out["stop_reasons"] == ["stop"] * 6
    assert [sum(r) for r in out["rewards"]] == [1.0, 0.0] * 3
    assert [len(_runs(m)) for m in out["loss_masks"]] == [1] * 6
    assert [int(g.shape[0]) for g in out["image_grid_thw"]] == [1] * 6
    for k, m in enumerate(out["env_metrics"]):
        solved = float(k % 2 == 0)
        assert m["success"] == solved and m["reward"] == solved and m["turns"] == 1 and m["parse_failures"] == 0
    first = spec.make()
    # task 0's first repetition (session "<uid>_<repetition>"), whatever order SkyRL's async episodes ran in
    conversation = client.session_calls("0_0")[0]["conversation"]
    assert conversation[0] == {"role": "system", "content": first.system_prompt}
    assert conversation[1]["content"][1]["text"] == first.reset(int(ds[0][2]["seed"])).text
    assert out["rollout_metrics"]["environment/success"] == pytest.approx(0.5)


def test_shapes_evaluate_writes_what_rlkit_reads(skyrl_case, processor, vllm_mm_serde):
    """SkyRL's ``evaluate`` on the shapes eval set (greedy, one sample per task); rlkit reads the success back."""
    from skyrl.train.evaluate import evaluate
    from skyrl.train.utils.trainer_utils import build_dataloader

    case = skyrl_case([*SHAPES, "eval.num_tasks=4"])
    job = case.job
    spec = ShapesEnv(**job.task["env"])
    register()
    ds, tokenizer = _dataset(case, job.eval_data)
    seeds = [int(ds[i][2]["seed"]) for i in range(len(ds))]
    solved = seeds[:3]

    def policy(session, turn, conversation):
        seed = seeds[int(session.rsplit("_", 1)[0])]
        return spec.demonstration(seed)[0] if seed in solved else _wrong(spec, seed)

    client = ScriptedClient(processor, policy)
    generator = SkyRLVLMGymGenerator(case.cfg.generator, case.cfg.environment.skyrl_gym, client, tokenizer)
    metrics = asyncio.run(evaluate(build_dataloader(case.cfg, ds, is_train=False), generator, case.cfg, 0, tokenizer))
    assert metrics[SUCCESS_METRIC] == pytest.approx(3 / 4)
    assert read_eval_success(job, 0) == pytest.approx(3 / 4)
