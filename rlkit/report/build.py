"""Building a report. ``build_report(path)`` reads every job's ``metrics.jsonl``, ``result.json``,
``eval/*.json`` and ``.hydra/config.yaml`` (``rlkit.report.data``), draws the plots (``rlkit.report.plots``: success vs
step and vs wall time, reward, approx KL, clip ratio, time per phase), re-renders a few evaluation
episodes per job from their seeds and raw outputs with the job's configured env
(``rlkit.report.episodes``: before training and after), and writes ``<out>/report.html`` with every
image embedded as base64 (the page needs no other file) plus the PNGs next to it.
"""

from __future__ import annotations

import base64
import html
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.report import plots
from rlkit.report.data import Job, best_job, best_jobs, load

__all__ = ["Report", "build_report"]


@dataclass
class Report:
    """What ``build_report`` wrote: the HTML page, the PNG files, the best job(s) of a sweep (several
    on a tie), notes (problems met while drawing, also shown on the page)."""

    html: Path
    images: list[Path] = field(default_factory=list)
    kind: str = "run"
    best: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def build_report(path: Path | str, out_dir: Path | str | None = None, mazes: int = 6, max_strip_jobs: int = 8) -> Report:
    """Write the report of the run or sweep at ``path``.

    Args:
        path: a job folder or a sweep folder.
        out_dir: where to write (default ``<path>/report``).
        mazes: evaluation episodes drawn per strip (the first ``mazes`` tasks of the eval file).
        max_strip_jobs: draw strips for at most this many jobs (the best first).

    Returns: a ``Report``. Raises FileNotFoundError when ``path`` holds no rlkit job.
    """
    path = Path(path).resolve()
    kind, jobs = load(path)
    out = Path(out_dir) if out_dir else path / "report"
    out.mkdir(parents=True, exist_ok=True)
    best = best_job(jobs) if kind == "sweep" else None
    top = best_jobs(jobs) if kind == "sweep" else []
    rep = Report(html=out / "report.html", kind=kind, best=[j.name for j in top])
    figs = [
        ("Success rate", plots.success(jobs, best, out / "success.png")),
        ("Reward", plots.reward(jobs, best, out / "reward.png")),
        ("Approx KL and clip ratio", plots.kl_clip(jobs, best, out / "kl_clip.png")),
        ("Time per phase", plots.timing(jobs, best, out / "timing.png")),
    ]
    rep.images += [p for _, p in figs]
    strips = _strips(jobs, best, out, mazes, max_strip_jobs, rep.notes)
    rep.images += [p for _, _, p in strips]
    rep.html.write_text(_page(path, kind, jobs, top, figs, strips, rep.notes))
    return rep


# ------------------------------------------------------------------------------- trajectory strips


def _strips(jobs: list[Job], best: Job | None, out: Path, mazes: int, max_jobs: int,
            notes: list[str]) -> list[tuple[Job, str, Path]]:
    from rlkit.report.episodes import replay, strip, trajectory_image

    ordered = ([best] if best else []) + [j for j in jobs if j is not best]
    made = []
    for job in ordered[:max_jobs]:
        outcomes = job.eval_outcomes()
        if not outcomes:
            continue
        try:
            spec = _env_spec(job)
        except Exception as e:  # the env package or its config cannot be built here: say so on the page
            notes.append(f"job {job.name}: evaluation mazes not drawn, the env could not be built ({e})")
            continue
        tags = [t for t in ("step_000000", "final") if t in outcomes] or [sorted(outcomes)[-1]]
        for tag in tags:
            tasks = outcomes[tag].get("tasks", [])[:mazes]
            if not tasks:
                continue
            images, caps = [], []
            for t in tasks:
                rp = replay(spec, t["seed"], list(t.get("actions", [])))
                img = trajectory_image(spec, t["seed"], rp.infos, scale=1.0)
                if img is None:
                    continue
                if rp.success != bool(t.get("success")):
                    notes.append(f"job {job.name} {tag} seed {t['seed']}: replay success {rp.success} differs "
                                 f"from the recorded {t.get('success')} (env changed since the run?)")
                images.append(img)
                caps.append(f"seed {t['seed']} {'SOLVED' if t.get('success') else 'failed'} · {t.get('turns', rp.turns)} turn(s)")
            if images:
                p = out / f"mazes_{job.name}_{tag}.png"
                strip(images, caps).save(p)
                made.append((job, tag, p))
    return made


def _env_spec(job: Job) -> Any:
    from hydra.utils import instantiate

    cfg = job.config()
    if cfg is None or "env" not in cfg:
        raise FileNotFoundError(f"{job.path}/.hydra/config.yaml with an env node")
    return instantiate(cfg.env)


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1b1b;max-width:1320px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}th{background:#f4f4f4}
tr.best td{background:#fff4c2;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;display:block;margin:6px 0}.strip{overflow-x:auto}
.job{margin:10px 0 18px}.note{color:#8a5a00;font-size:13px}pre{background:#f7f7f7;padding:8px;font-size:12px;overflow-x:auto}
details summary{cursor:pointer;font-size:13px}
"""


def _img(p: Path, alt: str) -> str:
    data = base64.b64encode(Path(p).read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _page(path: Path, kind: str, jobs: list[Job], top: list[Job], figs: list[tuple[str, Path]],
          strips: list[tuple[Job, str, Path]], notes: list[str]) -> str:
    """The HTML page; ``top``: the best job(s) of a sweep, highlighted (several on a tie)."""
    e = html.escape
    starred = {id(j) for j in top} if len(jobs) > 1 else set()
    title = f"rlkit {'sweep' if kind == 'sweep' else 'run'} report"
    rows = []
    for j in jobs:
        res = j.result or {}
        before, after = j.success_before, j.success_after
        delta = "–" if before is None or after is None else f"{100 * (after - before):+.1f} pts"
        cls = ' class="best"' if id(j) in starred else ""
        wall = res.get("wall_time_s")
        rows.append(
            f"<tr{cls}><td>{'★ ' if cls else ''}{e(j.name)}</td><td>{e(j.swept or j.overrides or '–')}</td>"
            f"<td>{e(j.status)}</td><td class=num>{_pct(before)}</td><td class=num>{_pct(after)}</td>"
            f"<td class=num>{delta}</td><td class=num>{e(str(res.get('steps_completed', '–')))}</td>"
            f"<td class=num>{'–' if wall is None else f'{wall:.1f}'}</td>"
            f"<td>{e(str(res.get('eval_set', '–')))} ({e(str(res.get('eval_num_tasks', '–')))} tasks, "
            f"{e(str(res.get('max_turns', '–')))} turn(s))</td><td>{e(str(res.get('wandb_run_id') or '–'))}</td></tr>"
        )
    head = ("<tr><th>job</th><th>swept / overrides</th><th>status</th><th>eval success before</th>"
            "<th>after</th><th>change</th><th>steps</th><th>wall time (s)</th><th>eval set</th><th>W&amp;B run</th></tr>")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f"<div class=meta>{e(str(path))} · {len(jobs)} job(s) · generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))}</div>",
    ]
    if len(top) == 1 and starred:
        b = top[0]
        parts.append(f"<p>Best job: <b>{e(b.name)}</b> ({e(b.label)}), final eval success {_pct(b.success_after)}.</p>")
    elif len(top) > 1:
        names = ", ".join(f"{j.name} ({j.label})" for j in top)
        parts.append(f"<p>Best jobs (tie at {_pct(top[0].success_after)} final eval success): <b>{e(names)}</b>.</p>")
    parts += ["<h2>Jobs</h2>", f"<table>{head}{''.join(rows)}</table>"]
    for name, p in figs:
        parts += [f"<h2>{e(name)}</h2>", _img(p, name)]
    parts.append("<h2>Evaluation mazes</h2>")
    if strips:
        parts.append("<p class=meta>First tasks of the fixed evaluation set, re-rendered from their seeds and the "
                     "policy's outputs: orange = the path taken from the blue start; green dot = stopped on the "
                     "red goal; black cross = stopped elsewhere; gray ring = no stop.</p>")
        for j, tag, p in strips:
            when = "before training (step 0)" if tag == "step_000000" else ("after training" if tag == "final" else tag)
            star = "★ " if id(j) in starred else ""
            parts.append(f"<div class=job><b>{star}{e(j.name)}</b> {e(j.label if j.label != j.name else '')} · {e(when)}"
                         f"<div class=strip>{_img(p, f'{j.name} {tag}')}</div></div>")
    else:
        parts.append("<p class=meta>No evaluation outcomes (eval/*.json) found.</p>")
    for n in notes:
        parts.append(f"<p class=note>{e(n)}</p>")
    parts.append("<h2>Configs</h2>")
    for j in jobs:
        cfg_path = j.path / ".hydra" / "config.yaml"
        if cfg_path.is_file():
            parts.append(f"<details><summary>{e(j.name)}: {e(j.overrides or 'defaults')}</summary>"
                         f"<pre>{e(cfg_path.read_text())}</pre></details>")
    if any(j.result for j in jobs):
        parts.append("<details><summary>result.json of each job</summary><pre>"
                     + e(json.dumps({j.name: j.result for j in jobs}, indent=1)) + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)
