"""What this machine's CPU can do, and the policy dtype ``auto`` resolves to on it.

``policy.dtype: auto`` (conf/policy/tiny_vl.yaml's default) means: bfloat16 where bf16 matmuls are
native, float32 elsewhere. On a CPU without them torch emulates bf16 matmuls, and the tiny policy's
steps run about 10x slower than in float32 (docs/speed.md); with them (x86 ``avx512_bf16`` or AMX,
aarch64 ``bf16``) bf16 is the faster of the two. On CUDA ``auto`` is bfloat16.

The decision is a pure function of the CPU's feature flags (``native_bf16``, ``resolve_dtype``: testable
with any flags); ``cpu_info`` reads them from ``/proc/cpuinfo`` once. ``RLKIT_CPU_BF16=1`` / ``=0``
overrides the detection (a VM whose /proc/cpuinfo hides a flag, or a check of the other CPU class's
resolution); unset, the flags decide.

This module imports nothing from rlkit and not torch (bench/bench_headline.py records it without
loading a model).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

#: The values ``policy.dtype`` accepts (rlkit.policy.PolicyConfig.validate refuses the others).
DTYPES = ("auto", "float32", "bfloat16", "float16")

#: x86 flags (Linux /proc/cpuinfo names) of native bf16 matmuls: AVX512-BF16 (Cooper Lake, Zen 4+) or AMX-BF16
#: (Sapphire Rapids+), the instructions oneDNN's bf16 kernels use.
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

#: The aarch64 feature (/proc/cpuinfo ``Features``) of the BFMMLA/BFDOT bf16 instructions (Neoverse V1/N2+, Graviton3+).
ARM_BF16_FLAG = "bf16"

#: The flags recorded beside benchmark lines (bench/bench_headline.py): what decides the dtype and the speed.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

#: Environment variable that overrides the detection: "1" native bf16, "0" none, unset/"" detect.
OVERRIDE_ENV = "RLKIT_CPU_BF16"


@dataclass(frozen=True)
class CPUInfo:
    """model: the CPU's model name ("" when unknown). arch: ``platform.machine()`` ("x86_64", "aarch64", ...).
    flags: the feature flags of the first processor listed (x86 ``flags``, aarch64 ``Features``)."""

    model: str = ""
    arch: str = ""
    flags: frozenset[str] = field(default_factory=frozenset)


def parse_cpuinfo(text: str, arch: str) -> CPUInfo:
    """The CPUInfo of a /proc/cpuinfo text (its first ``model name`` and ``flags`` or ``Features`` lines;
    aarch64 kernels print no model name: then ``CPU part``, as a hex id, is left out and model is "")."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CPUInfo(model=model, arch=arch, flags=flags)


@lru_cache(maxsize=1)
def cpu_info(path: str = "/proc/cpuinfo") -> CPUInfo:
    """This machine's CPUInfo, read once. Without a readable ``path`` (macOS, Windows) the flags are empty
    and the model is ``platform.processor()``."""
    arch = platform.machine().lower()
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read(), arch)
    except OSError:
        return CPUInfo(model=platform.processor(), arch=arch, flags=frozenset())


def _is_arm(arch: str) -> bool:
    return arch.lower() in ("aarch64", "arm64")


def _is_x86(arch: str) -> bool:
    return arch.lower() in ("x86_64", "amd64", "x86", "i386", "i686")


def native_bf16(flags: Iterable[str], arch: str) -> bool:
    """Whether a CPU with these feature ``flags`` and architecture ``arch`` runs bf16 matmuls natively:
    x86 ``avx512_bf16`` or ``amx_bf16``; aarch64/arm64 ``bf16``; any other architecture: no."""
    flags = set(flags)
    if _is_arm(arch):
        return ARM_BF16_FLAG in flags
    return _is_x86(arch) and any(f in flags for f in X86_BF16_FLAGS)


def this_cpu_has_native_bf16() -> bool:
    """``native_bf16`` of this machine's CPU (``cpu_info``), unless ``$RLKIT_CPU_BF16`` is "1" or "0".

    Raises: ValueError for another value of ``$RLKIT_CPU_BF16``."""
    forced = os.environ.get(OVERRIDE_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{OVERRIDE_ENV}={forced!r}: expected 1 (native bf16), 0 (none) or unset (detect)")
        return forced == "1"
    info = cpu_info()
    return native_bf16(info.flags, info.arch)


def _why_cpu(flags: Iterable[str], arch: str, native: bool) -> str:
    flags = set(flags)
    if _is_arm(arch):
        return ("this CPU has native bf16 matmuls: bf16" if native
                else "this CPU has no native bf16 matmuls: the aarch64 bf16 feature is absent")
    if native:
        return f"this CPU has native bf16 matmuls: {'/'.join(f for f in X86_BF16_FLAGS if f in flags)}"
    if not _is_x86(arch):
        return f"no native bf16 matmuls known for a {arch or 'unknown'} CPU"
    return f"this CPU has no native bf16 matmuls: {'/'.join(X86_BF16_FLAGS)} absent"


def resolve_dtype(dtype: str, device_type: str, flags: Iterable[str] = (), arch: str = "x86_64",
                  forced: bool | None = None) -> tuple[str, str]:
    """The concrete dtype of ``policy.dtype`` on a device, and why.

    Args: dtype: one of DTYPES. device_type: "cuda" or "cpu" (a torch.device's ``type``). flags / arch: the
        CPU's (``cpu_info``); used for "auto" on "cpu" only. forced: the detection's override (True/False), or
        None to decide from flags / arch.
    Returns: (name, reason): name one of "float32", "bfloat16", "float16"; reason a short phrase for the log
        ("CUDA", "this CPU has no native bf16 matmuls: avx512_bf16/amx_bf16 absent", "set explicitly").
    Raises: ValueError naming the allowed values for an unknown ``dtype``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}: expected one of {', '.join(DTYPES)} "
                         "(auto: bfloat16 on CUDA and on a CPU with native bf16 matmuls, float32 on other CPUs)")
    if dtype != "auto":
        return dtype, "set explicitly"
    if device_type == "cuda":
        return "bfloat16", "CUDA"
    native = native_bf16(flags, arch) if forced is None else forced
    reason = _why_cpu(flags, arch, native) if forced is None else f"{OVERRIDE_ENV}={int(forced)}"
    return ("bfloat16" if native else "float32"), reason


def resolve_dtype_here(dtype: str, device_type: str) -> tuple[str, str]:
    """``resolve_dtype`` with this machine's CPU (``cpu_info``) and ``$RLKIT_CPU_BF16``."""
    info = cpu_info()
    forced = this_cpu_has_native_bf16() if os.environ.get(OVERRIDE_ENV, "").strip() else None
    return resolve_dtype(dtype, device_type, info.flags, info.arch, forced=forced)


def cpu_record() -> dict[str, object]:
    """What a benchmark line records of this CPU: {"cpu": model, "arch": arch, "flags": [the REPORTED_FLAGS it
    has, in that order], "native_bf16": bool (``this_cpu_has_native_bf16``, the override included)}."""
    info = cpu_info()
    return {"cpu": info.model, "arch": info.arch, "flags": [f for f in REPORTED_FLAGS if f in info.flags],
            "native_bf16": this_cpu_has_native_bf16()}
