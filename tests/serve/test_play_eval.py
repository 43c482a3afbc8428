"""scripts/play.py against the server reproduces scripts/eval.py maze by maze (greedy decoding).

eval.py evaluates the adapter the way training does (base + LoRA, adapter loaded in place,
rlkit.evaluation.evaluate: batched rollouts with token-level trajectories); play.py plays the
same mazes through HTTP with the official openai client. Same actions, turns and outcomes per maze.
The tiny model's replies are gibberish, so most turns are parse failures; what is compared is
every reply text of every turn, which depends on the whole conversation history.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import openai
import pytest

from .conftest import serving

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.dtype_sensitive


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"rlkit_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(base_dir, adapters):
    with serving(base_dir, [f"maze={adapters['a']}"]) as srv:
        yield srv


def outcomes(path: Path) -> list[dict]:
    rows = json.loads(path.read_text())["tasks"]
    return [{k: r[k] for k in ("seed", "success", "turns", "parse_failures", "actions")} for r in rows]


@pytest.mark.parametrize("env_overrides, num_tasks", [
    (["env=visgym_interactive", "env.max_turns=3"], 3),  # multi-turn: history with images and replies
    (["env=visgym"], 2),  # plan mode: one turn
], ids=["interactive", "plan"])
def test_play_equals_eval_per_maze(server, adapters, tmp_path, env_overrides, num_tasks):
    eval_out, play_out = tmp_path / "eval.json", tmp_path / "play.json"
    # both sides in float32: the server's test host is built without the main job's policy config
    # (auto is bf16 on a CPU with native bf16 matmuls), and greedy replies of a random-weight model must match token for token
    rc = load_script("eval").main([str(adapters["a"]), *env_overrides, "policy.dtype=float32", "--num-tasks", str(num_tasks),
                                   "--out", str(eval_out)])
    assert rc == 0
    rc = load_script("play").main([*env_overrides, "--url", f"{server.url}/v1", "--model", "maze",
                                   "--num-tasks", str(num_tasks), "--concurrency", "2", "--out", str(play_out)])
    assert rc == 0
    want, got = outcomes(eval_out), outcomes(play_out)
    assert [r["seed"] for r in got] == list(range(num_tasks))
    assert got == want
    assert json.loads(eval_out.read_text())["metrics"]["eval/success_rate"] == \
        json.loads(play_out.read_text())["metrics"]["eval/success_rate"]
    if "env=visgym_interactive" in env_overrides:
        assert any(r["turns"] > 1 for r in got), "the interactive case must exercise the history"


def test_play_picks_the_only_adapter_and_reports_errors(server, capsys):
    play = load_script("play")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", max_retries=0)
    assert play.pick_model(client, None) == "maze"
    rc = play.main(["env=visgym", "--url", f"{server.url}/v1", "--model", "nope", "--num-tasks", "1"])
    assert rc == 1 and "404" in capsys.readouterr().err


PLAY_KEY = "play-key-321"


@pytest.fixture(scope="module")
def keyed_server(base_dir, adapters):
    with serving(base_dir, [f"maze={adapters['a']}"], api_key=PLAY_KEY) as srv:
        yield srv


def test_play_sends_the_api_key_as_a_bearer_token(keyed_server, monkeypatch, capsys):
    """--api-key KEY (or --api-key-env VAR) reaches a server that requires the key (its middleware accepts only
    ``Authorization: Bearer KEY``); a wrong or missing key is the server's 401 (exit 1); bad key options exit 2
    before any request."""
    play = load_script("play")
    argv = ["env=visgym", "--url", f"{keyed_server.url}/v1", "--model", "maze", "--num-tasks", "1", "--max-tokens", "4"]
    assert play.main([*argv, "--api-key", PLAY_KEY]) == 0
    assert "play success" in capsys.readouterr().out
    monkeypatch.setenv("RLKIT_PLAY_KEY", PLAY_KEY)
    assert play.main([*argv, "--api-key-env", "RLKIT_PLAY_KEY"]) == 0
    for wrong in (["--api-key", PLAY_KEY + "x"], []):
        capsys.readouterr()
        assert play.main([*argv, *wrong]) == 1
        assert "401" in capsys.readouterr().err
    monkeypatch.setenv("RLKIT_PLAY_EMPTY", "")
    for bad, why in ((["--api-key", ""], "empty key"), (["--api-key-env", "RLKIT_PLAY_EMPTY"], "unset or empty"),
                     (["--api-key", PLAY_KEY, "--api-key-env", "RLKIT_PLAY_KEY"], "one way")):
        assert play.main([*argv, *bad]) == 2
        assert why in capsys.readouterr().err
