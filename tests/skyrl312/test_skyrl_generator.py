"""SkyRL 0.3.0's own VLM generator runs rlkit's VisGym env, reward and datasets (CPU, Python 3.12).

The path is the trainer's: rlkit compiles experiment=hyperpod_visgym and writes its datasets; SkyRL's
``PromptDataset`` reads them, ``prepare_generator_input`` makes G samples per task with the vLLM sampling
params SkyRL derives from the compiled config, and ``SkyRLVLMGymGenerator.generate`` runs the episodes
through skyrl-gym (``rlkit-rewarded`` -> ``rlkit-env``, the one adapter over the env protocol) against a
scripted inference client (conftest.py). The restated loop of tests/backends/test_skyrl_gym_env.py is run on
the same rows and must agree with SkyRL's on rewards, metrics and the conversation the model saw.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from envs.visgym import VisGymMaze
from rlkit.backends.skyrl.backend import SUCCESS_METRIC, read_eval_success
from rlkit.backends.skyrl.gym_env import register
from tests.backends import test_skyrl_gym_env as restated

from .conftest import ScriptedClient

from .conftest import require_skyrl_312

pytestmark = pytest.mark.skyrl312
require_skyrl_312()

from skyrl.backends.skyrl_train.utils.ppo_utils import compute_grpo_outcome_advantage  # noqa: E402
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend  # noqa: E402
from skyrl.train.dataset import PromptDataset  # noqa: E402
from skyrl.train.generators.skyrl_vlm_generator import SkyRLVLMGymGenerator  # noqa: E402
from skyrl.train.generators.utils import prepare_generator_input  # noqa: E402
from skyrl.utils.tok import get_tokenizer  # noqa: E402

BROKEN = "Hmm, the blue dot should probably go around the wall somehow."


def _dataset(case, path):
    tokenizer = get_tokenizer(case.cfg.trainer.policy.model.path, trust_remote_code=True, padding_side="left")
    ds = PromptDataset(datasets=[path], tokenizer=tokenizer, max_prompt_length=case.cfg.trainer.max_prompt_length,
                       num_workers=1)
    return ds, tokenizer


def _generate(case, client, path, indices, n_samples):
    """SkyRL's trainer path for one batch: dataset rows -> generator input -> SkyRLVLMGymGenerator.generate."""
    register()
    ds, tokenizer = _dataset(case, path)
    batch = ds.collate_fn([ds[i] for i in indices])
    sampling = get_sampling_params_for_backend(case.cfg.generator.inference_engine.backend,
                                               case.cfg.generator.sampling_params)
    gen_input, uids = prepare_generator_input(batch, n_samples, sampling, case.cfg.environment.env_class, "train", 1)
    generator = SkyRLVLMGymGenerator(case.cfg.generator, case.cfg.environment.skyrl_gym, client, tokenizer)
    out = asyncio.run(generator.generate(gen_input, disable_tqdm=True))
    return out, gen_input, uids, ds


def _solvable(job, spec, n):
    return [i for i, s in enumerate(job.eval_seeds) if len(spec.demonstration(s)) <= job.max_turns][:n]


def _script(ds, spec, behaviours):
    """policy(session, turn, conversation): repetition r of task uid plays behaviours[r]."""
    def policy(session, turn, conversation):
        uid, rep = session.rsplit("_", 1)
        seed = int(ds[int(uid)][2]["seed"])
        kind = behaviours[int(rep)]
        if kind == "solve":
            return spec.demonstration(seed)[turn]
        if kind == "stop":
            return "('stop', 'stop')"
        return BROKEN
    return policy


def _runs(mask):
    """[(start, end)] of the runs of 1 in a loss mask (one run per generated turn)."""
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_multi_turn_group_with_images(skyrl_case, processor, vllm_mm_serde):
    """Interactive mazes (18 turns), G=3: a solver, a broken policy and an early stop for each of 2 tasks."""
    case = skyrl_case(["eval.num_tasks=8"])
    job = case.job
    spec = VisGymMaze(**job.task["env"])
    assert case.cfg.generator.vision_language_generator and case.cfg.generator.max_turns == job.max_turns == 18
    ds, _ = _dataset(case, job.eval_data)
    tasks = _solvable(job, spec, 2)
    client = ScriptedClient(processor, _script(ds, spec, ["solve", "broken", "stop"]))
    out, gen_input, uids, ds = _generate(case, client, job.eval_data, tasks, 3)

    assert len(out["response_ids"]) == 6 and out["stop_reasons"] == ["stop"] * 6
    assert sorted(client.finished) == sorted(f"{t}_{r}" for t in tasks for r in range(3))
    for k, (uid, extras) in enumerate(zip(uids, gen_input["env_extras"])):
        kind = ["solve", "broken", "stop"][k % 3]
        seed = int(extras["seed"])
        n_turns = {"solve": len(spec.demonstration(seed)), "broken": job.max_turns, "stop": 1}[kind]
        mask, rewards, ids = out["loss_masks"][k], out["rewards"][k], out["response_ids"][k]
        # token-level rewards: the rlkit reward, on the last generated token of the last turn, 0 elsewhere
        assert isinstance(rewards, list) and len(rewards) == len(ids) == len(mask)
        runs = _runs(mask)
        assert len(runs) == n_turns
        expected = 1.0 if kind == "solve" else 0.0
        assert sum(rewards) == expected
        if expected:
            assert rewards.index(expected) == runs[-1][1] - 1
        # prompt + response extends the last rendered input token for token (SkyRL's prefix assumption holds
        # for this chat template and env), and the images are those of that input: one per observation
        session = f"{uid}_{k % 3}"
        calls = client.session_calls(session)
        assert len(calls) == n_turns
        last_input = calls[-1]["prompt_ids"]
        assert (out["prompt_token_ids"][k] + ids)[: len(last_input)] == last_input
        n_images = sum(p.get("type") == "image_url" for m in calls[-1]["conversation"] if isinstance(m["content"], list)
                       for p in m["content"])
        assert int(out["image_grid_thw"][k].shape[0]) == n_images == n_turns
        assert out["pixel_values"][k].shape[0] == int(out["image_grid_thw"][k].prod(dim=1).sum())
        # env metrics come back per episode, with the reward and its components
        m = out["env_metrics"][k]
        assert m["success"] == expected and m["reward"] == expected and m["turns"] == n_turns
        assert m["parse_failures"] == (job.max_turns if kind == "broken" else 0)
        assert session in client.finished
    # one inference call per turn; the sampling params are the compiled rollout ones (vLLM form)
    assert len(client.calls) == sum(len(_runs(m)) for m in out["loss_masks"])
    assert client.calls[0]["sampling"]["temperature"] == case.cfg.generator.sampling_params.temperature
    assert all(c["has_mm"] for c in client.calls)
    assert out["rollout_metrics"]["environment/success"] == pytest.approx(1 / 3)
    assert out["rollout_metrics"]["environment/reward"] == pytest.approx(1 / 3)
    # SkyRL's GRPO estimator sums each trajectory's token rewards: within each group the solver is above
    # the mean, the others below, on their generated tokens only
    width = max(len(r) for r in out["rewards"])
    rewards = torch.tensor([r + [0.0] * (width - len(r)) for r in out["rewards"]])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in out["loss_masks"]], dtype=torch.float32)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(uids),
                                            grpo_norm_by_std=case.cfg.trainer.algorithm.grpo_norm_by_std)
    per_seq = [float(adv[k][mask[k].bool()].unique().item()) for k in range(6)]
    assert all(a > 0 for a in per_seq[0::3]) and all(a < 0 for a in per_seq[1::3] + per_seq[2::3])
    assert bool((adv[mask == 0] == 0).all())


def test_restated_loop_agrees_with_skyrl(skyrl_case, processor, vllm_mm_serde):
    """The restated loop (tests/backends/test_skyrl_gym_env.py) on the same rows and actions as SkyRL's
    generator: same return, same env metrics, same messages in front of the model at every turn."""
    case = skyrl_case(["eval.num_tasks=8", "reward=maze_exit_format"])
    job = case.job
    spec = VisGymMaze(**job.task["env"])
    ds, _ = _dataset(case, job.eval_data)
    tasks = _solvable(job, spec, 1) + [5]
    behaviours = ["solve", "broken", "stop"]
    client = ScriptedClient(processor, _script(ds, spec, behaviours))
    out, gen_input, uids, _ = _generate(case, client, job.eval_data, tasks, 3)
    rows = [json.loads(line) for line in open(job.eval_data)]
    for k, uid in enumerate(uids):
        row = rows[int(uid)]
        seed = row["seed"]
        kind = behaviours[k % 3]
        seen = []

        def policy(conversation, turn, kind=kind, seed=seed, seen=seen):
            seen.append(json.loads(json.dumps(conversation)))
            return {"solve": lambda: spec.demonstration(seed)[turn], "stop": lambda: "('stop', 'stop')",
                    "broken": lambda: BROKEN}[kind]()

        total, steps, metrics, _ = restated.agent_loop(row, job.max_turns, policy, job.config["environment"]["skyrl_gym"])
        assert total == pytest.approx(sum(out["rewards"][k]))
        assert metrics == out["env_metrics"][k]
        # the restated loop showed its policy exactly the conversations SkyRL rendered for the model
        assert seen == [c["conversation"] for c in client.session_calls(f"{uid}_{k % 3}")]


def test_single_turn_plan_mode(skyrl_case, processor, vllm_mm_serde):
    """env=visgym (plan mode): one image in, the whole route out, one turn; SkyRL's input budget is the
    prompt length there (backend.max_prompt_length)."""
    case = skyrl_case(["env=visgym", "env.max_turns=18", "eval.num_tasks=4"])  # 18 moves admit every maze
    job = case.job
    assert job.max_turns == 1 == case.cfg.generator.max_turns
    spec = VisGymMaze(**job.task["env"])
    ds, _ = _dataset(case, job.eval_data)
    client = ScriptedClient(processor, _script(ds, spec, ["solve", "broken"]))
    out, gen_input, uids, _ = _generate(case, client, job.eval_data, [0, 1], 2)
    assert out["stop_reasons"] == ["stop"] * 4
    assert [sum(r) for r in out["rewards"]] == [1.0, 0.0, 1.0, 0.0]
    assert [len(_runs(m)) for m in out["loss_masks"]] == [1] * 4
    assert [int(g.shape[0]) for g in out["image_grid_thw"]] == [1] * 4
    assert max(c["n_prompt"] for c in client.calls) <= case.cfg.generator.max_input_length


def test_context_over_max_input_length_ends_the_episode_with_reward_zero(skyrl_case, processor, vllm_mm_serde):
    """SkyRL stops an episode whose next input is longer than generator.max_input_length (stop reason
    "length"): the env never ends it, so rlkit-rewarded gives 0 even to a policy that was solving it."""
    case = skyrl_case(["eval.num_tasks=8"])
    job = case.job
    spec = VisGymMaze(**job.task["env"])
    ds, _ = _dataset(case, job.eval_data)
    (task,) = _solvable(job, spec, 1)
    first = ScriptedClient(processor, None).render(_first_messages(ds, task))
    case.cfg.generator.max_input_length = len(first["token_ids"]) + 1  # room for the first turn only
    client = ScriptedClient(processor, _script(ds, spec, ["solve"]))
    out, *_ = _generate(case, client, job.eval_data, [task], 1)
    assert out["stop_reasons"] == ["length"]
    assert sum(out["rewards"][0]) == 0.0 and len(client.calls) == 1
    assert out["env_metrics"][0]["reward"] == 0.0 and out["env_metrics"][0]["success"] == 0.0


def _first_messages(ds, index):
    import skyrl_gym

    register()
    prompt, env_class, extras, _ = ds[index]
    env = skyrl_gym.make(env_class, env_config={}, extras={**extras, "max_turns": 18})
    messages, _ = env.init(prompt)
    return messages


def test_skyrl_evaluate_writes_what_rlkit_reads(skyrl_case, processor, vllm_mm_serde):
    """SkyRL's own ``evaluate`` over the eval dataset (greedy, one sample per task) with the eval dumps on:
    rlkit's ``read_eval_success`` finds eval/all/environment/success in them."""
    from skyrl.train.evaluate import evaluate
    from skyrl.train.utils.trainer_utils import build_dataloader

    case = skyrl_case(["eval.num_tasks=4"])
    job = case.job
    spec = VisGymMaze(**job.task["env"])
    register()
    ds, tokenizer = _dataset(case, job.eval_data)
    seeds = [int(ds[i][2]["seed"]) for i in range(len(ds))]
    solved = [s for s in seeds if len(spec.demonstration(s)) <= job.max_turns][:2]

    def policy(session, turn, conversation):
        seed = seeds[int(session.rsplit("_", 1)[0])]
        return spec.demonstration(seed)[turn] if seed in solved else BROKEN

    client = ScriptedClient(processor, policy)
    generator = SkyRLVLMGymGenerator(case.cfg.generator, case.cfg.environment.skyrl_gym, client, tokenizer)
    assert case.cfg.trainer.dump_eval_results
    metrics = asyncio.run(evaluate(build_dataloader(case.cfg, ds, is_train=False), generator, case.cfg, 0, tokenizer))
    assert metrics[SUCCESS_METRIC] == pytest.approx(len(solved) / len(seeds))
    assert metrics[f"eval/{job.eval_set_name}/avg_score"] == pytest.approx(len(solved) / len(seeds))
    assert client.calls[0]["sampling"]["temperature"] == case.cfg.generator.eval_sampling_params.temperature
    assert read_eval_success(job, 0) == pytest.approx(len(solved) / len(seeds))
