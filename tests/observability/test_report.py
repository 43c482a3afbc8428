"""scripts/report.py on the 2-job smoke sweep and on a single run; the trajectory drawing."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from envs.visgym import VisGymMaze
from envs.visgym.picture import OK_COLOUR, PATH_COLOUR, episode_cells
from rlkit.report.data import Job, best_job, best_jobs, load
from rlkit.report.episodes import replay, strip, trajectory_image

ROOT = Path(__file__).resolve().parents[2]


def _report(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "report.py"), str(path), *extra],
                          capture_output=True, text=True, timeout=300)


def _check_page(page: Path, min_images: int) -> str:
    text = page.read_text()
    srcs = re.findall(r'<img[^>]*src="([^"]+)"', text)
    assert len(srcs) >= min_images, len(srcs)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)  # self-contained
    for s in srcs:
        raw = base64.b64decode(s.split(",", 1)[1])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r'(href|src)="(https?:|file:|/)', text)
    return text


def test_sweep_report(smoke_sweep):
    proc = _report(smoke_sweep)
    assert proc.returncode == 0, proc.stderr
    out = smoke_sweep / "report"
    page = out / "report.html"
    assert f"report: {page}" in proc.stdout
    for name in ("success.png", "reward.png", "kl_clip.png", "timing.png"):
        with Image.open(out / name) as im:
            assert im.width >= 600 and im.height >= 300, (name, im.size)
    strips = sorted(out.glob("mazes_*.png"))
    # both jobs, before and after training
    assert {p.name for p in strips} == {f"mazes_{j}_{t}.png" for j in ("0", "1") for t in ("step_000000", "final")}
    with Image.open(strips[0]) as im:
        assert im.width > 4 * 175 and im.height > 175  # four eval mazes (7x7 x 25 px) side by side, captions below
    text = _check_page(page, min_images=8)
    assert "rlkit sweep report" in text and "lr=1e-05" in text and "lr=3e-05" in text
    assert 'class="best"' in text  # the best job (or the tied best jobs) highlighted
    assert "Evaluation mazes" in text and "visgym_small_64" in text


def test_single_run_report(smoke_run, tmp_path):
    proc = _report(smoke_run.out, "--out", str(tmp_path / "rep"), "--mazes", "2")
    assert proc.returncode == 0, proc.stderr
    text = _check_page(tmp_path / "rep" / "report.html", min_images=6)
    assert "rlkit run report" in text and 'class="best"' not in text
    with Image.open(tmp_path / "rep" / "mazes_run_final.png") as im:
        assert im.width > 2 * 175 and im.width < 3 * 175  # two 7x7 mazes at 25 px cells (the default env)


def test_report_on_a_folder_without_jobs(tmp_path):
    proc = _report(tmp_path)
    assert proc.returncode == 2 and "holds no rlkit job" in proc.stderr


def test_job_series_and_best(tmp_path):
    def job(name, lines, after):
        return Job(name=name, path=tmp_path / name, lines=lines, result={"eval_success_after": after})

    lines = [{"step": 0, "eval/success_rate": 0.4}, {"step": 1, "reward/mean": 0.1, "trainer/wall_time_s": 5.0},
             {"step": 2, "reward/mean": 0.3, "trainer/wall_time_s": 9.0}, {"step": 2, "eval/success_rate": 0.6}]
    a, b, c = job("0", lines, 0.6), job("1", lines, 0.8), job("2", lines, 0.8)
    assert a.series("reward/mean") == ([1, 2], [0.1, 0.3])
    assert a.series("eval/success_rate") == ([0, 2], [0.4, 0.6])
    assert (a.wall_time_at(0), a.wall_time_at(2)) == (0.0, 9.0)
    assert best_job([a, b]) is b and best_job([a, b, c]) is None and best_jobs([a, b, c]) == [b, c]


def test_load_distinguishes_run_and_sweep(smoke_sweep):
    kind, jobs = load(smoke_sweep)
    assert kind == "sweep" and [j.name for j in jobs] == ["0", "1"] and [j.swept for j in jobs] == ["lr=1e-05", "lr=3e-05"]
    kind, jobs = load(smoke_sweep / "1")
    assert kind == "run" and jobs[0].result["steps_completed"] == 2


@pytest.mark.parametrize("mode,parser", [("plan", "plan"), ("interactive", "tuple")])
def test_drawn_path_follows_the_env(mode, parser):
    spec = VisGymMaze(variant="easy", mode=mode, parser=parser, max_turns=18)
    seed = 5
    solved = replay(spec, seed, spec.demonstration(seed))
    assert solved.success
    cells, stopped = episode_cells("easy", spec.cell_size, seed, solved.infos)
    assert stopped and len(cells) == len(spec.solution(seed))  # start + one cell per move
    if mode == "interactive":  # the env's own per-turn positions are the replayed path
        assert [tuple(i["agent"]) for i in solved.infos if i["action"] != "stop"] == cells[1:]
    img = trajectory_image(spec, seed, solved.infos)
    assert img.size == (225, 225)
    gr, gc = cells[-1]
    assert img.getpixel((gc * 25 + 12, gr * 25 + 12)) == OK_COLOUR  # green dot on the goal
    mid = cells[len(cells) // 2]
    assert img.getpixel((mid[1] * 25 + 12, mid[0] * 25 + 12)) == PATH_COLOUR


def test_failed_and_unparsable_episodes_draw_without_a_path():
    spec = VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)
    garbage = replay(spec, 0, ["no route here"])
    assert not garbage.success and garbage.infos[0]["parse_ok"] is False
    cells, stopped = episode_cells("easy", 25, 0, garbage.infos)
    assert len(cells) == 1 and not stopped
    assert trajectory_image(spec, 0, garbage.infos, scale=0.5).size == (112, 112)
    s = strip([trajectory_image(spec, 0, garbage.infos)] * 2, ["a", "b"])
    assert s.width > 450
    with pytest.raises(ValueError):
        strip([], [])


def test_eval_outcomes_json_matches_the_replay(smoke_run):
    """The run's final.json replays to the same outcomes with the run's configured env."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(smoke_run.out / ".hydra" / "config.yaml")
    spec = instantiate(cfg.env)
    final = json.loads((smoke_run.out / "eval" / "final.json").read_text())
    for t in final["tasks"]:
        rp = replay(spec, t["seed"], t["actions"])
        assert rp.success == t["success"] and rp.turns == t["turns"]


class _PictureSpec:
    """An env spec that offers its own picture of an episode (rlkit.types.EnvSpec.render_trajectory)."""

    def __init__(self):
        self.calls = []

    def render_trajectory(self, seed, infos):
        self.calls.append((seed, infos))
        return Image.new("L", (10, 6), 7)


def test_reports_draw_whatever_env_provides_a_picture():
    spec = _PictureSpec()
    img = trajectory_image(spec, 3, [{"x": 1}], scale=2.0)
    assert spec.calls == [(3, [{"x": 1}])] and img.mode == "RGB" and img.size == (20, 12)


def test_env_without_a_picture_shows_its_first_observation():
    from rlkit.types import Observation

    class _Episode:
        def reset(self, seed):
            return Observation(text="hi", images=[Image.new("RGB", (4, 4), (seed, 0, 0))])

    class _Spec:
        def make(self):
            return _Episode()

    assert trajectory_image(_Spec(), 9, []).getpixel((0, 0)) == (9, 0, 0)


def test_visgym_offers_its_episode_picture():
    spec = VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)
    seed = 2
    infos = replay(spec, seed, spec.demonstration(seed)).infos
    assert (np.asarray(trajectory_image(spec, seed, infos)) == np.asarray(spec.render_trajectory(seed, infos))).all()
