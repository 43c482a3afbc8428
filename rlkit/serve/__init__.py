"""Serving a trained policy: an OpenAI-compatible Chat Completions server, its vLLM equivalent, and
a client that plays env episodes against either.

Modules (imported on use, so a client machine needs neither FastAPI nor the model stack):

- rlkit.serve.protocol: request models, ServeLimits, APIError (OpenAI error shape), image decoding,
  response objects and stream chunks.
- rlkit.serve.conversation: OpenAI messages -> the policy's token layout (rlkit.policy.chat), with
  exact reuse of sampled ids for assistant turns (SampledIds).
- rlkit.serve.models: adapter resolution (adapter dir, run dir, ``latest``), base resolution,
  ModelHost (one PeftModel holding every adapter), load_host.
- rlkit.serve.tokens: token text and bytes for logprobs, per-token pieces of a streamed answer.
- rlkit.serve.app: create_app (FastAPI; streaming, logprobs, API keys), ServerSettings, ServerThread
  (uvicorn on a thread).
- rlkit.serve.vllm: the equivalent ``vllm serve`` command line, and what vLLM must not be handed (expanded
  image pads, a Conv3d patch-embedding LoRA).
- rlkit.serve.vllm_probe: the check after a load: a probe prompt through vLLM against rlkit's engine.
- rlkit.serve.vllm_server: ``scripts/serve.py --engine vllm`` (vLLM's OpenAI server from .venv-vllm, probed).
- rlkit.serve.play: play episodes through the ``openai`` client; success rate and per-task outcomes.
- rlkit.serve.config: compose conf/train.yaml (+ a run's recorded overrides) for these tools.

Command lines: scripts/serve.py, scripts/play.py, scripts/eval.py, bench/bench_serve.py;
docs/serving.md walks through them.
"""
