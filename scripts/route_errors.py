"""Where a run's greedy routes go wrong: failed VisGym maze episodes by the kind of their first error.

    python scripts/route_errors.py outputs/<date>/<time>              # every eval/*.json of the run (held-out,
                                                                      # then the trained-on seen_*.json of eval.seen_tasks)
    python scripts/route_errors.py outputs/<date>/<time>/eval/final.json

For each evaluation file: how many episodes failed, and of those how many first walked into a wall (the
picture misread), turned into an open corridor off the route (a planning error), went past the goal,
or stopped short; with the mean position of that first error, and how many of the failed tasks need a
detour (a route longer than the Manhattan distance: envs/visgym/route_errors.py needs_detour). The env's
variant and parser come from the run's .hydra/config.yaml; ``--variant``/``--parser`` set them where the
run has none (a copied eval json) or override it. Without either, easy and plan are assumed, and said so.

    python scripts/route_errors.py copied/final.json --variant small
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from envs.visgym.parsers import PARSER_NAMES, make_parser
from envs.visgym.route_errors import ERROR_KINDS, first_route_error, needs_detour
from envs.visgym.maze import VARIANT_SIZES


def summarize(eval_json: dict, variant: str, parser_name: str) -> dict:
    """Counts of first-error kinds over the failed tasks of one eval file, plus unparsed outputs, and
    the failed and total counts of tasks that need a detour."""
    parser = make_parser(parser_name)
    kinds: Counter = Counter()
    positions: list[int] = []
    failed = detours = detours_failed = 0
    for task in eval_json["tasks"]:
        detour = needs_detour(variant, task["seed"])
        detours += detour
        if task["success"]:
            continue
        failed += 1
        detours_failed += detour
        actions: list[int] = []
        for text in task["actions"]:
            parsed = parser.parse(text)
            if parsed is None:
                kinds["unparsed"] += 1
                break
            actions.extend(parsed.actions)
        else:
            err = first_route_error(variant, task["seed"], actions)
            kinds[err.kind] += 1
            positions.append(err.index)
    return {"tasks": len(eval_json["tasks"]), "failed": failed, "kinds": dict(kinds),
            "detours": detours, "detours_failed": detours_failed,
            "mean_error_position": sum(positions) / len(positions) if positions else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a run folder (its eval/*.json) or one eval json")
    ap.add_argument("--variant", choices=sorted(VARIANT_SIZES),
                    help="the maze variant (env.variant); default: the run's .hydra/config.yaml, else easy")
    ap.add_argument("--parser", choices=list(PARSER_NAMES),
                    help="the plan parser (env.parser); default: the run's config, else plan")
    args = ap.parse_args()
    path = Path(args.path)
    if not path.exists():
        sys.exit(f"route_errors: {path} does not exist; give a run folder (with eval/*.json) or one eval json")
    # step_000000.json, ..., final.json, then the trained-on tasks' seen_step_000000.json, ..., seen_final.json
    files = sorted((path / "eval").glob("*.json"),
                   key=lambda f: (f.stem.startswith("seen_"), f.stem.endswith("final"), f.stem)) if path.is_dir() else [path]
    if not files:
        sys.exit(f"route_errors: no eval/*.json under {path}; give a run folder or an eval json")
    run_dir = path if path.is_dir() else path.parent.parent
    variant, parser_name = "easy", "plan"
    config = run_dir / ".hydra" / "config.yaml"
    if config.is_file():
        env = OmegaConf.load(config).env
        variant, parser_name = env.get("variant", variant), env.get("parser", parser_name)
    elif args.variant is None:
        print(f"route_errors: no {config}; assuming variant {variant!r} (9x9) and parser {parser_name!r}; "
              f"pass --variant small for a 7x7 run", file=sys.stderr)
    variant, parser_name = args.variant or variant, args.parser or parser_name
    cols = [*ERROR_KINDS, "unparsed"]
    print(f"{'file':<22} {'failed':>9} " + " ".join(f"{c:>13}" for c in cols) + "  right moves before the error (mean)  detours failed")
    for i, f in enumerate(files):
        if f.stem.startswith("seen_") and (i == 0 or not files[i - 1].stem.startswith("seen_")):
            print("trained-on tasks (eval.seen_tasks):")
        try:
            outcomes = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            sys.exit(f"route_errors: {f} is not an evaluation json ({e}); give a run folder or one of its eval/*.json")
        s = summarize(outcomes, variant, parser_name)
        pos = "-" if s["mean_error_position"] is None else f"{s['mean_error_position']:.1f}"
        print(f"{f.name:<22} {s['failed']:>4}/{s['tasks']:<4} "
              + " ".join(f"{s['kinds'].get(c, 0):>13}" for c in cols) + f"  {pos:>35}  {s['detours_failed']}/{s['detours']}")


if __name__ == "__main__":
    main()
