"""Learning-rate schedules of the GRPO update and the one-time builds (pure functions of the step).

``warmup_schedule`` gives the multiplier of the base lr at an optimizer step: a linear warmup, then
constant or a half cosine to 0 (SGDR without restarts: Loshchilov & Hutter 2017). ``make_scheduler``
wraps it in torch's LambdaLR for the GRPO loop (one scheduler step per GRPO step).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

LR_SCHEDULES = ("constant", "cosine")


def warmup_schedule(schedule: str, warmup_steps: int, total_steps: int, name: str = "lr_schedule") -> Callable[[int], float]:
    """The lr multiplier at optimizer step ``step`` (0-based): linear warmup from 1/``warmup_steps`` to 1 over
    ``warmup_steps`` steps, then 1 (``constant``) or a half cosine from 1 to 0 at ``total_steps``
    (``cosine``, SGDR without restarts: Loshchilov & Hutter 2017), 0 after it.

    Raises: ValueError naming ``name`` on an unknown ``schedule``.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"{name}={schedule!r}: use constant or cosine")
    warm = max(warmup_steps, 0)

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if schedule == "cosine":
            progress = (step - warm) / max(total_steps - warm, 1)
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
        return 1.0

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``cfg.warmup_steps`` GRPO steps, then constant or cosine to 0 at ``total_steps``.

    Raises: ValueError on an unknown ``cfg.lr_schedule``.
    """
    factor = warmup_schedule(cfg.lr_schedule, cfg.warmup_steps, total_steps, "optim.lr_schedule")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


