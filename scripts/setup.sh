#!/usr/bin/env bash
# Installs rlkit and everything its tests need into .venv, from nothing but Python 3.11.
# torch==2.13.0 is installed first (here the local index serves the CPU wheel; on PyPI it is the CUDA
# build) so no dependency pulls another torch.
# Never installs torchvision/torchaudio/torchcodec: they break transformers' Qwen-VL import here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
# SkyRL's config classes, so the skyrl backend's compiled config is validated by SkyRL's own schema
# in the tests. --no-deps: SkyRL's pins would replace torch/transformers/ray (see docs/skyrl.md).
.venv/bin/python -m pip install -q --no-deps "skyrl==0.3.0" "loguru==0.7.3"
.venv/bin/python - <<'PYEOF'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup: {bad} installed in .venv; they break transformers' Qwen-VL imports with torch 2.13.0 - uninstall them")
import torch, transformers, peft
print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__})")
PYEOF
