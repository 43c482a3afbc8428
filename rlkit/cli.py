"""Small shared pieces of the command-line scripts."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except for options whose help already says their default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


def _whole_number_at_least(text: str, minimum: int) -> int:
    """``int(text)`` when it is a whole number >= ``minimum``. Raises argparse.ArgumentTypeError saying which not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value}: use a number >= {minimum}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type`` for a count that must be >= 1 (``--num-tasks``, ``--batch-size``, ``--threads``): a clear
    error otherwise."""
    return _whole_number_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse ``type`` for a whole number >= 0 (a seed, ``--reading-seed``): a clear error otherwise."""
    return _whole_number_at_least(text, 0)


def first_eval_seeds(seeds: list[int], num_tasks: int | None, eval_set: str) -> list[int]:
    """The first ``num_tasks`` of an evaluation set's seeds (None or 0: all of them).

    Raises: ValueError when ``num_tasks`` is negative or more than the set holds (names the set's size)."""
    if not num_tasks:
        return list(seeds)
    if not 1 <= num_tasks <= len(seeds):
        raise ValueError(f"--num-tasks {num_tasks}: {eval_set} holds {len(seeds)} tasks; use 1..{len(seeds)}")
    return list(seeds[:num_tasks])


def port(text: str) -> int:
    """argparse ``type`` for a TCP port: 0 (any free port) .. 65535, a clear error otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: a port is 0..65535")
    return value
