"""Plug-ins from config: build an option of a config group from its ``_target_``, compose conf/train.yaml, read
a typed group as its dataclass. Every failure is a ConfigError naming the group and the fix."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, read_write

from rlkit.errors import ConfigError


def instantiate_plugin(node: Any, group: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` for a plug-in group, turning a bad key into a clear error.

    Raises: ConfigError naming the group, its ``_target_`` and Hydra's/the constructor's message
    (e.g. an unknown key: "unexpected keyword argument 'cell_sise'").
    """
    try:
        return instantiate(node, **kwargs)
    except Exception as e:  # hydra wraps constructor errors in InstantiationException
        target = OmegaConf.select(node, "_target_") if OmegaConf.is_config(node) else None
        cause: BaseException = e
        while cause.__cause__ is not None:  # the constructor's own error, not Hydra's wrapper
            cause = cause.__cause__
        hint = ""
        if isinstance(cause, TypeError) and "argument" in str(cause):
            hint = f"\nCheck the keys of conf/{group}/*.yaml and your overrides against {target}'s arguments."
        raise ConfigError(f"config group '{group}' ({target}): {type(cause).__name__}: {cause}{hint}") from None


def compose_train(overrides: list[str], resolve_dtype: bool = True) -> DictConfig:
    """conf/train.yaml composed with these overrides, without the ``hydra`` node, as ``train.py``'s job sees it:
    with ``policy.dtype: auto`` resolved for this machine (``resolve_policy_dtype``) unless ``resolve_dtype`` is
    false, so a job composed here (a chained warm start's, ``sft.start_from_experiment``) keys its builds as that
    job run by itself does.

    Inside a running job (Hydra already initialised by ``train.py``) it composes through that job's config
    search path; elsewhere (tests, scripts) from rlkit's conf/ (rlkit.config.CONF_DIR). Keys that interpolate
    ``${hydra:...}`` (``paths.*``) resolve only inside a job: set them before reading them elsewhere.

    Raises: ConfigError naming the overrides, with Hydra's message (an unknown group option, key or value).
    """
    cfg = _compose_train(overrides)
    if resolve_dtype:
        resolve_policy_dtype(cfg)
    return cfg


def _compose_train(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlkit.config import CONF_DIR  # (importing it registers the schema)

    try:
        if GlobalHydra.instance().is_initialized():
            return compose(config_name="train", overrides=list(overrides))
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))
    except Exception as e:  # hydra raises ConfigCompositionException, OverrideParseException, MissingConfigException
        raise ConfigError(f"config overrides {list(overrides)} do not compose: {e}") from e


def instantiate_reward(node: Any) -> Any:
    """The guarded reward of a ``conf/reward/*.yaml`` node: the plug-in built from the node without
    its guard keys (``timeout_s``, ``on_error``), wrapped in rlkit.reward_guard.GuardedReward.

    Raises: ConfigError for a bad ``timeout_s`` / ``on_error`` (naming the key and its range) or a
    reward that cannot be built (see instantiate_plugin).
    """
    from rlkit.reward_guard import GuardedReward, split_guard_keys

    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    try:
        rest, timeout_s, on_error = split_guard_keys(plain)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return GuardedReward(instantiate_plugin(OmegaConf.create(rest), "reward"), timeout_s=timeout_s, on_error=on_error)


def to_dataclass(node: DictConfig, cls: type) -> Any:
    """A typed config node (validated at compose time) as its dataclass."""
    obj = OmegaConf.to_object(node)
    if not isinstance(obj, cls):
        obj = cls(**obj)
    return obj


_POLICY_TARGETS = ("rlkit.policy.load_policy", "rlkit.policy.policy.load_policy")


def policy_device_type(cfg: DictConfig) -> str:
    """Where the run's policy computes: "cuda" or "cpu", read from the config without loading anything.

    A backend with GPUs per worker or node (``backend.gpus_per_worker`` > 0: native_ray; ``backend.gpus_per_node``
    > 0: skyrl) trains on CUDA; a Ray backend with ``gpus_per_worker: 0`` on CPU whatever the driver has. Otherwise
    ``policy.device``: "cpu", "cuda"/"cuda:N", or "auto" = CUDA when torch sees a GPU here.
    """
    backend = cfg.get("backend") or {}
    device = str(OmegaConf.select(cfg, "policy.device", default="auto") or "auto")
    if device.startswith("cuda"):
        return "cuda"
    gpus = [backend.get(k) for k in ("gpus_per_worker", "gpus_per_node") if k in backend]
    if any(float(g or 0) > 0 for g in gpus):
        return "cuda"
    if gpus or device == "cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_policy_dtype(cfg: DictConfig) -> tuple[str, str] | None:
    """Replace ``policy.dtype: auto`` in ``cfg`` (in place) by the dtype it means for this run, once, before any
    build: bfloat16 on CUDA and on a CPU with native bf16 matmuls, float32 on other CPUs (rlkit.hardware). Every
    reader downstream then sees the concrete value: the build cache keys (rlkit.sft.cache_key_inputs hashes
    ``cfg.policy``; a resolved bfloat16 keys exactly as an explicit ``policy.dtype=bfloat16`` did), the checkpoints'
    config.yaml (a resume compares it), Ray workers (they receive ``cfg``) and the run's ``.hydra/config.yaml``
    (rewritten by ``run``). The CPU is this process's; Ray CPU workers on other machines are assumed alike.

    Returns: (dtype, reason) when ``cfg`` held "auto", else None (an explicit dtype, another policy plug-in, or
    no policy node; an unknown value is left to the backend's check, which names the allowed ones).
    """
    from rlkit.hardware import resolve_dtype_here

    node = cfg.get("policy")
    if not OmegaConf.is_dict(node) or node.get("_target_") not in _POLICY_TARGETS or node.get("dtype") != "auto":
        return None
    dtype, reason = resolve_dtype_here("auto", policy_device_type(cfg))
    with read_write(cfg):  # a read-only cfg (a test's) too
        cfg.policy.dtype = dtype
    return dtype, reason
