"""An env and a reward from outside the clone (docs/adding-an-env.md, "An env outside the clone"): their own folder with
a Python module and a conf/ of YAMLs, found through Hydra's search path (``hydra.searchpath=[file://...]``) and
PYTHONPATH. The env is a gymnasium env through envs/gym_text.py, the reward a TRL-style function through
rewards/trl_style.py: a short smoke run trains on them."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.rewards.reward_check import check_reward_config, env_episodes

ROOT = Path(__file__).resolve().parents[2]

ENV_YAML = """# Count the dots: a gymnasium env from outside the clone, played through envs.gym_text.
_target_: envs.gym_text.GymTextEnv
env_id: dots_ext:dots-ext/Dots-v0   # gymnasium imports dots_ext (on PYTHONPATH), which registers the id
parser: dots_ext.parse_count        # text -> action; raises on junk: an invalid action, never an exception
solver: dots_ext.solve              # seed -> the solved episode's texts: the SFT warm start's demonstrations
system_prompt: How many white dots are in the picture? Answer with one digit, 1 to 4.
prompt: How many dots?
invalid: end                        # single-turn: an unreadable answer ends the episode, unsolved
eval_size: 16
"""

REWARD_YAML = """# The dots env's TRL-style reward function (dots_ext.count_reward), through rewards.trl_style.
_target_: rewards.trl_style.TRLReward
func: dots_ext.count_reward
columns:
  expected: expected
timeout_s: 60
on_error: raise
"""


def out_of_tree(tmp_path: Path) -> tuple[Path, Path]:
    """``(ext, conf)``: a module folder and a config root outside the clone, as a user of rlkit would write them
    (the module is tests/envs/gym_dots.py under another name and gymnasium id)."""
    ext, conf = tmp_path / "ext", tmp_path / "conf"
    ext.mkdir()
    source = (ROOT / "tests" / "envs" / "gym_dots.py").read_text().replace("rlkit-test/Dots-v0", "dots-ext/Dots-v0")
    (ext / "dots_ext.py").write_text(source)
    (conf / "env").mkdir(parents=True)
    (conf / "reward").mkdir()
    (conf / "env" / "dots.yaml").write_text(ENV_YAML)
    (conf / "reward" / "dots_count.yaml").write_text(REWARD_YAML)
    return ext, conf


def _train(args, tmp_path, ext, timeout=300):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", RLKIT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ext)]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_out_of_tree_reward_passes_the_generic_check_on_its_env(tmp_path, monkeypatch):
    ext, conf = out_of_tree(tmp_path)
    monkeypatch.syspath_prepend(str(ext))
    dots = env_episodes(conf / "env" / "dots.yaml")
    assert dots.solved.success and {"count", "expected", "parse_ok"} <= dots.info_keys
    assert check_reward_config(conf / "reward" / "dots_count.yaml", {"dots": dots}) == ["dots"]


def test_an_out_of_tree_gymnasium_env_and_trl_reward_train(tmp_path):
    ext, conf = out_of_tree(tmp_path)
    out = tmp_path / "run"
    proc = _train(["experiment=smoke", "env=dots", "reward=dots_count", f"hydra.searchpath=[file://{conf}]",
                   "logger=console", f"hydra.run.dir={out}"], tmp_path, ext)
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["steps_completed"] == 2
    assert result["eval_set"] == "dots_16" and result["policy_turns"] == 1
    assert Path(result["warm_start_dir"]).parent.name == "sft"  # the warm start ran on the solver's texts
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward/mean" in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(0.0 <= s["reward/count_reward"] <= 1.0 and s["reward/applicable"] == 1.0 for s in steps)
    final = json.loads((out / "eval" / "final.json").read_text())
    assert [t["seed"] for t in final["tasks"]] == [0, 1, 2, 3]
    # without the search path the group option is unknown, and Hydra says so before any work
    proc = _train(["experiment=smoke", "env=dots", f"hydra.run.dir={tmp_path / 'no'}"], tmp_path, ext, timeout=120)
    assert proc.returncode != 0 and "Could not find 'env/dots'" in proc.stderr + proc.stdout
