"""A small, bounded load test of an OpenAI-compatible endpoint: requests/s and latency percentiles.

    python -m bench.bench_serve                                     # starts a local server (tiny policy + a random adapter)
    python -m bench.bench_serve --url http://127.0.0.1:8000/v1 --model maze --requests 40 --concurrency 4

Sends ``--requests`` chat completions (default 40), ``--concurrency`` at a time (default 4), each a
VisGym maze turn 0 (system prompt, the maze image as a PNG data URL, the question) with
``--max-tokens`` tokens (default 48, rollout.max_new_tokens), temperature 1 and a per-request seed,
through the official ``openai`` client, then stops. Every request has a timeout (``--timeout``
seconds) and there are no retries. Without ``--url`` it starts rlkit's server on 127.0.0.1 (a free
port) with the tiny policy of conf/policy/tiny_vl.yaml (built offline, cached) and an adapter with
random LoRA weights, and stops it at the end. Only loopback addresses are meant as targets here.

Reports (and with ``--json`` writes): requests, errors, wall seconds, requests/s, completion
tokens/s, latency p50/p95/max (seconds, per request, client side).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between order statistics (numpy's default)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_load(client, model: str, messages: list[dict], requests: int, concurrency: int, max_tokens: int) -> dict:
    """Send ``requests`` completions with ``concurrency`` worker threads; returns the report dict."""
    import openai

    latencies: list[float] = []
    tokens = [0]
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            try:
                resp = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                      temperature=1.0, seed=i)
            except openai.OpenAIError as e:
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                tokens[0] += resp.usage.completion_tokens if resp.usage else 0

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "requests": requests, "concurrency": concurrency, "max_tokens": max_tokens, "ok": len(latencies),
        "errors": len(errors), "first_error": errors[0] if errors else None, "wall_s": wall,
        "requests_per_s": len(latencies) / wall if wall > 0 else float("nan"),
        "completion_tokens_per_s": tokens[0] / wall if wall > 0 else float("nan"),
        "latency_p50_s": percentile(latencies, 50), "latency_p95_s": percentile(latencies, 95),
        "latency_max_s": max(latencies) if latencies else float("nan"),
        "latency_mean_s": statistics.fmean(latencies) if latencies else float("nan"),
    }


@contextlib.contextmanager
def local_server(threads: int | None):
    """rlkit's server with the tiny policy (conf/policy/tiny_vl.yaml) and one random adapter, on 127.0.0.1."""
    import torch

    from rlkit.policy import load_policy
    from rlkit.serve.app import ServerSettings, ServerThread, create_app
    from rlkit.serve.config import compose, node
    from rlkit.serve.models import load_host, parse_adapter_arg
    from rlkit.serve.protocol import ServeLimits

    policy_cfg = node(compose([]), "policy")
    policy_cfg.pop("_target_", None)
    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        trained = load_policy(**policy_cfg)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in trained.model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        trained.save_adapter(Path(tmp) / "adapter")
        del trained
        host = load_host(policy_cfg, [parse_adapter_arg(f"bench={tmp}/adapter")])
        app = create_app(host, ServerSettings(limits=ServeLimits(), num_threads=threads))
        with ServerThread(app) as srv:
            yield f"{srv.url}/v1", "bench"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="endpoint base URL (ending in /v1); default: start a local server")
    p.add_argument("--model", default=None, help="served model name (required with --url)")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the local server's model worker")
    p.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args(argv)
    if args.requests < 1 or args.requests > 10_000:
        p.error("--requests must be in 1..10000 (a bounded load test)")
    if args.url and not args.model:
        p.error("--model is required with --url")

    import openai

    from envs.visgym import VisGymMaze
    from rlkit.serve.play import observation_message

    env = VisGymMaze(variant="easy", mode="interactive", max_turns=18).make()
    messages = [{"role": "system", "content": env.system_prompt}, observation_message(env.reset(0))]
    server = contextlib.nullcontext((args.url, args.model)) if args.url else local_server(args.threads)
    with server as (url, model):
        client = openai.OpenAI(base_url=url, api_key=args.api_key, timeout=args.timeout, max_retries=0)
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0)  # warm-up
        report = run_load(client, model, messages, args.requests, args.concurrency, args.max_tokens)
    report["url"] = args.url or "local (tiny policy + random adapter)"
    print(f"[rlkit] bench_serve: {report['ok']}/{report['requests']} ok, concurrency {report['concurrency']}, "
          f"{report['requests_per_s']:.2f} req/s, {report['completion_tokens_per_s']:.0f} completion tok/s, "
          f"latency p50 {report['latency_p50_s'] * 1000:.0f} ms, p95 {report['latency_p95_s'] * 1000:.0f} ms, "
          f"max {report['latency_max_s'] * 1000:.0f} ms ({report['wall_s']:.1f} s)")
    if report["errors"]:
        print(f"[rlkit] bench_serve: {report['errors']} errors, first: {report['first_error']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
