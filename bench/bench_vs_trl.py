"""GRPO step time of rlkit against Hugging Face TRL's GRPOTrainer on the same workload, side by side.

    bash scripts/setup_trl.sh                                        # once: builds .venv-trl (TRL 1.16.0)
    taskset -c 1 .venv/bin/python -m bench.bench_vs_trl              # fp32 and bf16, 12 steps a run, 2 rounds
    .venv/bin/python -m bench.bench_vs_trl --dtypes fp32 --steps 10 --rounds 1 --out /tmp/x.json
    .venv/bin/python -m bench.bench_vs_trl --quick                   # a tiny run (tests)

Run it with rlkit's ``.venv/bin/python``: it builds one tiny Qwen3-VL checkpoint and launches each side
as a subprocess of this same file (``--worker rlkit`` in .venv, ``--worker trl`` in .venv-trl), each
pinned to one torch thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)), CPU only. Pin the whole run
to one core with ``taskset`` on a shared machine.

Workload (issue 15's): a tiny Qwen3-VL built offline with random weights (rlkit.policy.tiny: text 256 wide
x 4 layers, head_dim 64; vision 128 x 2, patch 16: ``bench/common.py``'s ISSUE15_SIZES), saved with
save_pretrained (model, tokenizer, image processor, chat template) and loaded from that folder by both
sides. VisGym maze_2d/easy in plan mode (conf/env/visgym.yaml): system prompt + one 225x225 maze image
(49 image tokens) + text = a 159-token prompt; 8 tasks x 8 samples (G=8) a step, the same training mazes
in the same order on both sides; at most 24 new tokens, temperature 1.0; LoRA r16 alpha 32 on the
language model's linears (q/k/v/o, gate/up/down; not the vision tower, not lm_head); KL coefficient 0;
reward 1.0 when the route stops on the goal (rewards.MazeExit; on TRL's side the same env replays the
completion); group-normalized advantages; clipped token-mean loss with eps 0.2 / 0.28 (rlkit's GRPO
defaults; TRL loss_type "dapo"); AdamW lr 1e-3, betas (0.9, 0.999), no weight decay, grad-norm clip 1.0;
one optimizer step per 64 completions, accumulated over 4 micro-batches of 16 sequences on both sides
(``--trl-micro-batch 64``: TRL runs the 64 in one forward/backward instead).

- rlkit: ``rlkit.recipes.grpo.GRPORecipe.train_step`` itself, on the composed conf/train.yaml
  (its defaults: shared-prefix update, the engine's shared prefill, sampling logprobs as old logprobs),
  overrides env=visgym (the 9x9 task TRL's side gets; the default env is the 7x7 maze), policy.dtype,
  rollout.max_new_tokens=24, group_size=8, tasks_per_step=8. generation = rollout
  (prefill + decode + env steps) + reward + advantages; update = ``timing/train`` (grpo_update + LR scheduler).
- TRL: ``GRPOTrainer`` with the GRPOConfig written out in ``trl_config`` below. The step is timed with a
  TrainerCallback (on_step_begin -> on_step_end: the micro-batches' generation, forward, backward, clip and
  optimizer step; the data loading before on_step_begin and the logging after on_step_end are not counted);
  generation = the time inside ``_generate_and_score_completions`` (generate + reward + advantages);
  update = step - generation.
- dtypes: fp32 = float32 weights and compute on both sides. bf16 = bfloat16 weights on both sides
  (rlkit: policy.dtype=bfloat16; TRL: model_init_kwargs dtype=bfloat16 and bf16=True, i.e. accelerate's
  CPU autocast on top); LoRA adapters in float32 on both sides (PEFT's autocast_adapter_dtype; under TRL's
  autocast the adapter matmuls run in bf16).

Runs alternate (per dtype: rlkit, TRL, then TRL, rlkit in the next round, ...); each run is a fresh process
of --steps steps, the first --skip steps of each run (warm-up) are not counted, and the medians of the other
steps over all rounds are reported. Per dtype, after a ``[fp32]`` / ``[bf16]`` line:

    rlkit/TRL GRPO step time R (rlkit A s, TRL B s)
    generation ratio g (rlkit a s, TRL b s); update ratio u (rlkit c s, TRL d s)

then the same ratio in process CPU time (``time.process_time`` around each step: on a core shared with another
job, wall time counts the other job's time slices, CPU time does not), and the achieved FLOP/s of rlkit's
update against this CPU's measured matmul peak in that dtype
(torch.matmul of 2048x2048, 1 thread, best of 5). Update FLOPs: torch.utils.flop_counter.FlopCounterMode
over one extra grpo_update on the last step's batch (the work as executed: the shared prefix once per
group, no weight gradients of frozen weights; attention is counted where rlkit_sdpa runs it as matmuls,
which on this workload is every call; the CPU flash kernel is not in the counter's table). TRL's side runs
transformers' "sdpa" attention as TRL ships it. Everything goes to a JSON file (--out), with every step
of every run and, for rlkit, where each step's time went (``profile``: the engine's prefill and decode, the
rest of the rollout, the update's logprob forwards, its optimizer steps, and backward + the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ISSUE15_SIZES, ROOT, matmul_peak  # torch-free at import

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
#: LoRA targets on TRL's side: the language model's linears, as rlkit's "all-linear" resolves them
#: (rlkit.policy.lora.resolve_target_modules; the trainable parameter counts are compared in the JSON).
LORA_REGEX = r".*\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


def workload(args) -> dict:
    """The numbers both sides run with (--quick: a small batch for tests)."""
    if args.quick:
        return dict(tasks=2, group=4, max_new_tokens=8, micro_batch=4)
    return dict(tasks=8, group=8, max_new_tokens=24, micro_batch=16)


def task_seeds(n: int, seed: int = 0) -> list[int]:
    """The first ``n`` training task seeds of rlkit's TaskSampler(seed) (never eval seeds): rlkit's
    train_step draws them tasks_per_step at a time; TRL's dataset holds them in the same order."""
    from rlkit.tasks import TaskSampler

    return TaskSampler(seed, make_env_spec().is_eval_seed).sample(n)


def make_env_spec():
    from omegaconf import OmegaConf

    from envs.visgym import VisGymMaze

    env_yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "visgym.yaml"))
    env_yaml.pop("_target_")
    return VisGymMaze(**env_yaml)


def build_model(model_dir: Path) -> Path:
    """The tiny Qwen3-VL at issue 15's sizes (conf/policy/tiny_vl.yaml's other sizes), seed 0, saved with
    save_pretrained (config, weights, tokenizer, image processor, chat template) into ``model_dir``."""
    from omegaconf import OmegaConf

    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy

    if (model_dir / "config.json").is_file() and (model_dir / "rlkit_tiny.json").is_file():
        return model_dir
    tiny = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "policy" / "tiny_vl.yaml").tiny)
    return build_tiny_policy(model_dir, TinyVLSizes(**{**tiny, **ISSUE15_SIZES}), seed=0)


# --------------------------------------------------------------------------------------------- rlkit side
def rlkit_worker(args) -> dict:
    import torch
    from hydra import compose, initialize_config_dir

    import rlkit.config  # noqa: F401  (registers the typed schema conf/train.yaml builds on)
    from rlkit.recipes.grpo import GRPORecipe
    from rlkit.recipes.local import LocalExecutor
    from rlkit.recipes.validation import check_run

    torch.set_num_threads(1)
    wl = workload(args)
    out = Path(args.work_dir)
    overrides = [
        "env=visgym", f"policy.dtype={DTYPES[args.dtype]}", f"steps={args.steps}", f"group_size={wl['group']}",
        f"tasks_per_step={wl['tasks']}", f"rollout.max_new_tokens={wl['max_new_tokens']}", "rollout.temperature=1.0",
        f"algorithm.micro_batch_size={wl['micro_batch']}", "trainer.quiet=true", "trainer.num_threads=1",
        "logger=console", "seed=0", f"paths.output_dir={out}", f"paths.cache_dir={out / 'cache'}",
        f"paths.shared={out / 'shared'}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)

    class BenchExecutor(LocalExecutor):
        """The local executor, keeping the last step's batch for the FLOP count."""

        def start_update(self, step, trajs, advantages, aux_terms, generator):
            run.last_batch = (trajs, advantages)
            return super().start_update(step, trajs, advantages, aux_terms, generator)

    # the recipe's own setup steps, cut to what train_step reads (no warm start: the executor starts on the
    # checkpoint built above; no logger, evaluation, checkpoints or resume)
    executor = BenchExecutor()
    run = GRPORecipe(cfg, executor)
    run._setup_runtime()  # trainer.num_threads=1, seeds
    checked = check_run(cfg, executor.problems(cfg))  # the recipe's validation pass; the env, reward, stop strings
    run.env_spec, run.reward_fn, run.stop = checked.env_spec, checked.reward_fn, checked.stop
    t_load = time.perf_counter()
    run._setup_executor(str(args.model_dir))  # policy (LoRA), engine, AdamW
    run.scheduler = run._setup_lr_scheduler()
    load_s = time.perf_counter() - t_load
    run.sampling, run.greedy = run._setup_sampling_params()
    run.sampler = run._setup_sampler()
    run.shuffle_gen = torch.Generator().manual_seed(cfg.seed)
    prof = _Breakdown(executor)

    steps = []
    for step in range(1, args.steps + 1):
        prof.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        m = run.train_step(step)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        trajs, _ = run.last_batch
        prompt_len = trajs[0].loss_mask.index(1)
        steps.append({
            "step": step, "total_s": total, "cpu_s": cpu, "update_s": m["timing/train"], "generation_s": total - m["timing/train"],
            "rollout_s": m["timing/rollout"], "reward_s": m["timing/reward"], "reward_mean": m["reward/mean"],
            "completion_tokens_mean": m["generate/mean_tokens"], "prompt_tokens": prompt_len,
            "seq_len_mean": m["generate/mean_seq_len"], "threads": torch.get_num_threads(),
            "approx_kl": m.get("policy/approx_kl"), "clip_ratio": m.get("policy/clip_ratio"),
            "profile": prof.read(m),
        })
        print(f"rlkit {args.dtype} step {step}: {total:.2f} s (generation {steps[-1]['generation_s']:.2f}, "
              f"update {m['timing/train']:.2f}; prompt {prompt_len} tokens, completions {m['generate/mean_tokens']:.1f} "
              f"tokens, reward {m['reward/mean']:.3f})", flush=True)

    policy = executor.policy
    n = policy.num_parameters()
    res = {
        "side": "rlkit", "dtype": args.dtype, "steps": steps, "load_s": load_s,
        "policy_dtype": str(policy.dtype), "trainable_params": n["trainable"], "total_params": n["total"],
        "config": {"algorithm": _plain(cfg.algorithm), "rollout": _plain(cfg.rollout), "lr": cfg.lr,
                   "group_size": cfg.group_size, "tasks_per_step": cfg.tasks_per_step, "env": _plain(cfg.env)},
        "versions": _versions(),
    }
    res.update(update_flops(run, executor.policy, args))
    return res


class _Breakdown:
    """Where one rlkit step's time goes, from wrappers around the calls train_step makes (a few
    perf_counter reads per call): the engine's prefill and decode (its own GenerateStats), the rest of
    the rollout (env reset/step, chat tokens, image processing), the update's logprob forwards (with
    the loss), its optimizer steps, and the rest of the update (backward, grad-norm clip, scheduler)."""

    def __init__(self, run):
        self.run = run
        engine, policy, opt = run.engine, run.policy, run.optimizer
        gen, logprobs, opt_step = engine.generate, policy.logprobs, opt.step

        def timed_generate(*a, **k):
            t = time.perf_counter()
            out = gen(*a, **k)
            self.t["engine_s"] += time.perf_counter() - t
            self.t["prefill_s"] += engine.last_stats.prefill_s
            self.t["decode_s"] += engine.last_stats.decode_s
            return out

        def timed_logprobs(*a, **k):
            t = time.perf_counter()
            out = logprobs(*a, **k)
            self.t["update_forward_s"] += time.perf_counter() - t
            return out

        def timed_step(*a, **k):
            t = time.perf_counter()
            out = opt_step(*a, **k)
            self.t["optimizer_s"] += time.perf_counter() - t
            return out

        engine.generate, policy.logprobs, opt.step = timed_generate, timed_logprobs, timed_step
        self.reset()

    def reset(self) -> None:
        self.t = dict.fromkeys(("engine_s", "prefill_s", "decode_s", "update_forward_s", "optimizer_s"), 0.0)

    def read(self, m: dict) -> dict:
        t = dict(self.t)
        t["rollout_other_s"] = m["timing/rollout"] - t["engine_s"]
        t["engine_other_s"] = t["engine_s"] - t["prefill_s"] - t["decode_s"]
        t["update_backward_etc_s"] = m["timing/train"] - t["update_forward_s"] - t["optimizer_s"]
        return t


def update_flops(run, policy, args) -> dict:
    """FLOPs of one grpo_update on the last step's batch (FlopCounterMode; SGD lr 0 so nothing moves),
    and the matmul peak of this CPU in the run's dtype (2048^3, 1 thread, best of 5)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from rlkit.update import grpo_update

    trajs, adv = run.last_batch
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    with FlopCounterMode(display=False) as fc:
        grpo_update(policy, opt, trajs, adv, run.algo, temperature=1.0, generator=torch.Generator().manual_seed(0))
    flops = fc.get_total_flops()
    return {"update_flops": float(flops), "update_flops_method": "torch.utils.flop_counter.FlopCounterMode, one "
            "grpo_update on the last step's batch (attention counted where rlkit_sdpa runs it as matmuls; "
            "calls left to the CPU flash kernel are not)",
            "matmul_peak_flops": matmul_peak(dtype=getattr(torch, DTYPES[args.dtype]))}


# ----------------------------------------------------------------------------------------------- TRL side
def trl_config(args, wl: dict, out_dir: str):
    """The GRPOConfig of TRL's side: every field this benchmark sets (the rest are TRL's defaults)."""
    from trl import GRPOConfig

    bf16 = args.dtype == "bf16"
    micro = args.trl_micro_batch or wl["micro_batch"]
    batch = wl["tasks"] * wl["group"]
    if batch % micro:
        raise ValueError(f"--trl-micro-batch {micro} must divide the {batch} completions of a step")
    return GRPOConfig(
        output_dir=out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=micro,                   # sequences per forward/backward (rlkit: micro_batch_size)
        gradient_accumulation_steps=batch // micro,          # micro-batches per optimizer step
        steps_per_generation=batch // micro,                 # generate all 64 completions once per optimizer step
        num_generations=wl["group"],                         # G
        num_iterations=1,                                    # one update per generation batch (no old-logprob pass)
        max_completion_length=wl["max_new_tokens"],
        temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0,                                            # KL coefficient 0: no reference model forward
        epsilon=0.2, epsilon_high=0.28,                      # rlkit's eps_clip_low / eps_clip_high
        loss_type="dapo",                                    # token mean over the whole batch (rlkit: token_mean)
        scale_rewards="group",                               # (r - mean) / std within the group (rlkit: norm_adv_by_std)
        mask_truncated_completions=False,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, optim="adamw_torch",
        model_init_kwargs={"dtype": DTYPES[args.dtype], "attn_implementation": "sdpa"},
        bf16=bf16, fp16=False,                               # bf16: accelerate's CPU autocast on bf16 weights
        use_cpu=True,
        gradient_checkpointing=False,                        # TRL's default is True; rlkit runs without it
        disable_dropout=True,
        shuffle_dataset=False,                               # the same tasks, in the same order, as rlkit
        remove_unused_columns=False,                         # the reward reads the "seed" column
        dataloader_num_workers=0,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        seed=0,
    )


def trl_worker(args) -> dict:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from rlkit.policy.processor import load_processor

    wl = workload(args)
    spec = make_env_spec()
    seeds = task_seeds(args.steps * wl["tasks"])
    rows = []
    for s in seeds:
        env = spec.make()
        obs = env.reset(s)
        rows.append({"prompt": [{"role": "system", "content": env.system_prompt},
                                {"role": "user", "content": obs.text}],
                     "image": obs.images[0], "seed": s})
    dataset = Dataset.from_list(rows)

    def maze_exit(completions, seed, **_):
        """rewards.MazeExit on TRL's side: replay the completion in a fresh env of its task."""
        out = []
        for c, s in zip(completions, seed, strict=True):
            env = spec.make()
            env.reset(s)
            env.step(c[0]["content"] if isinstance(c, list) else c)
            out.append(1.0 if env.success() else 0.0)
        return out

    processor = load_processor(args.model_dir)  # rlkit's image-only Qwen3VLProcessor (no torchvision here)
    processor.tokenizer.padding_side = "left"
    peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_REGEX, bias="none",
                             task_type="CAUSAL_LM")

    class TimedGRPOTrainer(GRPOTrainer):
        gen_s = 0.0
        batch_info: dict = {}

        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.gen_s += time.perf_counter() - t
            self.batch_info = {
                "prompt_tokens": float(out["prompt_mask"].sum(1).float().mean()),
                "completion_tokens_mean": float(out["completion_mask"].sum(1).float().mean()),
                "rows": int(out["prompt_ids"].shape[0]),
            }
            return out

    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            trainer.gen_s = 0.0
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args_, state, control, **kw):
            total, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            steps.append({"step": state.global_step, "total_s": total, "cpu_s": cpu, "generation_s": trainer.gen_s,
                          "update_s": total - trainer.gen_s, "threads": torch.get_num_threads(), **trainer.batch_info})
            print(f"TRL {args.dtype} step {state.global_step}: {total:.2f} s (generation {trainer.gen_s:.2f}, "
                  f"update {total - trainer.gen_s:.2f}; {trainer.batch_info})", flush=True)

        def on_log(self, args_, state, control, logs=None, **kw):
            if steps and logs and "reward" in logs:
                steps[-1]["reward_mean"] = logs["reward"]

    config = trl_config(args, wl, str(Path(args.work_dir) / "trl_out"))
    t_load = time.perf_counter()
    trainer = TimedGRPOTrainer(model=str(args.model_dir), reward_funcs=[maze_exit], args=config,
                               train_dataset=dataset, processing_class=processor, peft_config=peft_config,
                               callbacks=[StepTimer()])
    load_s = time.perf_counter() - t_load
    torch.set_num_threads(1)
    trainer.train()
    model = trainer.model
    first = next(p for n, p in model.named_parameters() if "lora_" not in n)
    import accelerate  # noqa: E401
    import trl

    return {
        "side": "trl", "dtype": args.dtype, "steps": steps, "load_s": load_s,
        "model_dtype": str(first.dtype), "lora_dtype": str(next(p for n, p in model.named_parameters() if "lora_" in n).dtype),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "accelerate_mixed_precision": str(trainer.accelerator.mixed_precision),
        "grpo_config": {k: v for k, v in config.to_dict().items() if k in TRL_FIELDS},
        "versions": {**_versions(), "trl": trl.__version__, "accelerate": accelerate.__version__},
    }


#: The GRPOConfig fields trl_config sets (recorded in the JSON as TRL resolved them).
TRL_FIELDS = (
    "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
    "generation_batch_size", "num_generations", "num_iterations", "max_completion_length", "temperature", "top_p",
    "top_k", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "mask_truncated_completions",
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
    "max_grad_norm", "optim", "model_init_kwargs", "bf16", "fp16", "use_cpu", "gradient_checkpointing",
    "disable_dropout", "shuffle_dataset", "remove_unused_columns", "dataloader_num_workers", "logging_steps",
    "report_to", "save_strategy", "disable_tqdm", "log_completions", "seed",
)


def _plain(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def _versions() -> dict:
    import peft
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__}


# --------------------------------------------------------------------------------------------- orchestrator
def run_side(side: str, dtype: str, args, model_dir: Path, work: Path, tag: str) -> dict:
    """One run of one side in its own process and venv; returns its result JSON."""
    py = {"rlkit": args.rlkit_python, "trl": args.trl_python}[side]
    result = work / f"{tag}.json"
    log = work / f"{tag}.log"
    cmd = [py, "-m", "bench.bench_vs_trl", "--worker", side, "--dtype", dtype, "--steps", str(args.steps),
           "--model-dir", str(model_dir), "--work-dir", str(work / tag), "--result", str(result)]
    if args.quick:
        cmd.append("--quick")
    if args.trl_micro_batch:
        cmd += ["--trl-micro-batch", str(args.trl_micro_batch)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not result.is_file():
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        sys.exit(f"bench_vs_trl: the {side} run ({dtype}) failed (exit {proc.returncode}); log {log}:\n{tail}")
    res = json.loads(result.read_text())
    res["wall_s"] = time.perf_counter() - t
    print(f"  {tag}: {side} {dtype}: " + ", ".join(f"{s['total_s']:.2f}" for s in res["steps"]) + " s/step", flush=True)
    return res


def median_of(runs: list[dict], key: str, skip: int) -> float:
    vals = [s[key] for r in runs for s in r["steps"][skip:]]
    return statistics.median(vals)


def summarize(results: dict, skip: int) -> dict:
    """Per dtype: medians (s) of the counted steps of each side, the ratios and rlkit's update FLOP/s."""
    summary = {}
    for dtype, sides in results.items():
        med = {side: {k: median_of(runs, k, skip) for k in ("total_s", "generation_s", "update_s", "cpu_s")
                      if all(k in st for r in runs for st in r["steps"])}
               for side, runs in sides.items()}
        s = {"rlkit": med["rlkit"], "trl": med.get("trl")}
        if "trl" in med:
            s["ratio_step"] = med["rlkit"]["total_s"] / med["trl"]["total_s"]
            if "cpu_s" in med["rlkit"] and "cpu_s" in med["trl"]:
                s["ratio_step_cpu"] = med["rlkit"]["cpu_s"] / med["trl"]["cpu_s"]
            s["ratio_generation"] = med["rlkit"]["generation_s"] / med["trl"]["generation_s"]
            s["ratio_update"] = med["rlkit"]["update_s"] / med["trl"]["update_s"]
        rl = sides["rlkit"]
        flops = statistics.median(r["update_flops"] for r in rl)
        peak = max(r["matmul_peak_flops"] for r in rl)
        s["rlkit_update_flops"] = flops
        s["rlkit_update_flops_per_s"] = flops / med["rlkit"]["update_s"]
        s["matmul_peak_flops_per_s"] = peak
        s["rlkit_update_fraction_of_peak"] = s["rlkit_update_flops_per_s"] / peak
        summary[dtype] = s
    return summary


def report_lines(summary: dict) -> list[str]:
    lines = []
    for dtype, s in summary.items():
        r = s["rlkit"]
        lines.append(f"[{dtype}]")
        if s.get("trl"):
            t = s["trl"]
            lines.append(f"rlkit/TRL GRPO step time {s['ratio_step']:.2f} (rlkit {r['total_s']:.2f} s, TRL {t['total_s']:.2f} s)")
            lines.append(f"generation ratio {s['ratio_generation']:.2f} (rlkit {r['generation_s']:.2f} s, TRL "
                         f"{t['generation_s']:.2f} s); update ratio {s['ratio_update']:.2f} (rlkit {r['update_s']:.2f} s, "
                         f"TRL {t['update_s']:.2f} s)")
            if "ratio_step_cpu" in s:
                lines.append(f"process CPU time a step: ratio {s['ratio_step_cpu']:.2f} (rlkit {r['cpu_s']:.2f} s, TRL "
                             f"{t['cpu_s']:.2f} s)")
        else:
            lines.append(f"rlkit GRPO step time {r['total_s']:.2f} s (generation {r['generation_s']:.2f} s, update "
                         f"{r['update_s']:.2f} s); TRL not run")
        lines.append(f"rlkit update {s['rlkit_update_flops'] / 1e9:.1f} GFLOP in {r['update_s']:.2f} s = "
                     f"{s['rlkit_update_flops_per_s'] / 1e9:.1f} GFLOP/s = {100 * s['rlkit_update_fraction_of_peak']:.0f}% "
                     f"of the {dtype} matmul peak {s['matmul_peak_flops_per_s'] / 1e9:.0f} GFLOP/s (2048^3, 1 thread)")
    return lines


def orchestrate(args) -> None:
    if args.quick:
        args.steps = args.steps or 3
        args.skip = 1 if args.skip is None else args.skip
        args.rounds = args.rounds or 1
    args.steps = args.steps or 12
    args.skip = 2 if args.skip is None else args.skip
    args.rounds = args.rounds or 2
    if args.steps <= args.skip:
        sys.exit(f"bench_vs_trl: --steps {args.steps} must be larger than --skip {args.skip} (uncounted warm-up steps)")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        sys.exit(f"bench_vs_trl: unknown dtype(s) {bad}; use {','.join(DTYPES)}")
    sides = ["rlkit"] + ([] if args.no_trl else ["trl"])
    if "trl" in sides and not Path(args.trl_python).is_file():
        sys.exit(f"bench_vs_trl: {args.trl_python} not found; build it with `bash scripts/setup_trl.sh` "
                 "(or pass --no-trl for rlkit's side only)")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else work / "bench_vs_trl.json"
    model_dir = build_model(work / "model")
    wl = workload(args)
    print(f"bench_vs_trl: {wl['tasks']} tasks x {wl['group']} samples, <= {wl['max_new_tokens']} new tokens, "
          f"{args.steps} steps a run (first {args.skip} not counted), {args.rounds} round(s), dtypes {dtypes}; "
          f"model {model_dir}; logs in {work}; CPU affinity {sorted(os.sched_getaffinity(0))}", flush=True)
    results: dict = {d: {s: [] for s in sides} for d in dtypes}
    t0 = time.perf_counter()
    for dtype in dtypes:
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                results[dtype][side].append(run_side(side, dtype, args, model_dir, work, f"{dtype}_r{r}_{side}"))
    summary = summarize(results, args.skip)
    lines = report_lines(summary)
    doc = {"summary": summary, "lines": lines, "workload": {**wl, "steps": args.steps, "skip": args.skip,
           "rounds": args.rounds, "dtypes": dtypes, "trl_micro_batch": args.trl_micro_batch or wl["micro_batch"]}, "machine": {"platform": platform.platform(),
           "cpu_affinity": sorted(os.sched_getaffinity(0)), "nproc": os.cpu_count()},
           "wall_s": time.perf_counter() - t0, "runs": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print("\n".join(lines))
    print(f"bench_vs_trl: all numbers in {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default 12; --quick 3)")
    ap.add_argument("--skip", type=int, default=None, help="first steps of each run not counted (default 2; --quick 1)")
    ap.add_argument("--rounds", type=int, default=None, help="alternated rounds per dtype (default 2; --quick 1)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--quick", action="store_true", help="tiny run for tests: 2 tasks x 4 samples, 8 new tokens")
    ap.add_argument("--out", default=None, help="result JSON (default: <work dir>/bench_vs_trl.json)")
    ap.add_argument("--work-dir", default=None, help="model, logs and per-run JSON (default: a new temp dir)")
    ap.add_argument("--no-trl", action="store_true", help="rlkit's side only")
    ap.add_argument("--trl-micro-batch", type=int, default=None,
                    help="TRL's per_device_train_batch_size (default: rlkit's micro-batch, 16; 64 = no accumulation)")
    ap.add_argument("--rlkit-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    # worker mode (launched by the orchestrator; usable by hand for one side)
    ap.add_argument("--worker", choices=["rlkit", "trl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is None:
        orchestrate(args)
        return
    if not (args.model_dir and args.result and args.work_dir and args.steps):
        sys.exit("bench_vs_trl: --worker needs --model-dir, --work-dir, --result and --steps")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    res = rlkit_worker(args) if args.worker == "rlkit" else trl_worker(args)
    Path(args.result).write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
