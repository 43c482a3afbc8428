#!/usr/bin/env python
"""Report of a run or a sweep: PNG plots and one self-contained HTML page.

    python scripts/report.py outputs/<date>/<time>            # one run
    python scripts/report.py multirun/<date>/<time>           # a sweep: jobs side by side, best highlighted
    python scripts/report.py RUN_DIR --out /tmp/rep --mazes 8

Writes <RUN_OR_SWEEP_DIR>/report/report.html (images embedded as base64, so the page can be mailed
or attached alone) and the PNGs next to it; prints the page's path. Exit status 2 when the folder
holds no rlkit job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkit.report import build_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="a run folder (outputs/...) or a sweep folder (multirun/...)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: PATH/report)")
    ap.add_argument("--mazes", type=int, default=6, help="evaluation mazes drawn per strip (default 6)")
    args = ap.parse_args(argv)
    try:
        rep = build_report(args.path, args.out, mazes=args.mazes)
    except FileNotFoundError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    for n in rep.notes:
        print(f"report: note: {n}", file=sys.stderr)
    best = f" (best: job {', '.join(rep.best)})" if rep.best else ""
    print(f"report: {rep.html}{best}; {len(rep.images)} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
