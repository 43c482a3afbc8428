"""Distributed pieces of backend=native_ray: Ray actors, the placement-group layout, FSDP2 sharding.

- rlkit.distributed.runtime: RaySettings (the backend's config keys), the bundle layout of the
  placement group (colocated or separate trainer / rollout bundles), ``init_ray``.
- rlkit.distributed.fsdp: process groups (gloo on CPU, NCCL on GPU), ``fully_shard`` of a Qwen-VL
  policy (decoder layers, vision blocks, then the root), gathering the full LoRA adapter and the
  optimizer state on rank 0, loading them back into the shards.
- rlkit.distributed.update: the data-parallel GRPO update (the driver's plan of which rank runs which
  sequences; each rank's sharded update whose summed gradient equals the single-rank gradient).
- rlkit.distributed.workers: TrainerWorker and RolloutWorker, the classes run as Ray actors.
- rlkit.distributed.cluster: RayCluster, the driver's handle on the placement group and actors.

docs/distributed.md describes the layout, the sync protocol (rlkit.sync) and what is verified where.
"""
