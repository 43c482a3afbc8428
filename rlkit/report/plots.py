"""Report plots (matplotlib, Agg backend: no display needed), one PNG per figure.

Every figure overlays all jobs (one colour each); the best job of a sweep (highest final eval
success) is drawn thicker and marked with a star in the legend. Units: steps are GRPO steps,
wall time is training wall time in minutes (``trainer/wall_time_s``; evaluations and checkpoints
of the steps included), phase times in seconds.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from rlkit.report.data import Job  # noqa: E402

PHASES = (("timing/rollout", "rollout"), ("timing/reward", "reward"), ("timing/train", "update"), ("timing/eval", "eval"))
DPI = 110
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def _style(jobs: list[Job], best: Job | None) -> list[tuple[Job, dict]]:
    cmap = plt.get_cmap("tab10")
    out = []
    for i, j in enumerate(jobs):
        is_best = best is not None and j is best and len(jobs) > 1
        out.append((j, {"color": cmap(i % 10), "lw": 2.8 if is_best else 1.4, "alpha": 1.0 if is_best else 0.85,
                        "label": ("★ " if is_best else "") + j.label, "zorder": 3 if is_best else 2,
                        "marker": MARKERS[i % len(MARKERS)]}))
    return out


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=8, loc="best")


def _steps_axis(ax) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _wall_unit(jobs: list[Job]) -> tuple[float, str]:
    """Divisor and unit for wall-time axes: minutes, or seconds for runs under two minutes."""
    longest = max((j.wall_time_at(s) or 0.0 for j in jobs for s in j.series("trainer/wall_time_s")[0]), default=0.0)
    return (60.0, "min") if longest >= 120 else (1.0, "s")


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes, color="gray")


def success(jobs: list[Job], best: Job | None, path: Path) -> Path:
    """Eval success (markers) and training rollout success (dashed) vs step; eval success vs wall time."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    div, unit = _wall_unit(jobs)
    any_eval = False
    for j, st in _style(jobs, best):
        steps, vals = j.series("eval/success_rate")
        if steps:
            any_eval = True
            a.plot(steps, [100 * v for v in vals], marker=st["marker"], ms=5, color=st["color"], lw=st["lw"],
                   alpha=st["alpha"], label=st["label"], zorder=st["zorder"])
            walls = [(j.wall_time_at(s), v) for s, v in zip(steps, vals)]
            walls = [(w / div, 100 * v) for w, v in walls if w is not None]
            if walls:
                b.plot(*zip(*walls), marker=st["marker"], ms=5, color=st["color"], lw=st["lw"], alpha=st["alpha"],
                       label=st["label"], zorder=st["zorder"])
        ts, tv = j.series("reward/success_rate")
        if ts:
            a.plot(ts, [100 * v for v in tv], ls="--", lw=1.0, color=st["color"], alpha=0.55)
    a.set(title="success vs step (markers: eval, dashed: training rollouts)", xlabel="GRPO step", ylabel="success (%)")
    b.set(title="eval success vs training wall time", xlabel=f"wall time ({unit})", ylabel="success (%)")
    _steps_axis(a)
    for ax in (a, b):
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        _legend(ax)
    if not any_eval:
        _empty(a, "eval/success_rate")
        _empty(b, "eval/success_rate")
    return _save(fig, path)


def reward(jobs: list[Job], best: Job | None, path: Path) -> Path:
    """Left: mean training reward per step with a band of +- one standard deviation over the step's
    episodes. Right: the share of groups whose G rewards are all equal (no GRPO learning signal)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    seen = seen_zv = False
    for j, st in _style(jobs, best):
        steps, mean = j.series("reward/mean")
        if steps:
            seen = True
            std = dict(zip(*j.series("reward/std")))
            a.plot(steps, mean, color=st["color"], lw=st["lw"], alpha=st["alpha"], label=st["label"],
                   zorder=st["zorder"], marker=st["marker"], ms=4)
            lo = [m - std.get(s, 0.0) for s, m in zip(steps, mean)]
            hi = [m + std.get(s, 0.0) for s, m in zip(steps, mean)]
            a.fill_between(steps, lo, hi, color=st["color"], alpha=0.12)
        zs, zv = j.series("reward/zero_variance_groups")
        if zs:
            seen_zv = True
            b.plot(zs, [100 * v for v in zv], color=st["color"], lw=st["lw"], alpha=st["alpha"], label=st["label"],
                   zorder=st["zorder"], marker=st["marker"], ms=4)
    a.set(title="training reward (mean ± std)", xlabel="GRPO step", ylabel="reward")
    b.set(title="groups without signal (all G rewards equal)", xlabel="GRPO step", ylabel="groups (%)")
    b.set_ylim(-3, 103)
    for ax, ok, key in ((a, seen, "reward/mean"), (b, seen_zv, "reward/zero_variance_groups")):
        ax.grid(alpha=0.3)
        _steps_axis(ax)
        _legend(ax) if ok else _empty(ax, key)
    return _save(fig, path)


def kl_clip(jobs: list[Job], best: Job | None, path: Path) -> Path:
    """``policy/approx_kl`` (k3 estimate between the sampling and the updated policy, CleanRL's
    approx_kl) and ``policy/clip_ratio`` (share of tokens whose ratio was clipped) per step."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, key, title in ((axes[0], "policy/approx_kl", "approx KL (policy/approx_kl)"),
                           (axes[1], "policy/clip_ratio", "clip ratio (policy/clip_ratio)")):
        seen = False
        for j, st in _style(jobs, best):
            steps, vals = j.series(key)
            if steps:
                seen = True
                ax.plot(steps, vals, color=st["color"], lw=st["lw"], alpha=st["alpha"], label=st["label"],
                        zorder=st["zorder"], marker=st["marker"], ms=4)
        ax.set(title=title, xlabel="GRPO step")
        _steps_axis(ax)
        ax.grid(alpha=0.3)
        _legend(ax) if seen else _empty(ax, key)
    return _save(fig, path)


def timing(jobs: list[Job], best: Job | None, path: Path) -> Path:
    """Left: seconds per step in rollout (solid) and update (dashed). Right: total seconds per phase
    and job (stacked bars: rollout, reward, update, eval)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    seen = False
    for j, st in _style(jobs, best):
        for key, ls in (("timing/rollout", "-"), ("timing/train", "--")):
            steps, vals = j.series(key)
            if steps:
                seen = True
                a.plot(steps, vals, ls=ls, color=st["color"], lw=st["lw"] * 0.8, alpha=st["alpha"],
                       label=f"{st['label']} · {'rollout' if key == 'timing/rollout' else 'update'}",
                       marker=st["marker"], ms=4)
    a.set(title="time per step (solid: rollout, dashed: update)", xlabel="GRPO step", ylabel="seconds")
    _steps_axis(a)
    a.grid(alpha=0.3)
    _legend(a) if seen else _empty(a, "timing/*")
    labels = [("★ " if (best is j and len(jobs) > 1) else "") + j.label for j in jobs]
    left = [0.0] * len(jobs)
    colours = plt.get_cmap("Set2")
    for k, (key, name) in enumerate(PHASES):
        vals = [j.total(key) for j in jobs]
        b.barh(range(len(jobs)), vals, left=left, color=colours(k), label=name)
        left = [x + v for x, v in zip(left, vals)]
    b.set_yticks(range(len(jobs)), labels, fontsize=8)
    b.invert_yaxis()
    b.set(title="total time per phase", xlabel="seconds")
    b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(PHASES), frameon=False)
    b.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
