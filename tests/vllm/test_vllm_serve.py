"""``scripts/serve.py --adapter RUN --engine vllm`` end to end: a real run's adapter on the real vLLM OpenAI server.

rlkit's side runs where rlkit runs (.venv, transformers 5.8.1): ``train.py experiment=smoke`` makes the run
(with LoRA on the language model and the vision side, without the Conv3d patch embedding vLLM cannot apply),
``scripts/serve.py --engine vllm`` starts vLLM from .venv-vllm and probes it against rlkit's engine before it
says it is ready, and ``scripts/play.py`` plays the run's evaluation mazes through it. Greedy, float32: the
per-maze outcomes (every reply text) must equal the run's own evaluation (eval/final.json). With ``--api-key``, and
the openai client streaming a greedy answer with logprobs: the non-streamed answer, token for token.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="vllm: needs .venv-vllm (bash scripts/test_vllm.sh)")

ROOT = Path(__file__).resolve().parents[2]
RLKIT_PYTHON = Path(os.environ.get("RLKIT_REFERENCE_PYTHON", ROOT / ".venv" / "bin" / "python"))
#: The API key serve.py is started with (--api-key; vLLM gets it as VLLM_API_KEY).
KEY = "vllm-test-key"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "RLKIT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("VIRTUAL_ENV", None)
    env.pop("WANDB_API_KEY", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    if not RLKIT_PYTHON.is_file():
        pytest.skip(f"rlkit's .venv is needed for train.py / serve.py / play.py ({RLKIT_PYTHON}; bash scripts/setup.sh)")
    tmp = tmp_path_factory.mktemp("vllm_serve")
    out = tmp / "run"
    proc = subprocess.run([str(RLKIT_PYTHON), str(ROOT / "train.py"), "experiment=smoke", "logger=console",
                           "policy.dtype=float32", f"hydra.run.dir={out}"],
                          check=False, cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the default recipe's adapter (all-linear with the vision tower): its linears, not the Conv3d patch embedding
    from safetensors import safe_open

    with safe_open(str(out / "adapter" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(".visual.blocks." in k for k in keys) and not any("patch_embed" in k for k in keys)
    return out


def _outcomes(path: Path) -> list[dict]:
    return [{k: r[k] for k in ("seed", "success", "turns", "parse_failures", "actions")}
            for r in json.loads(path.read_text())["tasks"]]


def test_serve_engine_vllm_plays_the_runs_eval_exactly(run_dir, tmp_path):
    import openai

    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as f:
        server = subprocess.Popen([str(RLKIT_PYTHON), str(ROOT / "scripts" / "serve.py"), "--adapter", str(run_dir),
                                   "--engine", "vllm", "--port", str(port), "--threads", "1", "--api-key", KEY],
                                  cwd=ROOT, env=_env(run_dir.parent), stdout=f, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while "[rlkit] vLLM serving" not in log.read_text():
            assert server.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() - t0 < 300, log.read_text()[-4000:]
            time.sleep(1)
        text = log.read_text()
        # the command rlkit launched: the CPU build's server module, the tower flag for the vision-side LoRA
        launched = next(line for line in text.splitlines() if line.startswith("[rlkit] starting vLLM: "))
        assert "-m vllm.entrypoints.openai.api_server --model " in launched
        assert "--enable-tower-connector-lora" in launched and "--served-model-name base" in launched
        worst = float(re.search(r"probe: 2 model\(s\) answer as rlkit's engine, largest logprob difference (\S+), "
                                r"tolerance 0.0001 in float32\)", text).group(1))
        assert worst < 1e-4

        with pytest.raises(openai.AuthenticationError):  # --api-key reached vLLM (as VLLM_API_KEY)
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0).models.list()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
        models = {m.id: getattr(m, "parent", None) for m in client.models.list().data}
        assert models == {"base": None, run_dir.name: "base"}
        kw = dict(model=run_dir.name, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "hello"}],
                  logprobs=True, top_logprobs=2)
        reply = client.chat.completions.create(**kw)
        assert reply.usage.completion_tokens >= 1 and reply.choices[0].finish_reason in ("stop", "length")
        # the openai client streams from vLLM and reads its logprobs: the non-streamed answer, token for token
        chunks = list(client.chat.completions.create(**kw, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        once = reply.choices[0].logprobs.content
        assert [e.token for e in streamed] == [e.token for e in once] and len(once) >= 1
        assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, once)) < 1e-4
        assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-4 for e in once)

        play_out = tmp_path / "play.json"
        proc = subprocess.run([str(RLKIT_PYTHON), str(ROOT / "scripts" / "play.py"), "--url",
                               f"http://127.0.0.1:{port}/v1", "--run", str(run_dir), "--out", str(play_out),
                               "--api-key-env", "RLKIT_TEST_KEY"],
                              check=False, cwd=ROOT, env={**_env(run_dir.parent), "RLKIT_TEST_KEY": KEY},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        want, got = _outcomes(run_dir / "eval" / "final.json"), _outcomes(play_out)
        assert len(got) == 4 and got == want
        print(f"serve --engine vllm: play.py equals the run's own eval on {len(got)}/{len(want)} mazes "
              f"(success {sum(r['success'] for r in got)}/{len(got)}); probe logprob difference {worst:.2g}")
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(120)
    assert rc == 0, log.read_text()[-3000:]
    with socket.socket() as s:  # vLLM went down with it
        assert s.connect_ex(("127.0.0.1", port)) != 0
