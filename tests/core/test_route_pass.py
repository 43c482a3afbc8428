"""env.route_context=text: the route written in a second pass of text alone (rlkit.rollout's route pass)."""

import pytest
import torch

from envs.visgym.routes import RouteExample
from envs.visgym.spec import VisGymMaze
from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams
from rlkit.policy.engine import Completion
from rlkit.rollout import CONTINUATION_GROUP, rollout, rollout_stats, with_continuations
from rlkit.sft import demonstration_nll, demonstration_trajectory, encode_route_example, route_prompt
from rlkit.update import mask_unexecuted
from tests.core.test_shared_prefix_update import _update_grad

SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=64, seed=0, stop=("</answer>",))
ROUTE_0 = "right right up up right right up up stop</answer>"  # 7x7 seed 0's route (tests/core/test_mask_unexecuted.py)


def _env(route_context="text"):
    return VisGymMaze(variant="small", mode="plan", parser="plan_map", max_turns=17, wall_move="fail",
                      route_context=route_context)


def _notes(env, seed=0):
    text = env.demonstration(seed)[0]
    return text[: text.index("<answer>")]


class ScriptedEngine:
    """Answers the prompts of each generate call with the next texts of ``script`` (one per prompt, ``sampling.n``
    copies each), ending each where its text ends with one of ``sampling.stop``; records every call."""

    def __init__(self, script, tokenizer):
        self.script, self.tokenizer, self.calls = list(script), tokenizer, []

    def generate(self, prompts, sampling):
        self.calls.append((prompts, sampling))
        out = []
        for _ in prompts:
            text = self.script.pop(0)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            stop = next((s for s in sampling.stop if text.endswith(s)), None)
            logps = [-0.5 - 0.01 * j for j in range(len(ids))]
            out.append([Completion(ids, logps, text, "stop" if stop else "length", stop) for _ in range(sampling.n)])
        return out


def test_the_route_is_written_in_a_text_context_after_the_policys_own_notes(policy):
    env, tok = _env(), policy.chat.tokenizer
    notes = _notes(env)
    wrong = "a#b#c#d#e#f#g#h#i#j#k#l# 5,1 to 1,5"  # other notes: the route is still read from them
    engine = ScriptedEngine([notes + "<answer>", wrong + "<answer>", ROUTE_0, "up stop</answer>"], tok)
    trajs = rollout(env, policy, engine, seeds=[0, 0], group_size=1, sampling=SAMPLE, policy_version=3)
    (first_prompts, first_sampling), (second_prompts, second_sampling) = engine.calls
    assert "<answer>" in first_sampling.stop and "</answer>" in first_sampling.stop  # the first pass ends at the opening
    assert first_prompts[0].pixel_values is not None  # the first pass sees the picture
    text_prompt = list(route_prompt(env, policy).input_ids)
    for prompt, first in zip(second_prompts, (notes, wrong)):
        assert prompt.pixel_values is None and prompt.image_grid_thw is None  # the second does not
        assert prompt.input_ids == text_prompt + list(tok(first + "<answer>", add_special_tokens=False)["input_ids"])
    assert second_sampling.n == 1 and second_sampling.seed != first_sampling.seed
    assert second_sampling.stop == ("</answer>",)  # the run's own stops: the opening is in its prompt

    solved, other = trajs[0], trajs[1]
    assert solved.episode.success and not other.episode.success
    assert solved.episode.turns[0].action_text == notes + "<answer>" + ROUTE_0  # the env acted on both passes joined
    first_ids = tok(notes + "<answer>", add_special_tokens=False)["input_ids"]
    route_ids = tok(ROUTE_0, add_special_tokens=False)["input_ids"]
    assert [i for i, m in zip(solved.input_ids, solved.loss_mask) if m] == first_ids
    cont = solved.continuation
    assert cont.image_inputs == [] and cont.episode is solved.episode and cont.policy_version == 3
    assert cont.input_ids[: len(text_prompt) + len(first_ids)] == text_prompt + first_ids
    assert [i for i, m in zip(cont.input_ids, cont.loss_mask) if m] == route_ids  # the loss is on the route only
    sampled = [lp for lp, m in zip(cont.sampling_logprobs, cont.loss_mask) if m]
    assert sampled == pytest.approx([-0.5 - 0.01 * j for j in range(len(route_ids))])
    assert rollout_stats(trajs)["generate/mean_tokens"] == pytest.approx(
        (2 * len(first_ids) + len(route_ids) + len(tok("up stop</answer>", add_special_tokens=False)["input_ids"])) / 2)


def test_a_first_pass_without_the_opening_is_acted_on_alone(policy):
    env, tok = _env(), policy.chat.tokenizer
    one_pass = _notes(env) + "<answer>" + ROUTE_0  # it wrote its route in the first pass: no second pass for it
    engine = ScriptedEngine([one_pass], tok)
    trajs = rollout(env, policy, engine, seeds=[0], group_size=1,
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=64, seed=0, stop=("</answer>",)),
                    policy_version=0)
    assert len(engine.calls) == 1 and trajs[0].continuation is None
    assert trajs[0].episode.success  # as the one-pass rollout would have acted


def test_the_route_pass_is_off_by_default_and_needs_plan_map():
    assert _env("picture").route_context == "picture" and VisGymMaze(variant="small", mode="plan",
                                                                       parser="plan_map").route_context == "picture"
    with pytest.raises(ValueError, match="env.parser=plan_map"):
        VisGymMaze(variant="small", mode="plan", parser="plan", route_context="text")
    with pytest.raises(ValueError, match="route_context must be one of"):
        VisGymMaze(variant="small", mode="plan", parser="plan_map", route_context="notes")


def test_the_update_trains_both_passes_with_the_episodes_advantage(policy):
    env, tok = _env(), policy.chat.tokenizer
    notes = _notes(env)
    engine = ScriptedEngine([notes + "<answer>", ROUTE_0, "up up stop</answer>"], tok)
    trajs = rollout(env, policy, engine, seeds=[0], group_size=2, sampling=SAMPLE, policy_version=0)
    adv = torch.tensor([1.0, -1.0])
    flat, flat_adv = with_continuations(trajs, adv)
    assert len(flat) == 4 and all(t.continuation is None for t in flat)
    assert flat_adv.tolist() == [1.0, -1.0, 1.0, -1.0]
    assert [t.group for t in flat] == [0, 0, CONTINUATION_GROUP, CONTINUATION_GROUP]
    assert with_continuations(flat, flat_adv)[0] is flat  # nothing left to expand
    cfg = AlgorithmConfig(micro_batch_size=4, max_grad_norm=1e9)
    _, g_pair, _ = _update_grad(policy, trajs, adv, cfg)
    _, g_flat, _ = _update_grad(policy, flat, flat_adv, cfg)
    assert torch.allclose(g_pair, g_flat, atol=1e-7, rtol=1e-5)  # the continuation is one more sequence
    _, g_first, _ = _update_grad(policy, flat[:2], adv, cfg)
    assert not torch.allclose(g_pair, g_first, atol=1e-6, rtol=1e-4)  # and its route tokens are trained on


def test_unexecuted_route_tokens_are_masked_in_the_continuation(policy):
    env, tok = _env(), policy.chat.tokenizer
    bump = "right right up up up right stop</answer>"  # the 5th move runs into a wall
    engine = ScriptedEngine([_notes(env) + "<answer>", bump], tok)
    (t,) = rollout(env, policy, engine, seeds=[0], group_size=1, sampling=SAMPLE, policy_version=0)
    first_mask, k = list(t.loss_mask), t.episode.turns[0].info["unexecuted_tokens"]
    assert k > 0
    assert mask_unexecuted([t]) == k and t.loss_mask == first_mask  # the notes keep their loss
    kept = [i for i, m in zip(t.continuation.input_ids, t.continuation.loss_mask) if m]
    assert tok.decode(kept) == "right right up up up"  # the route up to the move that hit the wall


def test_a_demonstration_is_the_notes_with_the_picture_and_the_route_question(policy):
    env, tok = _env(), policy.chat.tokenizer
    demo = demonstration_trajectory(env, policy, 0)
    notes, text = _notes(env), env.demonstration(0)[0]
    assert tok.decode([i for i, m in zip(demo.input_ids, demo.loss_mask) if m]) == notes + "<answer>"
    assert demo.image_inputs  # the first sequence has the picture
    question = encode_route_example(policy, route_prompt(env, policy), RouteExample("corner", notes, text[len(notes):], b""))
    assert demo.continuation.input_ids == question.input_ids and demo.continuation.loss_mask == question.loss_mask
    one_pass = demonstration_trajectory(_env("picture"), policy, 0)
    assert one_pass.continuation is None and tok.decode(
        [i for i, m in zip(one_pass.input_ids, one_pass.loss_mask) if m]).startswith(text)
    # the supervised loss covers both sequences: the mean over the notes' and the route's tokens
    both = demonstration_nll(policy, [demo]).item()
    n1, n2 = demo.num_policy_tokens, demo.continuation.num_policy_tokens
    parts = [demonstration_nll(policy, [d]).item() for d in with_continuations([demo])[0]]
    assert both == pytest.approx((parts[0] * n1 + parts[1] * n2) / (n1 + n2), rel=1e-4)


def test_the_ranks_update_splits_the_continuations_like_any_sequence(policy):
    from rlkit.distributed.update import plan_update

    env, tok = _env(), policy.chat.tokenizer
    engine = ScriptedEngine([_notes(env) + "<answer>", ROUTE_0, "up up stop</answer>"], tok)
    trajs = rollout(env, policy, engine, seeds=[0], group_size=2, sampling=SAMPLE, policy_version=0)
    demo = demonstration_trajectory(env, policy, 1)
    plan = plan_update(trajs, torch.tensor([1.0, -1.0]), AlgorithmConfig(demo_coef=0.3), 2,
                       torch.Generator().manual_seed(0), demonstrations=[demo])
    ran = {i: t for p in plan for s in p.steps for i in s.indices for t in [p.trajectories[i]]}
    assert sorted(ran) == [0, 1, 2, 3]  # both first passes and both continuations
    assert [bool(ran[i].image_inputs) for i in range(4)] == [True, True, False, False]
    assert {p.advantages[i] for p in plan for i in p.advantages if i in (0, 2)} == {1.0}
    demos = [d for p in plan for d in p.demonstrations]
    assert len(demos) == 2 and {bool(d.image_inputs) for d in demos} == {True, False}  # the demo's two sequences


@pytest.mark.parametrize("strategy,workers,refused", [("fsdp", 2, True), ("fsdp", 1, False), ("ddp", 2, False)])
def test_fsdp_ranks_and_skyrl_refuse_the_route_pass_with_the_fix(tmp_path, strategy, workers, refused):
    from rlkit.backends.native import NativeRun
    from rlkit.backends.ray_native import RayNativeRun
    from rlkit.distributed.runtime import RaySettings
    from rlkit.run import ConfigError
    from tests.core.test_sft_start_from_env import _cfg

    cfg = _cfg(tmp_path, "env.parser=plan_map", "env.route_context=text", "rollout.max_new_tokens=64")
    run = RayNativeRun.__new__(RayNativeRun)  # its __init__ starts nothing, but reads Ray settings from the backend
    NativeRun.__init__(run, cfg)
    run.settings = RaySettings(strategy=strategy, num_workers=workers)
    problem = run._route_pass_problem()
    assert (problem is not None) == refused
    if refused:
        assert "env.route_context=text" in problem and "native_ray_ddp" in problem
        with pytest.raises(ConfigError, match="env.route_context=text"):
            run._validate()

