"""The shapes env (envs/shapes): determinism, the evaluation/training split, hostile outputs, the reward on
its episodes, its demonstrations, and its configs in the main job."""

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

import rlkit.config  # noqa: F401  registers the schema
from envs.shapes import COLOURS, KINDS, ShapesEnv, ShapesEpisode, draw_task, parse_answer, render
from envs.shapes.task import RGB
from rewards import ExactAnswer
from rlkit.controls import FixedImageEnvSpec
from rlkit.tasks import TaskSampler, training_sampler
from rlkit.types import Episode, EpisodeEnv, Observation, StepOutput, Turn

CONF = Path(__file__).resolve().parents[2] / "conf"


def episode_of(spec, seed: int, text) -> tuple[ShapesEpisode, StepOutput, Episode]:
    """One single-turn episode on task ``seed`` answered with ``text``, and its record as the core builds it."""
    env = spec.make()
    env.reset(seed)
    out = env.step(text)
    turn = Turn(action_text=str(text), env_reward=out.reward, done=out.done, info=out.info)
    return env, out, Episode(seed=seed, turns=[turn], terminated=out.done, truncated=False, success=env.success())


def test_reset_is_deterministic_and_seeds_differ():
    spec = ShapesEnv()
    a, b = spec.make().reset(123), ShapesEnv().make().reset(123)
    assert isinstance(a, Observation) and a.text == b.text and a.text.startswith("What colour is the ")
    assert len(a.images) == 1 and a.images[0].size == (56, 56) and a.images[0].mode == "RGB"
    assert a.images[0].tobytes() == b.images[0].tobytes()
    pictures = {spec.make().reset(s).images[0].tobytes() for s in range(64)}
    assert len(pictures) == 64  # every evaluation task has its own picture


def test_the_picture_shows_the_answer():
    for seed in range(40):
        task = draw_task(seed, num_shapes=2)
        assert task.question == f"What colour is the {task.asked.kind}?" and task.answer == COLOURS[seed % 4]
        assert len({s.kind for s in task.shapes}) == 2 and len({s.colour for s in task.shapes}) == 2
        px = np.asarray(render(task))
        for s in task.shapes:  # a shape's centre pixel has its colour (all three kinds cover their centre)
            assert tuple(px[s.y + s.size // 2, s.x + s.size // 2]) == RGB[s.colour]
        assert tuple(px[0, 0]) == (0, 0, 0)
    assert {draw_task(s, num_shapes=2).asked.kind for s in range(40)} == set(KINDS)
    three = draw_task(7, num_shapes=3)
    assert {s.kind for s in three.shapes} == set(KINDS) and len({s.colour for s in three.shapes}) == 3
    assert all(len(draw_task(s).shapes) == 1 for s in range(5))  # the default (conf/env/shapes.yaml): one shape


def test_eval_answers_are_uniform_so_the_prior_alone_gets_a_quarter():
    spec = ShapesEnv()
    seeds = spec.eval_seeds()
    assert seeds == list(range(64)) and spec.eval_set_name == "shapes1_64"
    assert collections.Counter(draw_task(s).answer for s in seeds) == {c: 16 for c in COLOURS}
    for colour in COLOURS:  # a policy that ignores the picture: any fixed answer solves exactly 16 of 64
        assert sum(episode_of(spec, s, f"<answer>{colour}</answer>")[0].success() for s in seeds) == 16


def test_training_never_sees_an_evaluation_task():
    spec = ShapesEnv()
    assert all(spec.is_eval_seed(s) for s in spec.eval_seeds())
    assert not spec.is_eval_seed(64) and not spec.is_eval_seed(10**9)
    drawn = training_sampler(spec, seed=0).sample(500)
    assert not any(s < 64 for s in drawn) and len(set(drawn)) == 500
    # a training seed that draws the same picture and question as an evaluation seed is skipped too: with one
    # small shape in a 24 px picture the tasks are few, so such seeds exist
    small = ShapesEnv(num_shapes=1, image_size=24, eval_size=64)
    eval_keys = {small.task_key(s) for s in small.eval_seeds()}
    twins = [s for s in range(64, 5000) if small.task_key(s) in eval_keys]
    assert twins and all(small.is_eval_seed(s) for s in twins)
    assert not any(small.task_key(s) in eval_keys for s in TaskSampler(0, small.is_eval_seed).sample(300))


@pytest.mark.parametrize("text", [
    "", "red", "<answer>Red</answer>", "<answer>purple</answer>", "<answer>red", "red</answer>", "<answer></answer>",
    "<answer>red green</answer>", "\x00\ufffd<answer>\udcff</answer>", "<answer>" * 5000, "🟥 " * 300,
    None, 42, b"<answer>red</answer>",
])
def test_malformed_outputs_never_raise(text):
    spec = ShapesEnv()
    env, out, ep = episode_of(spec, 3, text)
    assert isinstance(out, StepOutput) and out.done and out.observation is None and out.reward == 0.0
    assert out.info["parse_ok"] is False and out.info["success"] is False and out.info["answer"] is None
    assert out.info["expected"] == "yellow" and out.info["feedback"].startswith("Unreadable answer")
    json.dumps(out.info)
    assert not env.success() and ExactAnswer()(ep).total == 0.0


def test_answers_are_read_exactly_from_the_first_block():
    assert parse_answer("<answer>red</answer>") == ("red", "")
    assert parse_answer("the circle is <answer>  blue\n</answer>")[0] == "blue"  # surrounding whitespace ignored
    assert parse_answer("<answer>green</answer><answer>red</answer>")[0] == "green"
    assert parse_answer("<answer>reds</answer>")[0] is None


def test_reward_on_right_wrong_and_malformed_answers():
    spec, r = ShapesEnv(), ExactAnswer()
    seed = 6  # answer blue (6 % 4 = 2)
    right, wrong, junk = (episode_of(spec, seed, t) for t in
                          ("<answer>blue</answer>", "<answer>red</answer>", "<answer>blu</answer>"))
    assert right[1].info["answer"] == "blue" and right[0].success() and r(right[2]).total == 1.0
    assert right[1].reward == 1.0 and right[1].info["feedback"] == "Correct."
    assert wrong[1].info["parse_ok"] is True and not wrong[0].success() and r(wrong[2]).total == 0.0
    assert wrong[1].info["feedback"] == f"Wrong: the {draw_task(seed).asked.kind} is blue."
    two = ShapesEnv(num_shapes=2)  # the other colour in a two-shape picture is a wrong answer too
    other = draw_task(seed, num_shapes=2).shapes[1].colour
    assert r(episode_of(two, seed, f"<answer>{other}</answer>")[2]).total == 0.0
    assert junk[1].info["parse_ok"] is False and r(junk[2]).total == 0.0


def test_demonstrations_score_one():
    spec, r = ShapesEnv(), ExactAnswer()
    train = training_sampler(spec, seed=0).sample(20)
    for seed in [*spec.eval_seeds()[:20], *train]:
        texts = spec.demonstration(seed)
        assert texts == [f"<answer>{draw_task(seed).answer}</answer>"]
        env, out, ep = episode_of(spec, seed, texts[0])
        assert env.success() and r(ep).total == 1.0 and out.info["parse_ok"]
        assert texts[0].endswith(spec.stop_strings)  # the policy's turn ends at the stop string


def test_episode_misuse_is_an_error_and_the_spec_validates():
    env = ShapesEnv().make()
    assert isinstance(env, EpisodeEnv) and env.system_prompt and "<answer>red</answer>" in env.system_prompt
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("<answer>red</answer>")
    env.reset(1)
    env.step("<answer>red</answer>")
    with pytest.raises(RuntimeError, match="after the episode is done"):
        env.step("<answer>red</answer>")
    env.reset(1)  # a new episode starts clean
    assert not env.success()
    for kwargs, key in ((dict(num_shapes=4), "num_shapes"), (dict(num_shapes=0), "num_shapes"),
                        (dict(image_size=16), "image_size"), (dict(eval_size=0), "eval_size")):
        with pytest.raises(ValueError, match=key):
            ShapesEnv(**kwargs)


def test_render_trajectory_and_the_fixed_image_control():
    spec = ShapesEnv()
    pic = spec.render_trajectory(5, [{"success": False, "answer": "red"}])
    assert isinstance(pic, Image.Image) and pic.size == (224, 240)
    assert pic.getpixel((1, 1)) == (220, 40, 40)  # a wrong answer's red frame
    assert spec.render_trajectory(5, [{"success": True, "answer": "green"}]).getpixel((1, 1)) == (40, 180, 60)
    blind = FixedImageEnvSpec(spec, image_seed=1000)  # control=fixed_image: same question and answer, one picture
    obs = blind.make().reset(7)
    assert obs.text == spec.make().reset(7).text
    assert obs.images[0].tobytes() == spec.make().reset(1000).images[0].tobytes()


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def test_the_main_job_composes_the_shapes_env_its_image_size_and_recipe():
    cfg = _compose(["env=shapes", "reward=exact_answer"])
    spec = instantiate(cfg.env)
    assert isinstance(spec, ShapesEnv) and (spec.num_shapes, spec.image_size, spec.eval_size) == (1, 56, 64)
    assert cfg.policy.tiny.image_max_pixels == 56 * 56  # conf/image_grid/tiny_vl_shapes.yaml: 7x7 image tokens
    assert cfg.grounding.enabled is False  # no grounding questions in this env
    # conf/recipe/tiny_vl_shapes.yaml: a 60-step format-only warm start, then the maze's GRPO settings
    assert (cfg.sft.target_success, cfg.sft.max_steps, cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (1.0, 60, 16, 0.7)
    assert (cfg.steps, cfg.lr, cfg.optim.lr_schedule, cfg.tasks_per_step) == (120, 2e-5, "cosine", 16)
    assert (cfg.sampling._target_, cfg.algorithm.filter_zero_variance_groups, cfg.algorithm.entropy_coef) == (
        "rlkit.sampling.DapoSampling", True, 0.01)
    assert cfg.reward._target_ == "rewards.ExactAnswer"
    assert OmegaConf.load(CONF / "env" / "shapes.yaml")._target_ == "envs.shapes.ShapesEnv"
