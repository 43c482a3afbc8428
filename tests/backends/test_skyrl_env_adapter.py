"""rlkit's one skyrl-gym adapter over the env protocol (rlkit.backends.skyrl.env_adapter), driven through
skyrl_gym.make as SkyRL's generator does, on VisGym (multi-turn, plan mode) and shapes (a second env, one turn)."""

import base64
import io

import pytest
import skyrl_gym
from PIL import Image

from envs.shapes import ShapesEnv
from envs.visgym import VisGymMaze
from rlkit.backends.skyrl.env_adapter import register as register_skyrl
from rlkit.errors import ConfigError

SKYRL_ENV_ID = "rlkit-env"
MAZE = dict(variant="easy", mode="interactive", max_turns=18, parser="tuple", cell_size=25, impl="native")
CONFIG = {"_target_": "envs.visgym.VisGymMaze", **MAZE}


def _image_of(message: dict) -> Image.Image:
    part = message["content"][0]
    assert part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_registered():
    assert register_skyrl() == SKYRL_ENV_ID
    assert register_skyrl() == SKYRL_ENV_ID  # idempotent
    assert SKYRL_ENV_ID in skyrl_gym.registry


def test_solver_episode_and_broken_output():
    register_skyrl()
    env = skyrl_gym.make(SKYRL_ENV_ID, env_config=dict(CONFIG), extras={"seed": 1, "max_turns": 18})
    messages, meta = env.init([{"role": "user", "content": "placeholder"}])
    assert meta == {"seed": 1}
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "('move', d)" in messages[0]["content"]
    assert _image_of(messages[1]).size == (225, 225)
    assert messages[1]["content"][1] == {"type": "text", "text": "Here is the maze. Turn 1/18: your action?"}

    out = env.step("let me think... (((")  # broken output: a no-op with feedback
    assert out["done"] is False and out["reward"] == 0.0
    assert out["metadata"]["parse_ok"] is False
    (obs,) = out["observations"]
    assert obs["role"] == "user" and "Could not read" in obs["content"][1]["text"]
    _image_of(obs)

    demo = VisGymMaze(**MAZE).demonstration(1)
    for text in demo:
        out = env.step(text)
    assert out["done"] is True and out["reward"] == 1.0 and out["observations"] == []
    assert out["metadata"]["success"] is True
    assert env.get_metrics() == {"success": 1.0, "turns": len(demo) + 1, "parse_failures": 1}
    episode = env.episode()
    assert episode.success and episode.terminated and not episode.truncated and episode.seed == 1
    assert len(episode.turns) == len(demo) + 1 and episode.parse_failures == 1


def test_turn_budget_ends_the_episode():
    register_skyrl()
    cfg = dict(CONFIG, max_turns=3)
    env = skyrl_gym.make(SKYRL_ENV_ID, env_config=cfg, extras={"extra_info": {"seed": 0}, "max_turns": 3})
    env.init([])
    outs = [env.step("('move', 3)") for _ in range(3)]
    assert [o["done"] for o in outs] == [False, False, True] and outs[-1]["observations"] == []
    assert env.episode().truncated and not env.episode().success


def test_plan_mode_is_single_turn():
    register_skyrl()
    cfg = dict(CONFIG, mode="plan", parser="plan")
    env = skyrl_gym.make(SKYRL_ENV_ID, env_config=cfg, extras={"seed": 2, "max_turns": 1})
    env.init([])
    out = env.step(VisGymMaze(**dict(MAZE, mode="plan", parser="plan")).demonstration(2)[0])
    assert out["done"] and out["reward"] == 1.0


@pytest.mark.parametrize(
    "env_config,extras,error,match",
    [
        (dict(CONFIG, cell_sise=3), {"seed": 0}, ConfigError, "cell_sise"),
        (MAZE, {"seed": 0}, ConfigError, "_target_"),
        (CONFIG, {}, ValueError, "seed"),
        (CONFIG, {"seed": 0, "max_turns": 15}, ValueError, "max_turns"),
    ],
)
def test_config_errors(env_config, extras, error, match):
    register_skyrl()
    with pytest.raises(error, match=match):
        skyrl_gym.make(SKYRL_ENV_ID, env_config=env_config, extras=extras)


def test_a_second_env_runs_through_the_same_adapter():
    """shapes: one turn, no env-specific code; the system prompt, the picture and the env's own reward."""
    register_skyrl()
    spec = ShapesEnv()
    cfg = {"_target_": "envs.shapes.ShapesEnv", "num_shapes": 1, "image_size": 56, "eval_size": 64}
    env = skyrl_gym.make(SKYRL_ENV_ID, env_config=cfg, extras={"seed": 3, "max_turns": 1})
    messages, meta = env.init([{"role": "user", "content": "placeholder"}])
    assert meta == {"seed": 3} and [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == spec.make().system_prompt
    assert _image_of(messages[1]).size == (56, 56)
    first = spec.make().reset(3)
    assert messages[1]["content"][1] == {"type": "text", "text": first.text}
    out = env.step(spec.demonstration(3)[0])
    assert out["done"] is True and out["observations"] == [] and out["metadata"]["success"] is True
    assert env.get_metrics() == {"success": 1.0, "turns": 1, "parse_failures": 0}
    episode = env.episode()
    assert episode.success and episode.terminated and len(episode.turns) == 1

    wrong = skyrl_gym.make(SKYRL_ENV_ID, env_config=cfg, extras={"seed": 3, "max_turns": 1})
    wrong.init([])
    out = wrong.step("<answer>not a colour</answer>")
    assert out["done"] is True and not wrong.episode().success
