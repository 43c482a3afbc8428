"""Check an env against rlkit.types' contract before any work, as gymnasium's ``check_env`` checks a gym env.

``check_env(env_spec)`` plays a few episodes with no policy: it resets a fresh episode on a training seed and on an
evaluation seed, checks the observation's types, then feeds ``step`` malformed model outputs (the empty string,
control characters, a 10,000-character text, unbalanced tags, non-ASCII) and checks what comes back. The recipe
calls it at start-up (rlkit.recipes.grpo.GRPORecipe.setup), so an env that would fail at the first junk sample,
or train on observations the policy cannot see, is refused with one line before any warm start is built.

The checks follow gymnasium's ``gymnasium.utils.env_checker.check_env`` in spirit (reset and step return the
declared types; rewards are finite numbers; ``done`` is a bool; info is a dict), applied to rlkit's text-in,
observation-out protocol (``rlkit.types.EpisodeEnv``): the observation is an ``Observation`` whose ``images`` is a
list of PIL images, and ``step`` must never raise on a malformed output (the contract's own words).
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

from PIL import Image

from rlkit.errors import EnvContractError
from rlkit.types import EpisodeEnv, Observation, StepOutput

#: Where the contract is written down (the heading's anchor on GitHub).
CONTRACT_DOC = "docs/adding-an-env.md#1-the-two-required-pieces"

#: Model outputs a sampled policy writes early in training; ``step`` must take each without raising.
MALFORMED_OUTPUTS: tuple[tuple[str, str], ...] = (
    ("the empty string", ""),
    ("control characters", "\x00\x01\x1b[31m\x7f\r\n\t\x0b\x0c"),
    ("a 10,000-character text", "left " * 2000),
    ("unbalanced tags", "<answer><answer>right</think></answer></answer><answer"),
    ("non-ASCII text", "réponse: 右 ↑ \U0001f600 <answer>\u200bdroite\u00a0</answer>"),
)

#: Steps fed to one episode of a multi-turn env (the same malformed text each turn) before the next text.
STEPS_PER_EPISODE = 3


def _short(x: Any, n: int = 120) -> str:
    """``repr(x)`` on one line, at most ``n`` characters."""
    r = " ".join(repr(x).split())
    return r if len(r) <= n else r[: n - 3] + "..."


def observation_problem(obs: Any, where: str) -> str | None:
    """What is wrong with ``obs`` as an ``rlkit.types.Observation`` (None: nothing): ``text`` a str, ``images`` a
    list or tuple of non-empty PIL images that convert to RGB. ``where`` names the call that returned it."""
    if not isinstance(obs, Observation):
        return f"{where} returned {type(obs).__name__}, not rlkit.types.Observation(text, images)"
    if not isinstance(obs.text, str):
        return f"{where} returned an Observation whose text is {type(obs.text).__name__}, not str"
    if not isinstance(obs.images, (list, tuple)):
        return (f"{where} returned an Observation whose images is a bare {type(obs.images).__module__}."
                f"{type(obs.images).__name__}, not a list of PIL images: wrap it, images=[image]")
    for i, im in enumerate(obs.images):
        if not isinstance(im, Image.Image):
            return (f"{where} returned an Observation whose images[{i}] is a {type(im).__module__}."
                    f"{type(im).__name__}, not a PIL.Image.Image: convert it (PIL.Image.fromarray for an array)")
        if im.width < 1 or im.height < 1:
            return f"{where} returned an Observation whose images[{i}] is empty ({im.width}x{im.height} px)"
        try:
            im.convert("RGB")
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            return f"{where} returned an Observation whose images[{i}] (mode {im.mode}) does not convert to RGB: {e}"
    return None


def step_problem(out: Any, where: str) -> str | None:
    """What is wrong with ``out`` as an ``rlkit.types.StepOutput`` (None: nothing): reward a finite real number,
    done a bool, info a JSON-serialisable dict, observation None or a valid Observation."""
    if not isinstance(out, StepOutput):
        return f"{where} returned {type(out).__name__}, not rlkit.types.StepOutput(observation, reward, done, info)"
    if isinstance(out.reward, bool) or not isinstance(out.reward, numbers.Real) or not math.isfinite(out.reward):
        return f"{where} returned reward {_short(out.reward)}, not a finite float"
    if not isinstance(out.done, bool) and type(out.done).__name__ != "bool_":  # numpy's bool passes
        return f"{where} returned done {_short(out.done)} ({type(out.done).__name__}), not a bool"
    if not isinstance(out.info, dict):
        return f"{where} returned info of type {type(out.info).__name__}, not a dict"
    try:
        json.dumps(out.info)
    except (TypeError, ValueError) as e:
        return f"{where} returned an info dict that is not JSON-serialisable ({e})"
    if out.observation is not None:
        return observation_problem(out.observation, where)
    return None


def _success_problem(env: Any, where: str) -> str | None:
    try:
        ok = env.success()
    except Exception as e:  # noqa: BLE001
        return f"{where}: success() raised {type(e).__name__}: {_short(str(e), 160)}"
    if not isinstance(ok, bool) and type(ok).__name__ != "bool_":
        return f"{where}: success() returned {_short(ok)} ({type(ok).__name__}), not a bool"
    return None


def env_contract_problem(env_spec: Any, train_seed: int | None = None) -> str | None:
    """The first way ``env_spec``'s episodes break rlkit.types' contract, as one line, or None.

    Args:
        env_spec: an ``rlkit.types.EnvSpec``.
        train_seed: a seed training draws (default: the first seed ``rlkit.tasks.TaskSampler(0, ...)`` draws).

    Plays, each on a fresh ``make()``: ``reset`` on ``train_seed`` and on ``eval_seeds()[0]``, then for each of
    ``MALFORMED_OUTPUTS`` an episode (seeds alternating) stepped with it up to ``min(max_turns, 3)`` times or until
    done, checking every return and ``success()``. Raises nothing: an exception of the env is the finding.
    """
    from rlkit.tasks import TaskSampler

    cls = type(env_spec).__name__
    try:
        eval_seed = int(env_spec.eval_seeds()[0])
        if train_seed is None:
            train_seed = TaskSampler(0, env_spec.is_eval_seed).sample(1)[0]
        env = env_spec.make()
    except Exception as e:  # noqa: BLE001
        return f"{cls}: make()/eval_seeds()/is_eval_seed() raised {type(e).__name__}: {_short(str(e), 160)}"
    ep_cls = type(env).__name__
    if not isinstance(env, EpisodeEnv):  # the rollout reads system_prompt and calls reset, step, success
        missing = [m for m in ("system_prompt", "reset", "step", "success") if not hasattr(env, m)]
        return f"{ep_cls} has no {', '.join(missing)} (rlkit.types.EpisodeEnv; system_prompt None for no system message)"
    prompt = env.system_prompt
    if prompt is not None and not isinstance(prompt, str):
        return f"{ep_cls}.system_prompt is {type(prompt).__name__}, not str or None"
    seeds = (train_seed, eval_seed)
    for seed, kind in zip(seeds, ("training", "evaluation")):
        try:
            obs = env_spec.make().reset(seed)
        except Exception as e:  # noqa: BLE001
            return f"{ep_cls}.reset({seed}) (a {kind} seed) raised {type(e).__name__}: {_short(str(e), 160)}"
        if (p := observation_problem(obs, f"{ep_cls}.reset({seed})")) is not None:
            return p
    for k, (what, text) in enumerate(MALFORMED_OUTPUTS):
        env, seed = env_spec.make(), seeds[k % 2]
        try:
            env.reset(seed)
        except Exception as e:  # noqa: BLE001
            return f"{ep_cls}.reset({seed}) raised {type(e).__name__}: {_short(str(e), 160)}"
        for _turn in range(min(int(env_spec.max_turns), STEPS_PER_EPISODE)):
            where = f"{ep_cls}.step({what}) on task {seed}"
            try:
                out = env.step(text)
            except Exception as e:  # noqa: BLE001
                return (f"{where} raised {type(e).__name__}: {_short(str(e), 160)}; EpisodeEnv.step must not raise "
                        "on malformed model output: return StepOutput(..., info={'parse_ok': False}) instead")
            if (p := step_problem(out, where)) is not None:
                return p
            if out.done or out.observation is None:
                break
        if (p := _success_problem(env, f"{ep_cls} after {what}")) is not None:
            return p
    return None


def check_env(env_spec: Any, name: str | None = None) -> Any:
    """Refuse an env that breaks rlkit.types' contract before any work; return ``env_spec`` unchanged.

    Args:
        env_spec: an ``rlkit.types.EnvSpec`` (what ``conf/env/<name>.yaml`` instantiates).
        name: how the message names the env (default: its class name).

    Returns: ``env_spec``.

    Raises:
        EnvContractError (a ConfigError: train.py prints it as one ``[rlkit] config error:`` line): the first broken
            check of ``env_contract_problem``, naming the contract and ``CONTRACT_DOC``.

    Follows gymnasium's ``check_env`` (gymnasium.utils.env_checker): a short play of the env with no learner,
    checking the declared types of reset and step, before a learner is run on it.
    """
    problem = env_contract_problem(env_spec)
    if problem is not None:
        label = name or type(env_spec).__name__
        raise EnvContractError(f"env {label} breaks the env contract (rlkit.types, {CONTRACT_DOC}): {problem}")
    return env_spec


def step_error(env: Any, text: str, err: Exception) -> EnvContractError:
    """The error to raise ``from err`` when ``env.step(text)`` raised during training (rlkit.rollout): names the
    env class, the contract it broke and the frame that raised (file:line in function); the env's own traceback
    stays chained as its cause."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    said = " ".join(str(err).split())
    said = said if len(said) <= 160 else said[:157] + "..."
    return EnvContractError(
        f"{type(env).__name__}.step raised {type(err).__name__}: {said}{at}; EpisodeEnv.step must not raise on "
        f"malformed model output (return info['parse_ok']=False instead; {CONTRACT_DOC}). The model output: "
        f"{_short(text, 80)}. The env's traceback is chained below this error (a train.py run: its error.txt)")
