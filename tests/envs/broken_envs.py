"""Three tiny envs, each breaking rlkit.types' contract one way a new env does (issue 75 item 1), for
tests/envs/test_env_check.py and train.py's refusal (``env._target_=tests.envs.broken_envs.<Name>``).

Each takes any keyword (``**_``) so it stands in for the env of any composed job, and is otherwise a valid
one-turn env: the picture of a red square, the answer "red".
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from rlkit.types import Observation, StepOutput


def _picture() -> Image.Image:
    return Image.new("RGB", (16, 16), (220, 40, 40))


class _Episode:
    system_prompt = "Answer with the colour's name."

    def __init__(self) -> None:
        self._solved = False

    def observation(self) -> Observation:
        return Observation("What colour is the square?", [_picture()])

    def reset(self, seed: int) -> Observation:
        self._solved = False
        return self.observation()

    def step(self, action_text: str) -> StepOutput:
        self._solved = action_text.strip() == "red"
        return StepOutput(None, float(self._solved), True, {"parse_ok": self._solved, "success": self._solved})

    def success(self) -> bool:
        return self._solved


class RaisingEpisode(_Episode):
    """step() raises on anything but a colour word, as a strict parser does."""

    def step(self, action_text: str) -> StepOutput:
        if action_text.strip() not in ("red", "green"):
            raise ValueError(f"cannot parse action {action_text[:20]!r}")
        return super().step(action_text)


class NumpyImageEpisode(_Episode):
    """The observation's image is a numpy array (H, W, 3) uint8, not a PIL image."""

    def observation(self) -> Observation:
        return Observation("What colour is the square?", [np.asarray(_picture())])


class BarePILEpisode(_Episode):
    """The observation's images is one PIL image, not a list of them."""

    def observation(self) -> Observation:
        return Observation("What colour is the square?", _picture())  # type: ignore[arg-type]


class _Spec:
    episode = _Episode
    max_turns = 1

    def __init__(self, **_) -> None:
        self.eval_set_name = f"{type(self).__name__.lower()}_4"

    def make(self):
        return self.episode()

    def eval_seeds(self) -> list[int]:
        return [0, 1, 2, 3]

    def is_eval_seed(self, seed: int) -> bool:
        return 0 <= seed < 4

    def demonstration(self, seed: int) -> list[str]:
        return ["red"]


class GoodEnv(_Spec):
    """The valid env the three below break."""


class RaisingStepEnv(_Spec):
    episode = RaisingEpisode


class NumpyImageEnv(_Spec):
    episode = NumpyImageEpisode


class BarePILImageEnv(_Spec):
    episode = BarePILEpisode
