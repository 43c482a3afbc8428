"""Objects named by import path in a config (``"package.module.name"``), with one error naming the key and the fix.

Used by plug-ins that take a function from the user's own code: a parser or solver of a gymnasium env
(envs/gym_text.py), a TRL-style reward function (rewards/trl_style.py).
"""

from __future__ import annotations

import importlib
from typing import Any


def import_object(path: Any, key: str) -> Any:
    """``path`` itself when it is callable, else the attribute ``name`` of module ``package.module`` for
    ``path = "package.module.name"``, imported now. ``key`` is the config key that gave it (e.g. ``"env.parser"``).

    Raises:
        ValueError: ``path`` is not a dotted str, its module does not import (with the import error and the fix: its
            folder on PYTHONPATH) or has no such attribute; each names ``key`` and ``path``.
    """
    if callable(path):
        return path
    if not isinstance(path, str) or "." not in path.strip("."):
        raise ValueError(f"{key} must be an import path 'package.module.name', got {path!r}")
    module_name, attr = path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{key} {path!r}: module {module_name!r} does not import ({e}); put its folder on "
                         "PYTHONPATH") from None
    if not hasattr(module, attr):
        raise ValueError(f"{key} {path!r}: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)
