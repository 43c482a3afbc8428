"""Play env episodes against any OpenAI-compatible endpoint (rlkit's server or ``vllm serve``).

One episode is the loop of ``rlkit.rollout`` with the policy behind HTTP (official ``openai``
client, Chat Completions):

    messages = [system prompt (if the env has one), user(turn-0 images + text)]
    repeat: reply = chat.completions.create(model, messages, temperature, top_p, max_tokens)
            env.step(reply text)
            stop when the env is done, ``env_spec.max_turns`` turns were played, or no observation
            messages += [assistant(reply text), user(next images + text)]

Images are sent as PNG data URLs (lossless: the server sees the env's pixels exactly). With
temperature 0 against rlkit's server the replies are the rollout's greedy completions, so the
per-task outcomes equal ``rlkit.evaluation.evaluate`` (scripts/eval.py) on the same adapter.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import io
from typing import Any, Sequence

from PIL import Image


class PlayError(RuntimeError):
    """The endpoint refused or failed a request; the message has its status and error."""


def image_data_url(image: Image.Image) -> str:
    """``data:image/png;base64,...`` of a PIL image (PNG: lossless)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def observation_message(observation) -> dict[str, Any]:
    """A user message for an rlkit Observation: its images (in order) as image_url parts, then its text."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image_data_url(img)}}
                                   for img in observation.images]
    parts.append({"type": "text", "text": observation.text})
    return {"role": "user", "content": parts}


def _request_seed(base: int | None, task_seed: int, turn: int) -> int | None:
    if base is None:
        return None
    digest = hashlib.sha256(f"{base}:{task_seed}:{turn}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


def play_episode(client, model: str, env_spec, seed: int, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, sampling_seed: int | None = None, stop: Sequence[str] = ()) -> dict[str, Any]:
    """Play task ``seed`` of ``env_spec`` with ``model`` behind ``client`` (an ``openai.OpenAI``).

    Args:
        max_tokens: completion tokens per turn (rlkit's rollout.max_new_tokens).
        temperature, top_p: sampling (temperature 0 = greedy).
        sampling_seed: None, or a base seed; each request then gets a seed derived from
            (sampling_seed, task seed, turn), so sampled episodes are reproducible.
        stop: stop sequences (rlkit's rollout.stop, e.g. "</answer>"), sent with vLLM's
            ``include_stop_str_in_output`` so the env reads the text a training rollout would have.

    Returns: {seed, success, turns, parse_failures, actions, finish_reasons, completion_tokens}
    (the per-task row of rlkit.evaluation plus finish reasons and tokens from ``usage``).

    Raises: PlayError when the endpoint answers an error (status and message included) or cannot
    be reached.
    """
    import openai

    env = env_spec.make()
    obs = env.reset(seed)
    messages: list[dict[str, Any]] = []
    if env.system_prompt:
        messages.append({"role": "system", "content": env.system_prompt})
    messages.append(observation_message(obs))
    actions: list[str] = []
    reasons: list[str] = []
    parse_failures = 0
    tokens = 0
    while True:
        try:
            resp = client.chat.completions.create(
                model=model, messages=messages, temperature=temperature, top_p=top_p, max_tokens=max_tokens, n=1,
                seed=_request_seed(sampling_seed, seed, len(actions)),
                **({"stop": list(stop), "extra_body": {"include_stop_str_in_output": True}} if stop else {}),
            )
        except openai.APIStatusError as e:
            raise PlayError(f"{model} on task {seed}, turn {len(actions) + 1}: HTTP {e.status_code}: {e.message}") from e
        except openai.APIConnectionError as e:
            raise PlayError(f"cannot reach the endpoint {client.base_url}: {e}") from e
        choice = resp.choices[0]
        text = choice.message.content or ""
        if resp.usage is not None:
            tokens += int(resp.usage.completion_tokens)
        out = env.step(text)
        actions.append(text)
        reasons.append(str(choice.finish_reason))
        parse_failures += 0 if out.info.get("parse_ok", True) else 1
        if out.done or len(actions) >= env_spec.max_turns or out.observation is None:
            break
        messages.append({"role": "assistant", "content": text})
        messages.append(observation_message(out.observation))
    return {"seed": int(seed), "success": bool(env.success()), "turns": len(actions), "parse_failures": parse_failures,
            "actions": actions, "finish_reasons": reasons, "completion_tokens": tokens}


def play(client, model: str, env_spec, seeds: Sequence[int], max_tokens: int, temperature: float = 0.0,
         top_p: float = 1.0, sampling_seed: int | None = None, concurrency: int = 4,
         progress=None, stop: Sequence[str] = ()) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Play one episode per task seed, ``concurrency`` at a time.

    Returns: (metrics, per_task): metrics eval/{success_rate, num_tasks, mean_turns, parse_failures,
    mean_tokens} as rlkit.evaluation names them; per_task rows (see play_episode) in seed order.
    Raises: PlayError from any episode (the others are cancelled).
    """
    rows: dict[int, dict[str, Any]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        futures = {pool.submit(play_episode, client, model, env_spec, s, max_tokens, temperature, top_p,
                               sampling_seed, stop): i for i, s in enumerate(seeds)}
        try:
            for fut in concurrent.futures.as_completed(futures):
                rows[futures[fut]] = fut.result()
                if progress is not None:
                    progress(len(rows), len(seeds))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    per_task = [rows[i] for i in range(len(seeds))]
    n = max(len(per_task), 1)
    metrics = {
        "eval/success_rate": sum(r["success"] for r in per_task) / n,
        "eval/num_tasks": float(len(per_task)),
        "eval/mean_turns": sum(r["turns"] for r in per_task) / n,
        "eval/parse_failures": sum(r["parse_failures"] for r in per_task) / n,
        "eval/mean_tokens": sum(r["completion_tokens"] for r in per_task) / n,
    }
    return metrics, per_task
