"""rlkit.env_check (issue 75 item 1): an env that breaks rlkit.types' contract is refused with one line before any
work, a good env passes, and an env's exception during training names the env and the contract and keeps its frame."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from envs.shapes import ShapesEnv
from rlkit.env_check import CONTRACT_DOC, check_env, env_contract_problem
from rlkit.errors import ConfigError, EnvContractError
from rlkit.rollout import _apply, _Live
from rlkit.tasks import TaskSampler
from rlkit.types import Observation, StepOutput
from tests.envs import broken_envs

ROOT = Path(__file__).resolve().parents[2]

#: (env, what its one-line refusal must say after "env <Class> breaks the env contract (...): ")
BROKEN = [
    (broken_envs.RaisingStepEnv, "RaisingEpisode.step(the empty string) on task {seed} raised ValueError: \"cannot "
                                 "parse action ''\"; EpisodeEnv.step must not raise on malformed model output"),
    (broken_envs.NumpyImageEnv, "NumpyImageEpisode.reset({seed}) returned an Observation whose images[0] is a "
                                "numpy.ndarray, not a PIL.Image.Image"),
    (broken_envs.BarePILImageEnv, "BarePILEpisode.reset({seed}) returned an Observation whose images is a bare "
                                  "PIL.Image.Image, not a list of PIL images: wrap it, images=[image]"),
]


@pytest.mark.parametrize("cls, says", BROKEN, ids=[c.__name__ for c, _ in BROKEN])
def test_a_broken_env_is_refused_with_one_line_naming_the_contract(cls, says):
    spec = cls()
    train_seed = TaskSampler(0, spec.is_eval_seed).sample(1)[0]  # the first seed training draws
    with pytest.raises(ConfigError) as err:
        check_env(spec)
    msg = str(err.value)
    assert isinstance(err.value, EnvContractError) and "\n" not in msg
    assert msg.startswith(f"env {cls.__name__} breaks the env contract (rlkit.types, {CONTRACT_DOC}): ")
    assert says.format(seed=train_seed) in msg, msg
    assert says.format(seed=7) in env_contract_problem(cls(), train_seed=7)  # the seed it names is the one it played


def test_the_contract_doc_heading_exists():
    path, anchor = CONTRACT_DOC.split("#")
    headings = [line.lstrip("#").strip() for line in (ROOT / path).read_text().splitlines() if line.startswith("## ")]
    slugs = {"".join(c for c in h.lower() if c.isalnum() or c in " -").replace(" ", "-") for h in headings}
    assert anchor in slugs, sorted(slugs)


@pytest.mark.parametrize("spec", [broken_envs.GoodEnv(), ShapesEnv(), ShapesEnv(num_shapes=3),
                                  instantiate(OmegaConf.load(ROOT / "conf/env/visgym.yaml")),
                                  instantiate(OmegaConf.load(ROOT / "conf/env/visgym_interactive.yaml"))],
                         ids=["good", "shapes", "shapes3", "visgym_plan", "visgym_interactive"])
def test_a_good_env_passes(spec):
    assert env_contract_problem(spec) is None
    assert check_env(spec) is spec


class _Scripted:
    """A minimal EnvSpec whose episodes return what the test scripts (one field of the contract broken)."""

    max_turns, eval_set_name = 2, "scripted"

    def __init__(self, **broken):
        self.broken = broken

    def make(self):
        spec = self

        class Ep:
            system_prompt = spec.broken.get("system_prompt")

            def reset(self, seed):
                return spec.broken.get("obs", Observation("q", []))

            def step(self, text):
                fields = dict(observation=None, reward=0.0, done=True, info={"parse_ok": False})
                fields.update({k: v for k, v in spec.broken.items() if k in fields})
                return StepOutput(**fields)

            def success(self):
                return spec.broken.get("success", False)

        return Ep()

    def eval_seeds(self):
        return [0]

    def is_eval_seed(self, seed):
        return seed == 0


@pytest.mark.parametrize("broken, says", [
    ({}, None),
    ({"reward": float("nan")}, "returned reward nan, not a finite float"),
    ({"reward": "1"}, "returned reward '1', not a finite float"),
    ({"done": 1}, "returned done 1 (int), not a bool"),
    ({"info": None}, "returned info of type NoneType, not a dict"),
    ({"info": {"x": object()}}, "info dict that is not JSON-serialisable"),
    ({"done": False, "observation": "next"}, "returned str, not rlkit.types.Observation"),
    ({"done": False, "observation": Observation(b"q", [])}, "whose text is bytes, not str"),
    ({"obs": Observation("q", [Image.new("RGB", (0, 4))])}, "images[0] is empty (0x4 px)"),
    ({"success": None}, "success() returned None (NoneType), not a bool"),
    ({"system_prompt": 3}, "system_prompt is int, not str or None"),
], ids=["ok", "nan", "str_reward", "int_done", "no_info", "info_not_json", "obs_str", "text_bytes", "empty_image",
        "success_none", "prompt_int"])
def test_each_declared_type_is_checked(broken, says):
    problem = env_contract_problem(_Scripted(**broken), train_seed=5)
    assert problem == says if says is None else says in problem, problem


def test_an_env_raising_during_training_names_its_class_and_contract_and_keeps_its_frame():
    env = broken_envs.RaisingEpisode()
    env.reset(3)
    live = [_Live(env=env, seed=3, group=0)]
    comp = SimpleNamespace(token_ids=[1, 2], logprobs=[-0.1, -0.2], finish_reason="stop", text="<answer>up")
    chat = SimpleNamespace(turn_end_ids=lambda *a: [9])
    with pytest.raises(EnvContractError) as err:
        _apply(live, [0], [comp], chat, max_turns=1)
    msg = str(err.value)
    assert msg.startswith("RaisingEpisode.step raised ValueError: cannot parse action '<answer>up' (at "), msg
    assert "broken_envs.py:" in msg and " in step); EpisodeEnv.step must not raise on malformed model output " \
        f"(return info['parse_ok']=False instead; {CONTRACT_DOC}). The model output: '<answer>up'." in msg, msg
    assert isinstance(err.value.__cause__, ValueError)
    frames = [f.name for f in traceback.extract_tb(err.value.__cause__.__traceback__)]
    assert frames[-1] == "step" and "broken_envs.py" in traceback.extract_tb(err.value.__cause__.__traceback__)[-1].filename


def test_train_py_refuses_a_broken_env_before_any_build(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", RLKIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "logger=console",
                           "env._target_=tests.envs.broken_envs.BarePILImageEnv", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[rlkit]")]
    assert lines == [f"[rlkit] config error: env BarePILImageEnv breaks the env contract (rlkit.types, {CONTRACT_DOC}): "
                     "BarePILEpisode.reset(" + lines[0].split("BarePILEpisode.reset(")[1].split(")")[0] + ") returned an "
                     "Observation whose images is a bare PIL.Image.Image, not a list of PIL images: wrap it, "
                     "images=[image]"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "grounding" not in proc.stdout.lower() and "SFT warm start" not in proc.stdout  # refused before any build
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))
    assert "BarePILImageEnv breaks the env contract" in (tmp_path / "run" / "error.txt").read_text()


@pytest.mark.parametrize("cls", [c for c, _ in BROKEN], ids=[c.__name__ for c, _ in BROKEN])
def test_the_generic_env_config_test_catches_each_broken_shape(cls, tmp_path):
    """tests/envs/test_env_configs.py runs over every conf/env/*.yaml; a YAML naming a broken env fails it."""
    from tests.envs.test_env_configs import test_env_config_instantiates_and_solves

    yaml = tmp_path / "broken.yaml"
    yaml.write_text(f"_target_: tests.envs.broken_envs.{cls.__name__}\n")
    with pytest.raises(EnvContractError, match=f"env {cls.__name__} breaks the env contract"):
        test_env_config_instantiates_and_solves(yaml)
    test_env_config_instantiates_and_solves(_good_yaml(tmp_path))  # the good one passes it


def _good_yaml(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text("_target_: tests.envs.broken_envs.GoodEnv\n")
    return path
