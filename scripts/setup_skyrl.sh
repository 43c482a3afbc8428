#!/usr/bin/env bash
# Builds .venv-skyrl: Python 3.12 with SkyRL 0.3.0's own generator, config, dataset and entry-point code,
# for the tests marked `skyrl312` (SkyRL's code run against rlkit's env on CPU; docs/testing.md).
#
#   bash scripts/setup_skyrl.sh          # exit 0: built (or already there); exit 3: no Python 3.12 here
#
# Every package is constrained to docker/requirements.lock, so this is the GPU image's Python environment
# (same torch, transformers, peft, Ray, skyrl, skyrl-gym, hydra, ...) minus what needs a GPU to import or
# install: no vLLM, flash-attn, flashinfer or the other CUDA-only extras of skyrl[fsdp]. torch is PyPI's
# 2.11.0, the image's: PyPI has no CPU-only torch for CPython 3.12 on x86_64, so this is its CUDA build
# (~4 GB installed), which imports and runs on the CPU; nothing here uses CUDA.
# Python 3.12: $PYTHON312, else python3.12 on PATH, else pyenv's 3.12.x.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=""
for cand in ${PYTHON312:-} python3.12 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python 2>/dev/null | sort -rV); do
  # (a pyenv shim named python3.12 exists even where no 3.12 is selected: run each candidate to be sure)
  if "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "setup_skyrl: no Python 3.12 found (set PYTHON312=/path/to/python3.12); .venv-skyrl not built" >&2
  exit 3
fi

UV_VERSION=$(sed -n 's/.*"uv==\([0-9][0-9.]*\)".*/\1/p' docker/Dockerfile | head -n 1)
start=$(date +%s)
if [ ! -x .venv-skyrl/bin/python ]; then
  "$PY" -m venv .venv-skyrl
fi
.venv-skyrl/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
UV=(.venv-skyrl/bin/uv pip install --python .venv-skyrl/bin/python -q
    -c docker/requirements.lock)

# torch first, alone: the constraint pins 2.11.0 and its CUDA runtime wheels as in the image.
"${UV[@]}" torch
# SkyRL 0.3.0 without extras (its [fsdp] extra is vLLM + flash-attn + flashinfer), plus what its trainer
# modules import at the top (main_base -> trainer: ray, jaxtyping, torchdata, loguru, ...), and rlkit itself,
# editable, with its requirements settled by the image's overrides (docker/gpu-overrides.txt).
"${UV[@]}" --override docker/gpu-overrides.txt -e . \
    "skyrl==0.3.0" skyrl-gym loguru jaxtyping torchdata tensordict aiohttp omegaconf \
    "pytest>=8" "pytest-timeout>=2.3"

.venv-skyrl/bin/python - <<'PYEOF'
import importlib.util, sys
bad = [m for m in ("vllm", "flash_attn", "flashinfer", "torchvision") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup_skyrl: {bad} installed in .venv-skyrl; it is meant to hold no GPU-only packages")
import importlib.metadata as md
import torch
from skyrl.train.generators.skyrl_vlm_generator import SkyRLVLMGymGenerator  # noqa: F401
from skyrl.train.entrypoints.main_base import BasePPOExp  # noqa: F401
versions = ", ".join(f"{p} {md.version(p)}" for p in ("skyrl", "skyrl-gym", "transformers", "ray"))
print(f"setup_skyrl: ok (Python {sys.version.split()[0]}, torch {torch.__version__} on CPU, {versions})")
PYEOF
echo "setup_skyrl: $(( $(date +%s) - start )) s"
