"""The gymnasium adapter (envs/gym_text.py) on a small image env built for it (tests/envs/gym_dots.py) and on VisGym's
gymnasium maze, beside VisGym's own bridge (envs/visgym/episode.py)."""

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

from envs.gym_text import GymTextEnv, GymTextEpisode, jsonable
from envs.visgym import VisGymMaze, make_parser
from envs.visgym.spec import EVAL_SETS
from rlkit.env_check import MALFORMED_OUTPUTS, check_env
from rlkit.types import EpisodeEnv, Observation, SupportsDemonstrations
from tests.envs import gym_dots

DOTS = dict(env_id=gym_dots.ENV_ID, parser="tests.envs.gym_dots.parse_count", solver="tests.envs.gym_dots.solve",
            invalid="end", eval_size=16)


def test_dots_passes_the_start_up_check_and_its_solver_solves():
    spec = GymTextEnv(**DOTS)
    check_env(spec)  # raises a one-line EnvContractError on a broken contract
    assert isinstance(spec, SupportsDemonstrations) and spec.eval_set_name == "dots_16"
    assert not isinstance(GymTextEnv(**{**DOTS, "solver": None}), SupportsDemonstrations)
    seeds = spec.eval_seeds()
    assert seeds == list(range(16)) and all(spec.is_eval_seed(s) for s in seeds)  # 16 distinct pictures
    for seed in (0, 5, 1000):
        ep = spec.make()
        assert isinstance(ep, EpisodeEnv)
        obs = ep.reset(seed)
        count = gym_dots.draw(seed)[0]
        assert isinstance(obs.images[0], Image.Image) and obs.images[0].size == (56, 56) and obs.text == "Your action?"
        # the picture is the env's: count x 36 white pixels
        assert int((np.asarray(obs.images[0])[:, :, 0] == 255).sum()) == 36 * count
        out = ep.step(spec.demonstration(seed)[0])
        assert out.done and out.reward == 1.0 and ep.success() and out.observation is None
        assert out.info == {"count": count, "expected": str(count), "is_success": True, "parse_ok": True,
                            "success": True, "action": count - 1, "feedback": "", "turn": 1}
        wrong = spec.make()
        wrong.reset(seed)
        out = wrong.step(str(count % 4 + 1))
        assert out.done and out.reward == 0.0 and not wrong.success() and out.info["parse_ok"] is True


@pytest.mark.parametrize("text", ["", "7", "0", "three", "2.5", "\x00", *(t for _, t in MALFORMED_OUTPUTS)])
def test_malformed_text_is_an_invalid_action_never_an_exception(text):
    for invalid, done in (("end", True), ("noop", False)):
        ep = GymTextEnv(**{**DOTS, "invalid": invalid, "invalid_reward": -0.5, "max_turns": 2}).make()
        ep.reset(3)
        out = ep.step(text)
        assert out.reward == -0.5 and out.done is done and not ep.success()
        assert out.info["parse_ok"] is False and out.info["action"] is None
        assert out.info["feedback"].startswith("Could not read your action: ")
        json.dumps(out.info)
        if done:
            assert out.observation is None
        else:  # a no-op: the same picture again, with the reason, and the episode goes on to a right answer
            assert isinstance(out.observation, Observation) and out.observation.text.endswith("Your next action?")
            assert ep.step(gym_dots.solve(3)[0]).reward == 1.0 and ep.success()


def test_reasons_name_what_was_wrong():
    ep = GymTextEpisode(gym.make(gym_dots.ENV_ID), gym_dots.parse_count)
    assert ep.parse("9") == (None, "8 is not an action of Discrete(4)")

    class Unshowable:
        def __repr__(self):
            raise RuntimeError("no")

    assert GymTextEpisode(gym.make(gym_dots.ENV_ID), lambda t: Unshowable()).parse("1") == (
        None, "<Unshowable> is not an action of Discrete(4)")
    assert ep.parse("x")[1].startswith("ValueError: invalid literal for int()")
    assert GymTextEpisode(gym.make(gym_dots.ENV_ID), lambda t: None).parse("3") == (None, "no action in the text")
    with pytest.raises(RuntimeError, match="before reset"):
        ep.step("1")


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"env.invalid must be one of \('noop', 'end'\)"):
        GymTextEnv(**{**DOTS, "invalid": "skip"}).make()
    with pytest.raises(ValueError, match="env.parser 'tests.envs.gym_dots.nope': module 'tests.envs.gym_dots' has no"):
        GymTextEnv(**{**DOTS, "parser": "tests.envs.gym_dots.nope"})
    with pytest.raises(ValueError, match="env.eval_size must be an int >= 1, got 0"):
        GymTextEnv(**{**DOTS, "eval_size": 0})
    with pytest.raises(ValueError, match="env.holdout must be one of"):
        GymTextEnv(**{**DOTS, "holdout": "layout"})
    # an env whose observation is not a picture: refused when the spec is built, naming shape and dtype
    with pytest.raises(ValueError, match=r"the observation is not an image: shape \(\), dtype int64.*image: render"):
        GymTextEnv(env_id="FrozenLake-v1", parser="builtins.int", env_kwargs={"is_slippery": False})
    with pytest.raises(ValueError, match="draws 1 distinct first observations"):
        GymTextEnv(env_id="FrozenLake-v1", parser="builtins.int", image="render", eval_size=4,
                   env_kwargs={"is_slippery": False, "render_mode": "rgb_array"})


def test_a_rendered_text_env_with_the_seed_holdout_trains_from_render():
    spec = GymTextEnv(env_id="FrozenLake-v1", parser="builtins.int", image="render", holdout="seed", eval_size=4,
                      max_turns=8, feedback_key=None, env_kwargs={"is_slippery": False, "render_mode": "rgb_array"})
    check_env(spec)
    ep = spec.make()
    assert ep.reset(0).images[0].size == (256, 256)
    for a in (2, 2, 1, 1, 1, 2):  # right right down down down right: the goal of the 4x4 map
        out = ep.step(f" {a} ")
    assert out.done and out.reward == 1.0 and ep.success() and spec.is_eval_seed(3) and not spec.is_eval_seed(4)


def test_the_observation_holdout_is_visgym_layout_holdout():
    # VisGym's 7x7 maze through the adapter: a task is what its first picture shows, which is VisGym's layout
    spec = GymTextEnv(env_id="rlkit/Maze2D-small-v0", parser="builtins.int", eval_size=8, max_turns=17)
    own = EVAL_SETS["visgym_small_64"]
    assert spec.eval_seeds() == list(own.seeds[:8])
    held = [s for s in range(3000) if spec.is_eval_seed(s)]
    first8 = {k: v for k, v in own.layouts().items() if v in own.seeds[:8]}
    from envs.visgym.maze import VARIANT_SIZES, layout_key

    assert held == [s for s in range(3000) if layout_key(s, VARIANT_SIZES["small"]) in first8]
    assert len(held) > 8  # other seeds draw those mazes again, and training skips them


def _tuple_action(text):
    parsed, _ = make_parser("tuple").parse_with_reason(text)
    return None if parsed is None else parsed.actions[0]


def test_visgym_interactive_through_the_adapter_matches_its_own_bridge():
    """VisGym's interactive mode is one use of the adapter: the same rewards, ends, successes, agent cells and
    pictures as MazeEpisode, turn by turn (its texts and other info keys are its own)."""
    own = VisGymMaze(variant="small", mode="interactive", max_turns=20, parser="tuple", wall_move="stay")
    rng = np.random.default_rng(0)
    for seed in (0, 7, 123):
        wander = [f"('move', {d})" for d in rng.integers(0, 4, size=12)] + ["('stop', 'stop')"]  # bumps walls
        solved = ["junk", "('move', 9)", "", *own.demonstration(seed)]  # unreadable turns are no-ops, then the solver
        for texts, success in ((wander, False), (solved, True)):
            a, b = own.make(), GymTextEpisode(gym.make("rlkit/Maze2D-small-v0"), _tuple_action, invalid="noop")
            assert a.reset(seed).images[0].tobytes() == b.reset(seed).images[0].tobytes()
            for text in texts:
                sa, sb = a.step(text), b.step(text)
                assert (sa.reward, sa.done, sa.info["parse_ok"], sa.info["agent"], a.success()) == (
                    sb.reward, sb.done, sb.info["parse_ok"], sb.info["agent"], b.success())
                if sa.done:
                    break
                assert sa.observation.images[0].tobytes() == sb.observation.images[0].tobytes()
            assert sa.done and a.success() is b.success() is success


def test_the_spec_pickles_for_ray_workers_with_its_capabilities():
    spec = pickle.loads(pickle.dumps(GymTextEnv(**DOTS)))
    assert isinstance(spec, SupportsDemonstrations) and spec.demonstration(5) == gym_dots.solve(5)
    assert spec.is_eval_seed(3) and spec.make().reset(3).images


def test_jsonable():
    assert jsonable({"a": np.int64(3), "b": np.arange(3), 1: (np.float32(0.5), None), "c": object}) == {
        "a": 3, "b": [0, 1, 2], "1": [0.5, None], "c": "<class 'object'>"}
