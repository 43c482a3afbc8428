"""The console commands of an installed rlkit (pyproject.toml ``[project.scripts]``).

    rlkit-train ...     # = python train.py ... (rlkit.train: the same Hydra app and config)
    rlkit-eval ...      # = python scripts/eval.py ...
    rlkit-serve ...     # = python scripts/serve.py ...
    rlkit-play ...      # = python scripts/play.py ...
    rlkit-report ...    # = python scripts/report.py ...

The user tools stay files in scripts/ (the docs and the tests run them there); a wheel carries them as package data
under rlkit/_scripts/scripts/ (in a checkout, links to scripts/), and each command runs its file as ``__main__``
with the command's own arguments, so a tool behaves the same from a clone and from an installed wheel.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "_scripts" / "scripts"


def _run_script(name: str) -> None:
    """Run the user tool ``scripts/<name>.py`` as ``__main__`` (its exit status is the command's), as runpy would
    but leaving ``sys.argv[0]`` the command's name, so its usage line says ``rlkit-<name>``."""
    path = SCRIPTS / f"{name}.py"
    if not path.is_file():
        sys.exit(f"rlkit-{name}: {path} is missing from this rlkit install")
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    code = compile(path.read_bytes(), str(path), "exec")
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def eval_main() -> None:
    _run_script("eval")


def serve_main() -> None:
    _run_script("serve")


def play_main() -> None:
    _run_script("play")


def report_main() -> None:
    _run_script("report")
