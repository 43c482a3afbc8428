"""env.route_context=text: the route written in a second pass of text alone (rlkit.rollout's route pass)."""

from dataclasses import replace

import pytest
import torch

from envs.visgym.routes import RouteExample
from envs.visgym.spec import VisGymMaze
from rlkit.config import AlgorithmConfig
from rlkit.policy import SamplingParams
from rlkit.policy.engine import Completion
from rlkit.rollout import CONTINUATION_GROUP, rollout, rollout_stats, with_continuations
from rlkit.sft import demonstration_nll, demonstration_trajectory, encode_route_example, route_prompt
from rlkit.update import kept_sequences, mask_unexecuted
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
    notes = _notes(env)
    # one closes its answer without opening it, one runs out of tokens in its notes: no second pass for either
    engine = ScriptedEngine([notes + "</answer>", notes[:10], notes + "<answer>", ROUTE_0[:12]], tok)
    trajs = rollout(env, policy, engine, seeds=[0, 0, 0], group_size=1, sampling=SAMPLE, policy_version=0)
    assert len(engine.calls) == 2 and len(engine.calls[1][0]) == 1  # only the third is continued
    closed, cut, route_cut = trajs
    assert closed.continuation is None and not closed.episode.success
    assert closed.episode.turns[0].action_text == notes + "</answer>"
    assert cut.continuation is None and cut.num_truncated_turns == 1 and not cut.episode.success
    # a route cut by max_new_tokens: both sequences carry the cut, so overlong_filtering drops them together
    assert route_cut.num_truncated_turns == 1 and route_cut.continuation.num_truncated_turns == 1
    flat, adv = with_continuations(trajs, torch.tensor([1.0, -1.0, 0.5]))
    assert kept_sequences(flat, adv, AlgorithmConfig(overlong_filtering=True)) == [0]


def test_the_route_pass_is_off_by_default_and_needs_plan_map():
    assert _env("picture").route_context == "picture" and VisGymMaze(variant="small", mode="plan",
                                                                       parser="plan_map").route_context == "picture"
    with pytest.raises(ValueError, match="env.parser=plan_map"):
        VisGymMaze(variant="small", mode="plan", parser="plan", route_context="text")
    with pytest.raises(ValueError, match="route_context must be one of"):
        VisGymMaze(variant="small", mode="plan", parser="plan_map", route_context="notes")


def test_the_update_trains_both_passes_with_the_episodes_advantage(policy):
    env, tok = _env(), policy.chat.tokenizer
    notes, wrong = _notes(env), "a#b#c#d#e#f#g#h#i#j#k#l# 5,1 to 1,5"
    engine = ScriptedEngine([notes + "<answer>", wrong + "<answer>", ROUTE_0, "up up stop</answer>"], tok)
    trajs = rollout(env, policy, engine, seeds=[0, 0], group_size=1, sampling=SAMPLE, policy_version=0)
    adv = torch.tensor([1.0, -0.5])
    flat, flat_adv = with_continuations(trajs, adv)
    assert len(flat) == 4 and all(t.continuation is None for t in flat)
    assert flat_adv.tolist() == [1.0, -0.5, 1.0, -0.5]
    assert [t.group for t in flat] == [0, 1, CONTINUATION_GROUP, 1 + CONTINUATION_GROUP]
    assert [bool(t.image_inputs) for t in flat] == [True, True, False, False]
    assert flat[2].input_ids == trajs[0].continuation.input_ids
    assert with_continuations(flat, flat_adv)[0] is flat  # nothing left to expand
    cfg = AlgorithmConfig(micro_batch_size=4, max_grad_norm=1e9)
    _, g_pair, _ = _update_grad(policy, trajs, adv, cfg)
    _, g_first, _ = _update_grad(policy, [replace(t, continuation=None) for t in trajs], adv, cfg)
    _, g_route, _ = _update_grad(policy, flat[2:], adv, cfg)
    # token_mean over both: the two parts' gradients weighted by their shares of the policy tokens
    n1, n2 = sum(t.num_policy_tokens for t in flat[:2]), sum(t.num_policy_tokens for t in flat[2:])
    assert torch.allclose(g_pair, (n1 * g_first + n2 * g_route) / (n1 + n2), atol=1e-7, rtol=1e-4)
    assert not torch.allclose(g_pair, g_first, atol=1e-6, rtol=1e-4) and g_route.abs().sum() > 0


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
    assert demo.continuation.input_ids == question.input_ids  # the route question's tokens...
    cont = demo.continuation
    assert tok.decode([i for i, m in zip(cont.input_ids, cont.loss_mask) if m]).startswith(text[len(notes) + len("<answer>"):])
    # ...with the loss on the route alone, as in a rollout's continuation (the first sequence writes the opening)
    assert sum(cont.loss_mask) == sum(question.loss_mask) - len(tok("<answer>", add_special_tokens=False)["input_ids"])
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
def test_fsdp_ranks_refuse_the_route_pass_with_the_fix(tmp_path, strategy, workers, refused):
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



def test_warm_start_validation_measures_the_route_and_its_first_move(policy):
    from rlkit.sft import demonstration_metrics

    env = _env()
    demos = [demonstration_trajectory(env, policy, s) for s in (0, 1, 2, 3)]
    fit = demonstration_metrics(policy, demos)
    notes_fit = demonstration_metrics(policy, [replace(d, continuation=None) for d in demos])
    route_fit = demonstration_metrics(policy, [d.continuation for d in demos])
    n1 = sum(d.num_policy_tokens for d in demos)
    n2 = sum(d.continuation.num_policy_tokens for d in demos)
    assert fit["loss"] == pytest.approx((n1 * notes_fit["loss"] + n2 * route_fit["loss"]) / (n1 + n2), rel=1e-5)
    assert fit["first_token_accuracy"] == route_fit["first_token_accuracy"]  # the first move, not a wall bit


def test_play_refuses_the_route_pass():
    from rlkit.serve.play import PlayError, play_episode

    with pytest.raises(PlayError, match="scripts/eval.py"):
        play_episode(None, "m", _env(), 0, 64)
