"""rlkit's env and reward through skyrl-gym, driven as SkyRL 0.3.0's VLM generator drives an env.

``SkyRLVLMGymGenerator.agent_loop`` (skyrl/train/generators/skyrl_vlm_generator.py), per trajectory:
the dataset row minus ``prompt``/``env_class`` is ``env_extras`` (PromptDataset.__getitem__);
``env_extras["max_turns"] = generator.max_turns``; ``env_config = getattr(cfg.environment.skyrl_gym,
env_class, {})``; ``env = skyrl_gym.make(env_class, env_config=env_config, extras=env_extras)``;
``conversation, _ = env.init(deepcopy(prompt))``; then until ``done``: generate text, ``env.step(text)``,
append the assistant message, extend the conversation with the observations when not done; finally
``env.get_metrics()`` and ``env.close()``. Env metrics are averaged per env class with
``aggregate_for_environment`` into ``environment/<key>`` (eval: ``eval/all/environment/success``).

This restatement is the default suite's fast check (Python 3.11, where SkyRL's generator does not import).
SkyRL's real generator runs the same rows in tests/skyrl312 (Python 3.12, ``bash scripts/test_skyrl.sh``),
and ``test_restated_loop_agrees_with_skyrl`` there checks that both give the same return, the same env
metrics and the same conversations in front of the model. What the restatement leaves out, on purpose
(each is tested against SkyRL's code in tests/skyrl312):

- tokens: SkyRL re-renders the whole conversation every turn (chat template + images, through the
  inference client), generates from token ids and appends the observation tokens with loss mask 0;
- rewards: SkyRL puts each step's reward on the last generated token of that turn (a turn that generated
  no token drops its reward; vLLM's ``min_tokens=1`` makes that impossible) and its GRPO sums the tokens'
  rewards, which is the sum this loop returns;
- the context budget: an episode whose next input exceeds ``generator.max_input_length`` stops with stop
  reason ``length`` before the env ends it, so ``rlkit-rewarded`` scores it 0;
- concurrency: SkyRL runs ``init``/``step``/``close`` in a thread pool (``environment.skyrl_gym
  .max_env_workers``), many episodes at once;
- rows: SkyRL reads them with the ``datasets`` library (Arrow), here a JSON round trip; it writes
  ``max_turns`` into the batch's extras dict in place (it shows up in the eval dumps), here a copy.
"""

import copy
import json

import pytest
import skyrl_gym
from omegaconf import OmegaConf
from skyrl_gym.metrics import aggregate_for_environment

from envs.visgym import VisGymMaze
from rlkit.backends.skyrl import REWARDED_ENV_ID, SkyRLBackend
from rlkit.backends.skyrl.data import dataset_rows
from rlkit.backends.skyrl.gym_env import RewardError, register

from .conftest import compose_cfg


def _rows(overrides):
    cfg = compose_cfg(["experiment=hyperpod_visgym", "steps=1", *overrides])
    settings = {k: v for k, v in OmegaConf.to_container(cfg.backend, resolve=True).items() if k != "_target_"}
    job = SkyRLBackend(**settings).compile(cfg)
    train, evals = dataset_rows(job)
    # as the `datasets` library hands them over after a JSON-lines round trip
    return job, [json.loads(json.dumps(r)) for r in train], [json.loads(json.dumps(r)) for r in evals]


def _env_config(env_class, gym_cfg=None):
    """``getattr(cfg.environment.skyrl_gym, env_class, {})``: the run's section, as SkyRL reads it (a mapping
    here); falls back to SkyRL's defaults."""
    if gym_cfg is not None:
        return dict(gym_cfg.get(env_class, {}))
    try:
        from skyrl.train.config import SkyRLGymConfig
    except ImportError:
        return {}
    return getattr(SkyRLGymConfig(), env_class, dict())


def agent_loop(row, max_turns, policy, gym_cfg=None):
    """SkyRLVLMGymGenerator.agent_loop's env protocol (model replaced by ``policy(conversation, turn)``);
    ``gym_cfg``: the compiled job's ``environment.skyrl_gym`` section."""
    row = dict(row)
    prompt = row.pop("prompt")
    env_class = row.pop("env_class")
    env_extras = dict(row)
    env_extras["max_turns"] = max_turns
    env = skyrl_gym.make(env_class, env_config=_env_config(env_class, gym_cfg), extras=env_extras)
    conversation = copy.deepcopy(prompt)
    conversation, _ = env.init(conversation)
    per_step_rewards, done, turn = [], False, 0
    while not done:
        gen_text = policy(conversation, turn)
        out = env.step(gen_text)
        new_obs, step_reward, done = out["observations"], out["reward"], out["done"]
        conversation.append({"role": "assistant", "content": gen_text})
        per_step_rewards.append(step_reward)
        if not done:
            conversation.extend(new_obs)
        turn += 1
    metrics = env.get_metrics()
    env.close()
    return sum(per_step_rewards), per_step_rewards, metrics, conversation


def _solver(seed, spec):
    demo = spec.demonstration(seed)
    return lambda conversation, turn: demo[turn]


def _broken(conversation, turn):
    return "Hmm, the blue dot should probably go around the wall somehow."


def _spec(job):
    return VisGymMaze(**job.task["env"])


def test_solver_gets_reward_one_and_success():
    register()
    job, _, evals = _rows([])
    spec = _spec(job)
    seed = next(s for s in job.eval_seeds if len(spec.demonstration(s)) <= job.max_turns)
    total, steps, metrics, conversation = agent_loop(evals[seed], job.max_turns, _solver(seed, spec))
    assert total == 1.0 and steps[-1] == 1.0 and all(r == 0.0 for r in steps[:-1])
    assert metrics["success"] == 1.0 and metrics["reward"] == 1.0 and metrics["reward/maze_exit"] == 1.0
    assert metrics["parse_failures"] == 0 and metrics["turns"] == len(spec.demonstration(seed))
    # the env replaced the placeholder prompt: system instructions, then the maze image + text
    assert conversation[0]["role"] == "system" and conversation[1]["content"][0]["type"] == "image_url"
    assert conversation[-1]["role"] == "assistant"


def test_broken_outputs_get_zero_and_end_at_the_turn_budget():
    register()
    job, _, evals = _rows([])
    total, steps, metrics, conversation = agent_loop(evals[0], job.max_turns, _broken)
    assert total == 0.0 and len(steps) == job.max_turns == 18
    assert metrics["success"] == 0.0 and metrics["reward"] == 0.0 and metrics["parse_failures"] == 18
    assert sum(m["role"] == "assistant" for m in conversation) == 18


def test_stopping_off_the_goal_gets_zero():
    register()
    job, train, _ = _rows([])
    total, steps, metrics, _ = agent_loop(train[0], job.max_turns, lambda c, t: "('stop', 'stop')")
    assert total == 0.0 and len(steps) == 1 and metrics["success"] == 0.0


def test_configured_reward_is_what_grpo_sees():
    """reward=maze_exit_format: 0.8 exit + 0.2 share of parsed turns (not the env's own reward)."""
    register()
    job, _, evals = _rows(["reward=maze_exit_format"])
    spec = _spec(job)
    seed = next(s for s in job.eval_seeds if len(spec.demonstration(s)) <= job.max_turns)
    solved, *_ = agent_loop(evals[seed], job.max_turns, _solver(seed, spec))
    broken, *_ = agent_loop(evals[seed], job.max_turns, _broken)
    stopped, _, metrics, _ = agent_loop(evals[seed], job.max_turns, lambda c, t: "('stop', 'stop')")
    assert solved == pytest.approx(1.0) and broken == pytest.approx(0.0) and stopped == pytest.approx(0.2)
    assert metrics["reward/format"] == pytest.approx(1.0) and metrics["reward/maze_exit"] == 0.0


def test_eval_success_metric_as_skyrl_aggregates_it():
    register()
    job, _, evals = _rows([])
    spec = _spec(job)
    solvable = [s for s in job.eval_seeds[:8] if len(spec.demonstration(s)) <= job.max_turns]
    per_episode = [agent_loop(evals[s], job.max_turns, _solver(s, spec))[2] for s in solvable]
    per_episode.append(agent_loop(evals[63], job.max_turns, _broken)[2])
    agg = aggregate_for_environment(REWARDED_ENV_ID, per_episode)
    assert agg["success"] == pytest.approx(len(solvable) / (len(solvable) + 1))


def test_single_turn_plan_mode():
    register()
    job, _, evals = _rows(["env=visgym", "env.max_turns=18"])
    assert job.max_turns == 1
    spec = _spec(job)
    total, steps, metrics, _ = agent_loop(evals[3], 1, _solver(3, spec))
    assert (total, len(steps), metrics["success"]) == (1.0, 1, 1.0)


def test_generator_turn_budget_must_match_the_env():
    register()
    job, _, evals = _rows([])
    assert job.max_turns == 18
    with pytest.raises(ValueError, match="max_turns"):
        agent_loop(evals[0], 15, _broken)


def test_row_without_task_spec_is_a_clear_error():
    register()
    with pytest.raises(ValueError, match="rlkit_task"):
        skyrl_gym.make(REWARDED_ENV_ID, env_config={}, extras={"seed": 1, "max_turns": 15})


def test_failing_reward_names_reward_and_seed():
    register()
    job, _, evals = _rows([])
    row = dict(evals[2])
    task = json.loads(row["rlkit_task"])
    task["reward"] = {"_target_": "rewards.ShapedDistance", "partial_credit": 0.5}
    task["env"]["max_turns"] = 15
    row["rlkit_task"] = json.dumps(task)
    total, *_ = agent_loop(row, 15, _broken)  # shaped: partial credit from BFS progress, no error
    assert 0.0 <= total < 1.0
    task["reward"] = {"_target_": "builtins.len"}  # not a reward: raises on the episode
    row["rlkit_task"] = json.dumps(task)
    with pytest.raises(RewardError, match="builtins.len.*seed 2"):
        agent_loop(row, 15, lambda c, t: "('stop', 'stop')")
