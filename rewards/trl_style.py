"""TRL-style batched reward functions as rlkit rewards.

TRL's ``GRPOTrainer`` takes ``reward_funcs``: functions called with keyword arguments ``prompts`` and
``completions`` (lists, one entry per sample), one list per dataset column other than ``prompt`` under the column's
name, and more TRL may add (``completion_ids``, ``trainer_state``), returning a list with one float per completion,
or None for a sample the function does not apply to (TRL then counts that function out of the sample's reward, and
a sample no function applies to gets 0 from its sum). Prompts and completions are strings in TRL's standard format,
lists of ``{"role", "content"}`` messages in its conversational one (each completion a list of one assistant
message). ``TRLReward`` calls such a function on one rlkit ``Episode`` at a time (a batch of one), so a function
written for TRL trains here unchanged; ``answer_block_match`` is one, the shape of TRL's accuracy rewards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from rlkit.import_path import import_object
from rlkit.types import Episode, RewardOutput


def resolve_function(func: str | Callable) -> Callable:
    """``func`` itself when callable, else the function at import path ``"package.module.function"``.

    Raises:
        ValueError: not a dotted path, a module that does not import, no such attribute in it, or one that is not
            callable (each names ``reward.func``, the path and the fix; rlkit.import_path.import_object).
    """
    fn = import_object(func, "reward.func")
    if not callable(fn):
        raise ValueError(f"reward.func {func!r} is a {type(fn).__name__}, not a function")
    return fn


class TRLReward:
    """A TRL-style batched reward function (``f(prompts, completions, **kwargs) -> list[float | None]``, TRL
    GRPOTrainer's ``reward_funcs`` signature) as an rlkit reward (``rlkit.types.RewardFn``).

    Each call passes one episode as a batch of one: ``completions`` is ``[text]``, the episode's turn texts joined
    by newlines (``conversational``: ``[[{"role": "assistant", "content": text}, ...]]``, one message per turn);
    ``prompts`` is ``[info[prompt_key]]`` of the first turn (``""`` / no message when ``prompt_key`` is None:
    an rlkit Episode does not carry the prompt text); each ``columns`` entry ``kwarg: info_key`` passes
    ``kwarg=[last turn's info[info_key]]``, as TRL passes a dataset column. ``completion_ids`` and
    ``trainer_state`` are not passed. An episode without turns gets 0 without a call.

    Args:
        func: the function, or its import path ``"package.module.function"`` (a module on PYTHONPATH).
        columns: TRL keyword argument -> the env's per-turn info key (default: none).
        prompt_key: the info key holding the prompt text, or None.
        conversational: TRL's conversational format instead of the standard one (strings).
        none_as: the total when the function returns None (TRL: not applicable), default 0.0, as TRL's sum over
            reward functions gives a sample no function applies to.
        name: the reward's name in logs (default: the function's ``__name__``).

    Output: ``RewardOutput(total, {name: total, "applicable": 1.0 or 0.0})``; ``info_keys``: the info keys read.

    Raises:
        ValueError: a bad ``func`` (see ``resolve_function``), ``columns`` not a mapping of str to str, or a
            non-finite ``none_as``; on call, a last turn without a ``columns`` key (names it and the episode seed)
            or a return value that is not a list of one float or None (names the function and what it returned).
    """

    def __init__(self, func: str | Callable, columns: Mapping[str, str] | None = None, prompt_key: str | None = None,
                 conversational: bool = False, none_as: float = 0.0, name: str | None = None):
        self.func = resolve_function(func)
        columns = dict(columns or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
            raise ValueError(f"reward.columns must map TRL keyword names to info keys (str: str), got {columns!r}")
        clash = sorted({"prompts", "completions"} & set(columns))
        if clash:
            raise ValueError(f"reward.columns may not name {clash}: TRL passes those itself")
        if not math.isfinite(float(none_as)):
            raise ValueError(f"reward.none_as must be a finite number, got {none_as!r}")
        self.columns = columns
        self.prompt_key = prompt_key
        self.conversational = bool(conversational)
        self.none_as = float(none_as)
        self.name = name or getattr(self.func, "__name__", "trl_reward")
        self.info_keys: tuple[str, ...] = tuple(dict.fromkeys([*columns.values(), *([prompt_key] if prompt_key else [])]))

    def __repr__(self) -> str:
        return f"TRLReward({getattr(self.func, '__qualname__', self.func)!r}, columns={self.columns!r})"

    def _info(self, episode: Episode, turn: int, key: str) -> Any:
        info = episode.turns[turn].info
        if key not in info:
            raise ValueError(f"reward {self.name!r} needs turn.info[{key!r}] from the env, which this env does not "
                             f"report (episode seed {episode.seed}; info keys: {sorted(info)})")
        return info[key]

    def __call__(self, episode: Episode) -> RewardOutput:
        if not episode.turns:
            return RewardOutput(0.0, {self.name: 0.0, "applicable": 0.0})
        texts = [t.action_text for t in episode.turns]
        prompt = "" if self.prompt_key is None else self._info(episode, 0, self.prompt_key)
        if self.conversational:
            completion: Any = [{"role": "assistant", "content": t} for t in texts]
            prompt = [] if self.prompt_key is None else [{"role": "user", "content": prompt}]
        else:
            completion = "\n".join(texts)
        kwargs = {kw: [self._info(episode, -1, key)] for kw, key in self.columns.items()}
        out = self.func(prompts=[prompt], completions=[completion], **kwargs)
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise ValueError(f"reward function {self.name!r} returned {out!r} for a batch of one completion; a TRL "
                             "reward function returns a list with one float (or None) per completion")
        value = out[0]
        if value is None:
            return RewardOutput(self.none_as, {self.name: self.none_as, "applicable": 0.0})
        try:
            total = float(value)  # a float, int, bool or numpy / torch scalar, as TRL's tensor of rewards takes
        except (TypeError, ValueError):
            raise ValueError(f"reward function {self.name!r} returned [{value!r}]: expected a float or None") from None
        return RewardOutput(total, {self.name: total, "applicable": 1.0})


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_block_match(prompts: list, completions: list, solution: list, **kwargs: Any) -> list[float | None]:
    """A TRL-style reward function (GRPOTrainer ``reward_funcs`` signature): 1.0 for each completion whose first
    ``<answer>...</answer>`` block, stripped, equals its ``solution`` entry (as a string), else 0.0; None where the
    solution is None (not applicable). Standard (str) or conversational (the last message's content) completions.
    Returns one entry per completion."""
    out: list[float | None] = []
    for completion, sol in zip(completions, solution):
        if sol is None:
            out.append(None)
            continue
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        m = _ANSWER.search(text)
        out.append(1.0 if m is not None and m.group(1).strip() == str(sol) else 0.0)
    return out
