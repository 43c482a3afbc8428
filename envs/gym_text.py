"""A gymnasium env played in text: rlkit's env protocol (rlkit/types.py) from a ``gymnasium.Env`` and a text parser.

- ``GymTextEpisode`` (``rlkit.types.EpisodeEnv``) wraps one gymnasium env. ``reset(seed)`` calls
  ``env.reset(seed=seed)`` and shows the observation as a picture (an image observation, or ``env.render()``) with
  a prompt; ``step(text)`` turns the policy's text into an action with the parser and calls ``env.step(action)``.
- ``GymTextEnv`` (``rlkit.types.EnvSpec``, what a ``conf/env/<name>.yaml`` with ``_target_: envs.gym_text.GymTextEnv``
  builds) makes them from a gymnasium id (``gymnasium.make``; ``"module:Env-v0"`` imports the module that registers
  it first) and holds the evaluation set out by the first observation a seed draws.

The parser is any function ``text -> action``. Malformed text never raises out of ``step``: a parser that returns
None or raises (``int("junk")``), or an action outside ``env.action_space``, is an invalid action. The env is not
stepped; the turn gets ``invalid_reward`` (default 0.0, the penalty in the env reward), ``parse_ok`` False and a
feedback naming the reason, and the episode goes on (``invalid: noop``, the rlkit protocol's no-op) or ends there,
unsolved (``invalid: end``, for single-turn envs).

Per-turn ``StepOutput.info``: the env's own info made JSON-serialisable (numpy values as lists and numbers, other
objects as their repr; on an invalid turn the env's last info, from ``reset`` or the last ``step``), then ``parse_ok``, ``success``, ``action`` (the action taken, None when invalid),
``feedback`` (the env's ``info[feedback_key]``, or the invalid action's reason) and ``turn`` (1-based).
``success`` is ``info[success_key]`` when the env reports it (gymnasium-robotics' ``is_success``), else "the
episode terminated with a positive reward"; once True it stays True.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from PIL import Image

from rlkit.import_path import import_object
from rlkit.types import Observation, StepOutput

INVALID = ("noop", "end")
IMAGES = ("observation", "render", "none")
HOLDOUTS = ("observation", "seed")


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: numpy arrays and scalars as lists and numbers, tuples as lists, mappings with
    str keys; anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)


def to_image(array: Any, where: str) -> Image.Image:
    """A uint8 image array (H x W grey, H x W x 3 RGB or H x W x 4 RGBA) as an RGB PIL image.

    Raises: ValueError naming ``where``, the array's shape and dtype, and what is expected."""
    if isinstance(array, Image.Image):
        return array.convert("RGB")
    a = np.asarray(array)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)) or 0 in a.shape:
        raise ValueError(f"{where} is not an image: shape {a.shape}, dtype {a.dtype}; expected uint8 H x W, "
                         "H x W x 3 or H x W x 4 (set env.image: render to show env.render(), or none)")
    return Image.fromarray(a).convert("RGB")


class GymTextEpisode:
    """One gymnasium env as an rlkit episode (``rlkit.types.EpisodeEnv``; module doc).

    Args:
        env: the gymnasium env (one per episode object).
        parser: ``text -> action``; None or an exception means the text names no valid action.
        system_prompt: the system message (None: none).
        prompt: the first user message's text (after the observation's text, if it has one).
        next_prompt: the text after each later turn's feedback.
        image: "observation" (the observation, or ``observation[image_key]``, is the picture), "render"
            (``env.render()``, for an env made with ``render_mode="rgb_array"``) or "none" (text only).
        image_key / text_key: for dict observations, the entries holding the picture / a text to show.
        feedback_key: the env's info key of a text to show after each turn (None: none).
        success_key: the env's info key saying the task is solved (module doc).
        invalid: "noop" or "end"; invalid_reward: the env reward of an invalid action.

    Raises:
        ValueError: an unknown ``image`` / ``invalid`` value; at reset, an observation that is not an image where
            one is expected (names its shape and dtype).
    """

    def __init__(self, env: gym.Env, parser: Callable[[str], Any], system_prompt: str | None = None,
                 prompt: str = "Your action?", next_prompt: str = "Your next action?", image: str = "observation",
                 image_key: str | None = None, text_key: str | None = None, feedback_key: str | None = None,
                 success_key: str = "is_success", invalid: str = "noop", invalid_reward: float = 0.0):
        if image not in IMAGES:
            raise ValueError(f"env.image must be one of {IMAGES}, got {image!r}")
        if invalid not in INVALID:
            raise ValueError(f"env.invalid must be one of {INVALID}, got {invalid!r}")
        self.env, self.parser, self.system_prompt = env, parser, system_prompt
        self.prompt, self.next_prompt, self.image = prompt, next_prompt, image
        self.image_key, self.text_key, self.feedback_key, self.success_key = image_key, text_key, feedback_key, success_key
        self.invalid, self.invalid_reward = invalid, float(invalid_reward)
        self._obs: Any = None
        self._env_info: dict[str, Any] = {}
        self._started = self._done = self._success = False
        self._turn = 0

    # -- EpisodeEnv --------------------------------------------------------------------------------

    def reset(self, seed: int) -> Observation:
        """``env.reset(seed=seed)``; the first user message: the picture and ``prompt``."""
        self._obs, env_info = self.env.reset(seed=int(seed))
        self._env_info = jsonable(dict(env_info))
        self._started, self._done, self._success, self._turn = True, False, False, 0
        return self._observation(self.prompt)

    def step(self, action_text: str) -> StepOutput:
        """One policy turn (module doc). Never raises on malformed text.

        Raises: RuntimeError called before ``reset`` or after the episode is done (a harness error)."""
        if not self._started:
            raise RuntimeError("GymTextEpisode.step() called before reset()")
        if self._done:
            raise RuntimeError("GymTextEpisode.step() called after the episode is done; call reset()")
        self._turn += 1
        action, reason = self.parse(action_text)
        if action is None:
            self._done = self.invalid == "end"
            feedback = f"Could not read your action: {reason}."
            info = dict(self._env_info)  # the state did not change: the env's last info stands
            info.update(parse_ok=False, success=self._success, action=None, feedback=feedback, turn=self._turn)
            obs = None if self._done else self._observation(f"{feedback} {self.next_prompt}")
            return StepOutput(observation=obs, reward=self.invalid_reward, done=self._done, info=info)
        self._obs, reward, terminated, truncated, env_info = self.env.step(action)
        reward = float(reward)
        if self.success_key in env_info:
            self._success = self._success or bool(env_info[self.success_key])
        else:
            self._success = self._success or bool(terminated and reward > 0)
        self._done = bool(terminated or truncated)
        feedback = str(env_info.get(self.feedback_key, "")) if self.feedback_key else ""
        self._env_info = jsonable(dict(env_info))
        info = dict(self._env_info)
        info.update(parse_ok=True, success=self._success, action=jsonable(action), feedback=feedback, turn=self._turn)
        obs = None if self._done else self._observation(f"{feedback} {self.next_prompt}".strip())
        return StepOutput(observation=obs, reward=reward, done=self._done, info=info)

    def success(self) -> bool:
        """True once the env reported the task solved (module doc)."""
        return self._success

    # -- parsing and observations ----------------------------------------------------------------------

    def parse(self, text: Any) -> tuple[Any, str]:
        """``(action, "")`` for a text the parser reads into an action of ``env.action_space``, else
        ``(None, reason)``. Never raises."""
        try:
            action = self.parser(text)
        except Exception as e:  # a parser that raises on junk is a fine parser: the text names no action
            return None, f"{type(e).__name__}: {_short(e, str)}"
        if action is None:
            return None, "no action in the text"
        try:
            ok = bool(self.env.action_space.contains(action))
        except Exception:  # a value the space cannot even compare
            ok = False
        if not ok:
            return None, f"{_short(action, repr)} is not an action of {self.env.action_space}"
        return action, ""

    def _observation(self, text: str) -> Observation:
        obs, part = self._obs, None
        if isinstance(obs, str):
            part = obs
        elif self.text_key is not None and isinstance(obs, Mapping):
            part = obs.get(self.text_key)
        if part:
            text = f"{part}\n{text}"
        if self.image == "none":
            return Observation(text=text, images=[])
        if self.image == "render":
            return Observation(text=text, images=[to_image(self.env.render(), "env.render()")])
        picture = obs[self.image_key] if self.image_key is not None else obs
        return Observation(text=text, images=[to_image(picture, "the observation")])


class GymTextEnv:
    """The EnvSpec of a gymnasium env played in text (``conf/env/<name>.yaml``: ``_target_: envs.gym_text.GymTextEnv``).

    Args:
        env_id: the gymnasium id, e.g. ``"rlkit/Maze2D-small-v0"`` or ``"my_package.envs:Dots-v0"`` (gymnasium imports
            ``my_package.envs``, which registers ``Dots-v0``, first).
        parser: the import path of the parser function ``text -> action`` (module doc).
        max_turns: policy turns per episode (1: single-turn).
        env_kwargs: keyword arguments of ``gymnasium.make`` (e.g. ``render_mode: rgb_array`` for ``image: render``).
        eval_size: tasks in the evaluation set.
        holdout: "observation": the evaluation set is the first ``eval_size`` seeds from 0 that draw distinct first
            observations (observation, and the rendered picture with ``image: render``), and training skips every
            seed that draws one of them (a task is what a seed shows); "seed": seeds 0..eval_size-1 only.
        solver: the import path of ``seed -> list[str]``, the assistant texts of a solved episode (the
            ``demonstration`` capability, rlkit.types.SupportsDemonstrations); None: no solver.
        stop_strings: strings that end a policy turn (the ``stop_strings`` capability); None: none.
        name: the evaluation set's name stem (default: the id's name, lower case).
        system_prompt, prompt, next_prompt, image, image_key, text_key, feedback_key, success_key, invalid,
            invalid_reward: as ``GymTextEpisode``'s.

    Raises:
        ValueError: a bad value (names the key and the values it takes), a parser or solver that does not import,
            an env whose first observation is not a picture where one is expected, or an env that draws fewer than
            ``eval_size`` distinct first observations in ``100 * eval_size`` seeds (holdout "observation").
        gymnasium.error.Error: an id gymnasium does not know.
    """

    def __init__(self, env_id: str, parser: str, max_turns: int = 1, env_kwargs: Mapping[str, Any] | None = None,
                 system_prompt: str | None = None, prompt: str = "Your action?",
                 next_prompt: str = "Your next action?", image: str = "observation", image_key: str | None = None,
                 text_key: str | None = None, feedback_key: str | None = None, success_key: str = "is_success",
                 invalid: str = "noop", invalid_reward: float = 0.0, eval_size: int = 32,
                 holdout: str = "observation", solver: str | None = None, stop_strings: list[str] | None = None,
                 name: str | None = None):
        for key, value in (("max_turns", max_turns), ("eval_size", eval_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"env.{key} must be an int >= 1, got {value!r}")
        if holdout not in HOLDOUTS:
            raise ValueError(f"env.holdout must be one of {HOLDOUTS}, got {holdout!r}")
        self.env_id, self.max_turns, self.env_kwargs = env_id, max_turns, dict(env_kwargs or {})
        self.parser_path, self.solver_path, self.holdout, self.eval_size = parser, solver, holdout, eval_size
        self._parser = import_object(parser, "env.parser")
        self._solver = import_object(solver, "env.solver") if solver is not None else None
        self._episode_args = dict(system_prompt=system_prompt, prompt=prompt, next_prompt=next_prompt, image=image,
                                  image_key=image_key, text_key=text_key, feedback_key=feedback_key,
                                  success_key=success_key, invalid=invalid, invalid_reward=invalid_reward)
        if stop_strings is not None:
            self.stop_strings = tuple(str(s) for s in stop_strings)
        stem = name or env_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1].split("-v")[0].lower()
        self.eval_set_name = f"{stem}_{eval_size}"
        self._lock = threading.Lock()
        self._probe: GymTextEpisode | None = None
        self._eval_seeds, self._eval_keys = self._draw_eval_set()
        self._add_capabilities()

    def __repr__(self) -> str:
        return f"GymTextEnv({self.env_id!r}, parser={self.parser_path!r}, max_turns={self.max_turns})"

    def _add_capabilities(self) -> None:
        # the capability protocols are structural: the method exists only when a solver was given
        if self._solver is not None:
            self.demonstration = self._demonstration

    def __getstate__(self) -> dict[str, Any]:  # for Ray workers: no live env, lock or bound method
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_probe", "demonstration")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._probe = threading.Lock(), None
        self._add_capabilities()

    # -- EnvSpec --------------------------------------------------------------------------------------

    def make(self) -> GymTextEpisode:
        """A fresh episode with its own gymnasium env."""
        return GymTextEpisode(gym.make(self.env_id, **self.env_kwargs), self._parser, **self._episode_args)

    def eval_seeds(self) -> list[int]:
        """The evaluation set's seeds (see ``holdout``)."""
        return list(self._eval_seeds)

    def is_eval_seed(self, seed: int) -> bool:
        """True if training must skip ``seed``: an evaluation seed, or (holdout "observation") one whose first
        observation is an evaluation task's. Costs one ``reset`` per call."""
        seed = int(seed)
        if seed in self._eval_seeds or self.holdout == "seed":
            return seed in self._eval_seeds
        return self.task_key(seed) in self._eval_keys

    # -- capabilities ---------------------------------------------------------------------------------

    def task_key(self, seed: int) -> bytes:
        """What task ``seed`` shows: a digest of its first observation (and rendered picture with ``image: render``)."""
        with self._lock:
            if self._probe is None:
                self._probe = self.make()
            probe = self._probe
            first = probe.reset(seed)
            digest = hashlib.sha256(_observation_bytes(probe._obs))
            for picture in first.images:
                digest.update(picture.tobytes())
            return digest.digest()

    def _demonstration(self, seed: int) -> list[str]:
        """The solver's texts of task ``seed`` (``solver``), one per policy turn."""
        return list(self._solver(int(seed)))

    def _draw_eval_set(self) -> tuple[tuple[int, ...], frozenset[bytes]]:
        if self.holdout == "seed":
            self.task_key(0)  # builds and resets once: a broken env or observation fails here, before any work
            return tuple(range(self.eval_size)), frozenset()
        keys: dict[bytes, int] = {}
        for seed in range(100 * self.eval_size):
            keys.setdefault(self.task_key(seed), seed)
            if len(keys) == self.eval_size:
                return tuple(sorted(keys.values())), frozenset(keys)
        raise ValueError(f"env {self.env_id!r} draws {len(keys)} distinct first observations in seeds "
                         f"0..{100 * self.eval_size - 1}, fewer than env.eval_size={self.eval_size}: lower eval_size, "
                         "or set env.holdout=seed")


def _short(value: Any, show: Callable[[Any], str], n: int = 120) -> str:
    """``show(value)`` cut to ``n`` characters; never raises (a value that cannot be shown is named by its type)."""
    try:
        text = show(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."


def _observation_bytes(obs: Any) -> bytes:
    if isinstance(obs, np.ndarray):
        return f"{obs.dtype}{obs.shape}".encode() + obs.tobytes()
    if isinstance(obs, Mapping):
        return b"".join(str(k).encode() + _observation_bytes(v) for k, v in sorted(obs.items(), key=lambda kv: str(kv[0])))
    return repr(jsonable(obs)).encode()
