"""algorithm.route_coef: route questions on text in the GRPO update (rlkit.update, rlkit.backends.native)."""

import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from envs.visgym.spec import VisGymMaze
from rlkit.backends.native import NativeRun
from rlkit.config import AlgorithmConfig
from rlkit.sft import encode_route_example, route_mix_problem, route_prompt
from tests.core.test_demo_loss import _nll_grad
from tests.core.test_rollout_update import _batch
from tests.core.test_shared_prefix_update import _update_grad


def _map_env():
    return VisGymMaze(variant="small", mode="plan", parser="plan_map", max_turns=17, wall_move="fail")


def _routes(policy, env, n, seed=0):
    prompt, rng = route_prompt(env, policy), np.random.default_rng(seed)
    return [encode_route_example(policy, prompt, env.route_example(rng)) for _ in range(n)]


def test_route_term_adds_coef_times_the_route_questions_gradient(policy, plan_env):
    trajs, adv = _batch(policy, plan_env)
    routes = _routes(policy, _map_env(), 3)
    nll, g_route = _nll_grad(policy, routes)
    base = dict(micro_batch_size=4, max_grad_norm=1e9)
    _, g_rl, _ = _update_grad(policy, trajs, adv, AlgorithmConfig(**base))
    m, g_both, _ = _update_grad(policy, trajs, adv, AlgorithmConfig(route_coef=0.5, **base), route_questions=routes)
    assert torch.allclose(g_both, g_rl + 0.5 * g_route, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(g_both, g_rl, atol=1e-6, rtol=1e-4)  # the term is not negligible here
    assert m["route/nll"] == pytest.approx(nll, rel=1e-5) and m["policy/optimizer_steps"] == 1.0
    # route_coef 0 (the default): route questions handed in change nothing
    m0, g0, _ = _update_grad(policy, trajs, adv, AlgorithmConfig(**base), route_questions=routes)
    assert torch.equal(g0, g_rl) and "route/nll" not in m0


def test_route_term_steps_alone_when_no_group_has_signal(policy, plan_env):
    trajs, _ = _batch(policy, plan_env, seeds=(11,), g=2)
    zero = torch.zeros(len(trajs))
    routes = _routes(policy, _map_env(), 2, seed=1)
    cfg = AlgorithmConfig(route_coef=1.0, filter_zero_variance_groups=True, max_grad_norm=1e9)
    m, g, _ = _update_grad(policy, trajs, zero, cfg, route_questions=routes)
    assert torch.allclose(g, _nll_grad(policy, routes)[1], atol=1e-6, rtol=1e-4) and "route/nll" in m
    assert _update_grad(policy, trajs, zero, cfg)[0] == {"policy/skipped": 1.0}


def _run_stub(policy, env, coef, batch=4, seed=3):
    run = types.SimpleNamespace(algo=AlgorithmConfig(route_coef=coef, route_batch=batch), env_spec=env, policy=policy,
                                cfg=OmegaConf.create({"seed": seed}))
    return lambda step: NativeRun._route_questions(run, step)


def test_each_step_draws_its_own_route_questions_the_same_on_a_rerun(policy):
    env = _map_env()
    questions = _run_stub(policy, env, 0.3)
    first, again, second = questions(1), _run_stub(policy, env, 0.3)(1), questions(2)
    assert len(first) == 4 and all(not t.image_inputs for t in first)
    assert [t.input_ids for t in first] == [t.input_ids for t in again]  # a resumed run trains on what it would have
    texts = {tuple(t.input_ids) for t in first + second}
    assert len(texts) == 8  # a fresh maze each question, each step
    assert _run_stub(policy, env, 0.0)(1) is None


def test_route_term_is_refused_with_the_fix_where_there_are_no_notes():
    plan = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    problem = route_mix_problem(plan, 0.3, "algorithm.route_coef")
    assert "algorithm.route_coef=0.3" in problem and "env.parser=plan_map" in problem and "algorithm.route_coef=0" in problem
    assert route_mix_problem(_map_env(), 0.3, "algorithm.route_coef") is None
    assert route_mix_problem(plan, 0.0, "algorithm.route_coef") is None


def test_every_native_backend_accepts_the_term(tmp_path):
    from rlkit.backends.ray_native import RayNativeRun
    from rlkit.distributed.runtime import RaySettings
    from tests.core.test_sft_start_from_env import _cfg

    cfg = _cfg(tmp_path, "env.parser=plan_map", "algorithm.route_coef=0.3")
    run = RayNativeRun.__new__(RayNativeRun)  # its __init__ reads Ray settings; _validate needs only NativeRun's
    NativeRun.__init__(run, cfg)
    run.settings = RaySettings(strategy="ddp", num_workers=2)
    run._validate()  # the ranks split the questions like the demonstrations (rlkit.distributed.update)
    NativeRun(cfg)._validate()


def test_setup_refuses_the_term_without_notes_before_any_build(tmp_path):
    from rlkit.run import ConfigError
    from tests.core.test_sft_start_from_env import _cfg

    run = NativeRun(_cfg(tmp_path, "algorithm.route_coef=0.3"))  # the smoke writes env.parser=plan
    with pytest.raises(ConfigError, match=r"algorithm.route_coef=0.3 teaches the route after plan_map's notes"):
        run.setup()
    assert not (tmp_path / "cache" / "sft").exists() and not (tmp_path / "cache" / "grounding").exists()
