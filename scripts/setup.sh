#!/usr/bin/env bash
# Installs rlkit (editable, with its `dev` extra: every CPU feature and the tests) into .venv, from nothing but
# Python 3.11, at the versions of uv.lock: the lock is exported as pip constraints, so every package gets its locked
# version and nothing else moves. torch is the lock's 2.13.0 from wherever pip is configured to find it: here the
# local wheel directory serves the CPU build (2.13.0+cpu satisfies ==2.13.0); elsewhere point pip at PyTorch's CPU
# index, PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu (on PyPI, Linux's torch is the CUDA build;
# docs/install.md). The CUDA wheels the lock lists for PyPI's torch (nvidia-*, triton) are only constraints: the
# CPU torch does not require them, so they are not installed. Never installs torchvision/torchaudio/torchcodec:
# they break transformers' Qwen-VL import here.
#
# The installer is uv (pinned below; the same versions as pip, about 20 s instead of about 2 minutes here,
# docs/speed.md); where uv cannot be installed or fails, pip installs the same set. RLKIT_INSTALLER=pip forces pip.
# After changing a dependency in pyproject.toml: `.venv/bin/uv lock` (keeps every other locked version) and commit
# uv.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
UV_VERSION=0.13.9
PINS=.venv/rlkit-lock-pins.txt

# uv.lock's versions for .venv's set (the dev extra) as a constraints file; needs uv, not the network (--frozen).
export_pins() {
  .venv/bin/uv export -q --frozen --no-hashes --no-header --no-annotate --no-emit-project --extra dev -o "$PINS"
}

install_with_uv() {
  .venv/bin/python -m pip install -q "uv==$UV_VERSION" || return 1
  export_pins || return 1
  # uv reads neither pip.conf nor PIP_* variables: hand it pip's own index settings (scripts/pip_index_args.py)
  local args
  mapfile -t args < <(.venv/bin/python scripts/pip_index_args.py)
  # --index-strategy unsafe-best-match: every index's versions compete, as in pip (uv's default takes a package's
  # versions from the first index that has it)
  # --compile-bytecode: write every package's .pyc now, as pip does; uv's default leaves them to the first import,
  # and where Python may not write them (PYTHONDONTWRITEBYTECODE, a read-only .venv) every process compiles
  # transformers & co. again: `train.py experiment=smoke` 12.3 s -> 6.9 s (docs/speed.md)
  local uv=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --index-strategy unsafe-best-match
            "${args[@]}")
  "${uv[@]}" -c "$PINS" torch -e ".[dev]"
}

install_with_pip() {
  .venv/bin/python -m pip install -q --upgrade pip
  # the lock's pins when uv can export them (uv is a small wheel: tried even here), else pyproject's ranges
  local pins=()
  [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q "uv==$UV_VERSION" || true
  if [ -x .venv/bin/uv ] && export_pins; then pins=(-c "$PINS"); else
    echo "setup: no uv to read uv.lock; pip resolves pyproject.toml's ranges instead of the locked versions"; fi
  .venv/bin/python -m pip install -q "${pins[@]}" torch
  .venv/bin/python -m pip install -q "${pins[@]}" -e ".[dev]"
}

if [ "${RLKIT_INSTALLER:-uv}" = pip ] || ! install_with_uv; then
  [ "${RLKIT_INSTALLER:-uv}" = pip ] || echo "setup: uv did not install the set; installing with pip instead"
  install_with_pip
fi
# SkyRL itself is not in .venv (its pins conflict with the base set; it lives in .venv-skyrl and the GPU image,
# docs/skyrl.md). A .venv from before had it installed --no-deps, which `pip check` reports as broken: remove it.
if .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('skyrl') is None)" 2>/dev/null; then
  .venv/bin/python -m pip uninstall -q -y skyrl loguru
fi
.venv/bin/python - <<'PYEOF'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup: {bad} installed in .venv; they break transformers' Qwen-VL imports with torch 2.13.0 - uninstall them")
import torch, transformers, peft
print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__})")
PYEOF
