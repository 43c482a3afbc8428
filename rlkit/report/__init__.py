"""Run reports: PNG plots and one self-contained HTML page for a run or a sweep folder.

    python scripts/report.py outputs/2026-11-29/08-46-09        # a run
    python scripts/report.py multirun/2026-11-29/09-00-00       # a sweep: jobs side by side

Modules: ``build`` (``build_report``, the HTML page), ``data`` (reading job folders), ``plots``
(matplotlib figures), ``episodes`` (pictures of evaluation episodes, also used by the training
loop's W&B eval table). ``build_report`` and ``Report`` are imported lazily, so the training loop
importing ``rlkit.report.episodes`` does not load matplotlib.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Report", "build_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rlkit.report import build

        return getattr(build, name)
    raise AttributeError(f"module 'rlkit.report' has no attribute {name!r}")
