"""Small shared pieces of the command-line scripts."""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except for options whose help already says their default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)
