#!/usr/bin/env bash
# GPU readiness check of backend=native, at most 8 minutes: bf16 + SDPA on one CUDA device, generation,
# the shared-prefix GRPO update, SIGKILL + resume from the latest checkpoint, adapter sync through
# rlkit.sync; prints tokens/s, MFU, sync latency and the checks (scripts/gpu_check.py says what each is).
#
#   bash scripts/gpu_check.sh              # on a CUDA machine
#   bash scripts/gpu_check.sh --dry-run    # the same phases, tiny, on CPU (or DEVICE=cpu); ~1-2 minutes
#   RLKIT_PEAK_TFLOPS=989.5 bash scripts/gpu_check.sh   # the device's bf16 dense peak, if not in the table
#
# Expects: this repository and a Python with rlkit's dependencies. It uses .venv/bin/python when there is
# one (scripts/setup.sh builds it, with the CPU torch wheel: on a GPU machine that torch sees no GPU), else
# $PYTHON, else python3. On a GPU machine whose Python already has a CUDA build of torch:
#   python3 -m pip install -e ".[dev]"      # keeps the installed torch if it satisfies the pin range
#   PYTHON=python3 bash scripts/gpu_check.sh
# No network, no model hub: the ~100M-parameter tiny Qwen3-VL is built from a config with random weights.
# Writes gpu_check_out/<UTC time>/ (summary.json, one log per phase, the run folder); exit status 0 = OK.
# Never run on a GPU as of this commit (written and dry-run tested on CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
# the script's own deadline is 450 s over all phases; this is the backstop: 8 minutes in all
exec timeout --kill-after=10 480 "$PY" scripts/gpu_check.py "$@"
