"""RayCluster: the driver's handle on the placement group, the trainer ranks and the rollout workers.

Start-up: ``init_ray`` (rlkit.distributed.runtime), one placement group (one bundle per device),
trainer rank r on bundle r, rollout worker j on bundle j (colocated) or num_workers + j (separate),
all actors constructed concurrently; rank 0 picks the process group's address, every rank joins it
and shards its policy (FSDP2). Every call below is synchronous and returns only when all actors it
used are done; the first actor error is raised at once (``_get_all``), and ``shutdown`` kills the
actors, removes the placement group and shuts Ray down if ``start`` initialised it.

Work split and order:
- rollout / evaluate: the B task seeds are cut into contiguous chunks, one per rollout worker
  (sizes differ by at most one); the results are concatenated in worker order and group indices
  offset, so trajectory i belongs to task i // G exactly as rlkit.rollout.rollout returns them.
  Worker j samples with seed ``sampling.seed + j * 2**40`` (worker 0 keeps the seed).
- update: rlkit.distributed.update.plan_update splits each mini-batch across the ranks.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rlkit.distributed.runtime import RaySettings, WorkersHungError, create_placement_group, init_ray, stop_ray
from rlkit.distributed.update import RankPayload, plan_update, split_even
from rlkit.distributed.workers import RolloutSpec, RolloutWorker, TrainerSpec, TrainerWorker

log = logging.getLogger(__name__)

#: Environment variables forwarded to the actors when set in the driver (model caches, offline mode).
FORWARDED_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RLKIT_CACHE_DIR",
                 "RLKIT_SHARED_DIR", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG")
SEED_STRIDE = 1 << 40


def actor_env(threads: int) -> dict[str, str]:
    """Environment of every actor: rlkit importable (PYTHONPATH gets the repo root first), thread
    pools sized to the bundle, and the driver's model-cache / offline variables."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env = {"PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    env.update({k: os.environ[k] for k in FORWARDED_ENV if k in os.environ})
    return env


def _get_all(refs: list[Any], timeout_s: float | None = None, what: str = "workers") -> list[Any]:
    """ray.get of every ref, raising the first failure as soon as it arrives (a failed rank must not
    leave the driver waiting on ranks blocked in a collective).

    Raises: the actor's exception (Ray re-raises it as a subclass of the original type);
    WorkersHungError (a TimeoutError) when ``timeout_s`` passes first.
    """
    import ray

    pending = list(refs)
    done: dict[Any, Any] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            raise WorkersHungError(f"{what} did not answer within {timeout_s:.0f}s")
        for r in ready:
            done[r] = ray.get(r)
    return [done[r] for r in refs]


class RayCluster:
    """Driver-side handle (module doc).

    Args:
        settings: RaySettings (the backend config). trainer_spec / rollout_spec: what the actors
            are built from. name: prefix of the placement group's name.

    Attributes (after ``start``): param_specs [(name, shape)] of the trainable parameters in
    optimizer order; sharded (whether the ranks run FSDP2; one rank without mixed precision does
    not, nor do replicated ranks); strategy ("fsdp" | "ddp" | "unsharded": how the ranks hold the
    policy, TrainerWorker.setup); dashboard_url (or None); trainers, rollouts (actor handles).
    """

    def __init__(self, settings: RaySettings, trainer_spec: TrainerSpec, rollout_spec: RolloutSpec, name: str = "rlkit") -> None:
        settings.validate()
        self.settings = settings
        self.trainer_spec = trainer_spec
        self.rollout_spec = rollout_spec
        self.name = f"{name}-{uuid.uuid4().hex[:8]}"
        self.trainers: list[Any] = []
        self.rollouts: list[Any] = []
        self.pg = None
        self.owns_ray = False
        self.dashboard_url: str | None = None
        self.param_specs: list[tuple[str, tuple[int, ...]]] = []
        self.strategy = "fsdp"
        self.startup_s = 0.0
        self.engine_startup_s: float | None = None

    @property
    def sharded(self) -> bool:
        """Whether the ranks run FSDP2 (strategy "fsdp"); one rank without mixed precision does not, nor
        do replicated ranks."""
        return self.strategy == "fsdp"

    # ---------------------------------------------------------------- lifecycle
    def start(self, pg_timeout_s: float | None = None) -> None:
        """Start/join Ray, schedule the placement group, start every actor and the process group.

        ``pg_timeout_s``: how long the placement group may wait for its resources (seconds; None:
        ``settings.startup_timeout_s``).

        Raises: RuntimeError (Ray unreachable), rlkit.distributed.runtime.PlacementGroupTimeout (placement group
        not scheduled in time), WorkersHungError (actors not ready within startup_timeout_s), or an actor's own
        error (e.g. a bad policy config).
        """
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        t0 = time.perf_counter()
        s = self.settings
        self.owns_ray, self.dashboard_url = init_ray(s)
        self.pg = create_placement_group(s, self.name, s.startup_timeout_s if pg_timeout_s is None else pg_timeout_s)
        res = s.actor_resources()
        env = actor_env(s.threads_per_actor)

        def options(bundle: int) -> dict[str, Any]:
            return dict(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"], runtime_env={"env_vars": env},
                        scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle))

        trainer_cls = ray.remote(TrainerWorker)
        rollout_cls = ray.remote(RolloutWorker)
        w = s.num_workers
        self.trainers = [trainer_cls.options(**options(s.trainer_bundle(r))).remote(r, w, self.trainer_spec) for r in range(w)]
        self.rollouts = [rollout_cls.options(**options(s.rollout_bundle(j))).remote(j, self.rollout_spec)
                         for j in range(s.num_rollout_workers)]
        addr, port = _get_all([self.trainers[0].master_address.remote()], s.startup_timeout_s, "trainer rank 0")[0]
        infos = _get_all([t.setup.remote(addr, port) for t in self.trainers] + [r.ready.remote() for r in self.rollouts],
                         s.startup_timeout_s, "trainer and rollout workers")
        self.param_specs = [(n, tuple(shape)) for n, shape in infos[0]["params"]]
        self.strategy = str(infos[0]["strategy"])
        starts = [i["timing/engine_startup"] for i in infos if "timing/engine_startup" in i]
        self.engine_startup_s = max(starts) if starts else None  # rollout.engine=vllm: the slowest engine's start-up
        self.startup_s = time.perf_counter() - t0
        log.debug("native_ray: %d trainer rank(s) + %d rollout worker(s) ready in %.1fs (pids %s; %d LoRA tensors)",
                  w, len(self.rollouts), self.startup_s, [i["pid"] for i in infos], len(self.param_specs))

    def shutdown(self) -> None:
        """Kill the actors, remove the placement group, and ``ray.shutdown()`` if ``start`` initialised
        Ray (a local instance stops; a cluster is only disconnected from). Idempotent."""
        import ray

        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        if self.rollouts:
            # every rollout worker closes its engine first (rlkit.engines: vLLM's own process stops with a word; a
            # no-op for rlkit's engine); a killed actor's vLLM exits by itself within a second
            # (rlkit.policy.vllm_worker watches its parent), this only spares it the wait
            try:
                _get_all([r.shutdown.remote() for r in self.rollouts], 60.0, what="rollout workers (shutdown)")
            except Exception as e:  # noqa: BLE001 - a dead or hung worker is killed below anyway
                log.debug("rollout workers' shutdown: %s", e)
        for actor in self.trainers + self.rollouts:
            try:
                ray.kill(actor)
            except Exception as e:  # already dead
                log.debug("kill %s: %s", actor, e)
        self.trainers, self.rollouts = [], []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception as e:
                log.debug("remove placement group: %s", e)
            self.pg = None
        if self.owns_ray:
            stop_ray()  # ray.shutdown() and the end of the local instance's watchdog
            self.owns_ray = False

    def dead_workers(self, wait_s: float, poll_s: float = 0.2) -> list[str]:
        """The workers of the group that are gone ("trainer rank 1", "rollout worker 0"), asked after a worker raised.

        Gone: Ray's actor table says DEAD or RESTARTING (ray._private.state.actors, read from the GCS: the public
        ray.util.state needs the dashboard, which a local instance runs without), or a ping of it fails with an
        actor death. Waits up to ``wait_s`` seconds for Ray to notice a death (a killed process: well under a
        second; a lost node: Ray's node health check) and returns [] at once when every worker has answered a ping
        (``ping``: all alive). Returns [] after ``wait_s`` when none was found gone.
        """
        import ray
        from ray._private import state as ray_state

        named = [(f"trainer rank {r}", a) for r, a in enumerate(self.trainers)]
        named += [(f"rollout worker {j}", a) for j, a in enumerate(self.rollouts)]
        pings = {a.ping.remote(): name for name, a in named}
        answered: set[str] = set()
        deadline = time.monotonic() + wait_s
        while True:
            dead = []
            for name, actor in named:
                try:
                    info = ray_state.actors(actor._actor_id.hex())
                except Exception as e:  # noqa: BLE001 - the table cannot be read: the pings still tell
                    log.debug("actor table of %s: %s", name, e)
                    info = {}
                if (info or {}).get("State") in ("DEAD", "RESTARTING"):
                    dead.append(name)
            ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=0)
            for ref in ready:
                name = pings.pop(ref)
                try:
                    ray.get(ref)
                    answered.add(name)
                except Exception as e:  # noqa: BLE001 - a dead actor's ping raises RayActorError
                    log.debug("ping of %s: %s", name, e)
                    dead.append(name)
            if dead:
                return sorted(set(dead), key=[n for n, _ in named].index)
            if len(answered) == len(named) or time.monotonic() >= deadline:
                return []
            time.sleep(poll_s)

    # ---------------------------------------------------------------- trainers
    def _trainers(self, method: str, *args: Any) -> list[Any]:
        return _get_all([getattr(t, method).remote(*args) for t in self.trainers], self.settings.call_timeout_s,
                        what=f"trainer ranks ({method})")

    def load_adapter(self, path: str | os.PathLike) -> None:
        """Load a saved PEFT adapter directory into every rank's shards (resume)."""
        self._trainers("load_adapter", str(path))

    def set_optimizer_state(self, state: dict[int, dict[str, Any]]) -> None:
        """Shard a single-process optimizer's ``state_dict()["state"]`` onto the ranks (resume)."""
        self._trainers("set_optimizer_state", state)

    def optimizer_state(self) -> dict[int, dict[str, Any]]:
        """The full optimizer state gathered on rank 0, keyed like a single-process AdamW's."""
        return self._trainers("optimizer_state")[0]

    def lora_state(self) -> dict[str, torch.Tensor]:
        """The full adapter tensors (PEFT saved layout) gathered on rank 0."""
        return self._trainers("lora_state")[0]

    def publish(self, version: int) -> dict[str, Any]:
        """Publish the ranks' current adapter as ``v<version>``; rank 0's PublishedVersion dict."""
        return self._trainers("publish", int(version))[0]

    def update(self, trajectories: list[Any], advantages: torch.Tensor, algo: Any, temperature: float,
               generator: torch.Generator, lr: float, version: int,
               aux_terms: list[Any] | None = None) -> dict[str, float]:
        """One GRPO update across the ranks at learning rate ``lr``, then publish ``v<version>``.

        ``aux_terms``: auxiliary supervised terms (rlkit.algorithms.nll.AuxTerm), each split across the
        ranks (rlkit.distributed.update.plan_update).

        Returns: rank 0's metrics (policy/*, <term>/nll per active term, timing/update,
        timing/publish, sync/published_*).
        """
        return self.finish_update(self.start_update(trajectories, advantages, algo, temperature, generator, lr,
                                                    version, aux_terms))

    def start_update(self, trajectories: list[Any], advantages: torch.Tensor, algo: Any, temperature: float,
                     generator: torch.Generator, lr: float, version: int,
                     aux_terms: list[Any] | None = None) -> list[Any]:
        """``update``'s first half: plan the split (draws from ``generator`` now) and send every rank
        its share; returns at once with the ranks' pending results, for ``finish_update``. The
        rollout workers stay free meanwhile (backend.one_step_off_policy samples the next step then)."""
        payloads = plan_update(trajectories, advantages, algo, len(self.trainers), generator, aux_terms)
        if payloads is None:
            payloads = [RankPayload(rank=r) for r in range(len(self.trainers))]
        return [t.train.remote(payloads[r], float(lr), float(temperature), int(version), algo)
                for r, t in enumerate(self.trainers)]

    def finish_update(self, pending: list[Any]) -> dict[str, float]:
        """Wait for a ``start_update``'s ranks; rank 0's metrics (as ``update``'s).

        Raises: the first failing rank's error, as soon as it arrives."""
        return _get_all(pending, self.settings.call_timeout_s, what="trainer ranks (update)")[0]

    # ---------------------------------------------------------------- rollout
    def _split(self, seeds: list[int]) -> list[tuple[int, list[int]]]:
        return [(j, chunk) for j, chunk in enumerate(split_even(list(seeds), len(self.rollouts))) if chunk]

    @staticmethod
    def worker_sampling(sampling: Any, index: int) -> Any:
        """The sampling params of rollout worker ``index`` (distinct seeds, worker 0 unchanged)."""
        if sampling.seed is None or index == 0:
            return sampling
        return replace(sampling, seed=int(sampling.seed) + index * SEED_STRIDE)

    def rollout(self, seeds: list[int], group_size: int, sampling: Any, version: int) -> tuple[list[Any], dict[str, float]]:
        """G episodes per seed on the rollout workers with adapter ``version``; trajectories in order.

        Returns: (B*G trajectories, groups contiguous, each with policy_version == version;
        metrics sync/version, timing/load (slowest worker's wait + verify + hot-swap, seconds),
        sync/wait_s, timing/sample (slowest worker's sampling, seconds)).
        Raises: rlkit.sync.SyncError from a worker that must not sample.
        """
        jobs = self._split(seeds)
        refs = [self.rollouts[j].rollout.remote(chunk, group_size, self.worker_sampling(sampling, j), int(version))
                for j, chunk in jobs]
        results = _get_all(refs, self.settings.call_timeout_s, what="rollout workers")
        trajs: list[Any] = []
        offset = 0
        for (_, chunk), (part, _info) in zip(jobs, results):
            for t in part:
                t.group += offset
            offset += len(chunk)
            trajs.extend(part)
        infos = [info for _, info in results]
        metrics = {
            "sync/version": float(version),
            "timing/load": max(i["load"]["wait_s"] + i["load"]["load_s"] for i in infos),
            "sync/wait_s": max(i["load"]["wait_s"] for i in infos),
            "timing/sample": max(i["rollout_s"] for i in infos),
        }
        probes = [i["sync/probe_logprob_diff"] for i in infos if "sync/probe_logprob_diff" in i]
        if probes:  # the largest logprob difference of the last probe against rlkit's engine (rlkit.policy.vllm_engine)
            metrics["sync/probe_logprob_diff"] = max(probes)
        return trajs, metrics

    def demonstrations(self, seeds: list[int]) -> list[Any]:
        """rlkit.demonstrations.demonstration_trajectory of each seed, built on the rollout workers (seeds split
        across them), in seed order; a seed whose demonstration does not solve its task is left out."""
        jobs = self._split(seeds)
        refs = [self.rollouts[j].demonstrations.remote(chunk) for j, chunk in jobs]
        parts = _get_all(refs, self.settings.call_timeout_s, what="rollout workers (demonstrations)")
        return [d for part in parts for d in part]

    def evaluate(self, seeds: list[int], sampling: Any, version: int, keep_trajectories: int = 8, pass_k: int = 0,
                 pass_k_sampling: Any = None) -> tuple[dict[str, float], list[dict[str, Any]], list[Any]]:
        """rlkit.evaluation.evaluate over ``seeds`` split across the rollout workers, merged; with ``pass_k`` > 0
        also eval/pass@k (``pass_k`` samples a task with ``pass_k_sampling``, worker j's seed offset as in
        ``worker_sampling``).

        Returns: (metrics, per_task rows in seed order, the first ``keep_trajectories``
        trajectories). Merged metrics: eval/num_tasks is summed; every other metric (pass@k too) is a
        mean over tasks, so it is the task-weighted mean of the workers' values.
        """
        jobs = self._split(seeds)
        refs = [self.rollouts[j].evaluate.remote(
                    chunk, self.worker_sampling(sampling, j), int(version), keep_trajectories, int(pass_k),
                    None if pass_k_sampling is None else self.worker_sampling(pass_k_sampling, j))
                for j, chunk in jobs]
        results = _get_all(refs, self.settings.call_timeout_s, what="rollout workers (eval)")
        per_task: list[dict[str, Any]] = []
        trajs: list[Any] = []
        for _, rows, part, _ in results:
            per_task.extend(rows)
            trajs.extend(part)
        n = sum(len(chunk) for _, chunk in jobs)
        metrics: dict[str, float] = {}
        for (_, chunk), (m, _, _, _) in zip(jobs, results):
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + (v if k == "eval/num_tasks" else v * len(chunk) / max(n, 1))
        return metrics, per_task, trajs[:keep_trajectories]

    def generate(self, prompts: list[Any], sampling: Any, version: int, worker: int = 0) -> list[list[Any]]:
        """Completions of ``prompts`` from rollout worker ``worker`` after loading ``version``."""
        return _get_all([self.rollouts[worker].generate.remote(prompts, sampling, int(version))],
                        self.settings.call_timeout_s, what="rollout worker")[0]

    def sync(self, version: int) -> list[dict[str, Any]]:
        """Make ``version`` live on every rollout worker; their LoadedVersion dicts."""
        return _get_all([r.sync.remote(int(version)) for r in self.rollouts], self.settings.call_timeout_s,
                        what="rollout workers (sync)")
