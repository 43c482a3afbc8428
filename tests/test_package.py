"""rlkit as a package: conf/ found from a checkout and from an installed wheel, the console commands, and a wheel
built from this repository installed into a fresh venv (uv.lock's versions, base requirements only) running
``rlkit-train experiment=smoke`` from a folder outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"rlkit-train": "rlkit.train:cli", "rlkit-eval": "rlkit.entrypoints:eval_main",
            "rlkit-serve": "rlkit.entrypoints:serve_main", "rlkit-play": "rlkit.entrypoints:play_main",
            "rlkit-report": "rlkit.entrypoints:report_main"}


def test_checkout_finds_its_conf_through_the_package():
    from rlkit.config import COMPAT_FILE, CONF_DIR

    assert CONF_DIR == ROOT / "rlkit" / "conf"  # the package's own folder: a link to conf/ in a checkout
    assert CONF_DIR.resolve() == (ROOT / "conf").resolve()
    assert COMPAT_FILE == CONF_DIR / "compat.yaml" and COMPAT_FILE.is_file()
    assert sorted(p.relative_to(CONF_DIR) for p in CONF_DIR.rglob("*.yaml")) == \
        sorted(p.relative_to(ROOT / "conf") for p in (ROOT / "conf").rglob("*.yaml"))


def test_console_commands_and_their_scripts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == COMMANDS
    from rlkit.entrypoints import SCRIPTS

    for name in ("eval", "serve", "play", "report"):  # the package's copies are the user tools of scripts/
        assert (SCRIPTS / f"{name}.py").resolve() == ROOT / "scripts" / f"{name}.py"
    # what the wheel ships: every config file and the four tools
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["rlkit"]
    shipped = {p for pattern in data for p in (ROOT / "rlkit").glob(pattern)}
    assert {p for p in (ROOT / "rlkit" / "conf").rglob("*.yaml")} <= shipped
    assert {SCRIPTS / f"{n}.py" for n in ("eval", "serve", "play", "report")} <= shipped


def test_every_reader_of_conf_uses_rlkits_conf_dir():
    """In a wheel there is no conf/ beside the packages: the serve config and the validation's option lists read
    rlkit.config.CONF_DIR (the package's copy, or the checkout's conf/ in a clone), as the training app does."""
    import rlkit.recipes.validation as validation
    import rlkit.serve.config as serve_config
    from rlkit.config import CONF_DIR

    assert serve_config.CONF_DIR == validation.CONF == CONF_DIR and (CONF_DIR / "train.yaml").is_file()
    cfg = serve_config.compose(["experiment=smoke"])
    assert cfg.steps == 2  # the smoke experiment's (train.yaml says 150)


def test_rlkit_train_is_train_py(tmp_path):
    """`python train.py` and `rlkit-train` are one Hydra app: the same composed config."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    a = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "--cfg", "job"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    b = subprocess.run([sys.executable, "-c", "import sys; from rlkit.train import cli; sys.argv[0] = 'rlkit-train';"
                        " cli()", "experiment=smoke", "--cfg", "job"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    assert a.stdout == b.stdout and "\nsteps: 2\n" in a.stdout  # the smoke experiment's (train.yaml: 150)


def _uv() -> str | None:
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.is_file() else shutil.which("uv")


def test_wheel_installs_and_runs_smoke_outside_the_checkout(tmp_path):  # 44-53 s here: not marked slow
    """A wheel built from the repository, installed with uv.lock's versions into a fresh venv (base requirements
    only, from uv's cache where setup.sh filled it), runs `rlkit-train experiment=smoke` from another folder."""
    uv = _uv()
    if uv is None:
        pytest.skip("no uv (scripts/setup.sh installs it into .venv)")
    sys.path.insert(0, str(ROOT / "scripts"))
    from pip_index_args import uv_index_args

    args = uv_index_args()
    index = ["--index-strategy", "unsafe-best-match", *args]
    no_constraint = [a for i, a in enumerate(args) if "--constraint" not in (a, args[i - 1] if i else "")]
    dist = tmp_path / "dist"  # sdist, then the wheel from it (as `uv build` makes them)
    subprocess.run([uv, "build", "-q", "-o", str(dist), "--index-strategy", "unsafe-best-match", *no_constraint,
                    str(ROOT)], check=True, timeout=300)
    wheel = next(dist.glob("rlkit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "rlkit/conf/compat.yaml" in names and "rlkit/conf/train.yaml" in names
    assert len([n for n in names if n.startswith("rlkit/conf/")]) == len(list((ROOT / "conf").rglob("*.yaml")))
    assert {f"rlkit/_scripts/scripts/{n}.py" for n in ("eval", "serve", "play", "report")} <= set(names)
    assert not [n for n in names if n.startswith(("bench/", "scripts/", "tests/"))]  # measurements and tests stay home

    pins = tmp_path / "pins.txt"  # uv.lock's versions, the base requirements (no extra)
    subprocess.run([uv, "export", "-q", "--frozen", "--no-hashes", "--no-emit-project", "--project", str(ROOT),
                    "-o", str(pins)], check=True, timeout=120)
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([uv, "pip", "install", "-q", "--python", str(py), *index, "-c", str(pins), "torch", str(wheel)],
                   check=True, timeout=600)
    assert {p.name for p in (venv / "bin").glob("rlkit-*")} == set(COMMANDS)

    work = tmp_path / "elsewhere"  # no train.py, no conf/, not under the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WANDB_API_KEY")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", RLKIT_CACHE_DIR=str(tmp_path / "cache"),
               OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    where = subprocess.run([str(py), "-c", "import rlkit.config as c; print(c.__file__); print(c.CONF_DIR)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's rlkit, not the checkout's

    out = work / "run"
    proc = subprocess.run(["rlkit-train", "experiment=smoke", f"hydra.run.dir={out}"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"rlkit-train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["steps_completed"] == 2
    assert result["eval_set"] == "visgym_small_64" and result["eval_num_tasks"] == 4
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines if "reward/mean" in ln] == [1, 2]
    assert all("policy/loss" in ln for ln in lines if "reward/mean" in ln)
    assert (out / "train.log").is_file()  # Hydra's job name is still `train`
    assert (out / "adapter" / "adapter_model.safetensors").is_file()

    rep = subprocess.run(["rlkit-report", str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert (out / "report" / "report.html").is_file()
    for tool in ("rlkit-eval", "rlkit-serve", "rlkit-play"):  # each runs its packaged script, named as itself
        usage = subprocess.run([tool, "--help"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert usage.returncode == 0 and usage.stdout.startswith(f"usage: {tool} "), usage.stdout[:300] + usage.stderr
