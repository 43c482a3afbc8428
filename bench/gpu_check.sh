#!/usr/bin/env bash
# GPU readiness check of backend=native, at most 8 minutes: bf16 + SDPA on one CUDA device, generation,
# the shared-prefix GRPO update, SIGKILL + resume from the latest checkpoint, adapter sync through
# rlkit.sync; prints tokens/s, MFU, sync latency and the checks (bench/gpu_check.py says what each is).
#
#   bash bench/gpu_check.sh                # on a CUDA machine
#   bash bench/gpu_check.sh --dry-run      # the same phases, tiny, on CPU (or DEVICE=cpu); ~1-2 minutes
#   RLKIT_PEAK_TFLOPS=989.5 bash bench/gpu_check.sh     # the device's bf16 dense peak, if not in the table
#
# Expects: this repository and a Python with rlkit's dependencies (pyproject.toml: torch 2.13.0,
# transformers 5.8.1, peft 0.18.1, hydra 1.3.8, ...) whose torch is a CUDA build. It uses $PYTHON if set,
# else .venv/bin/python, else python3. scripts/setup.sh installs torch==2.13.0 from the configured index:
# on the CPU machines here that is the local CPU wheel (it sees no GPU: the check stops at once and
# says so); from PyPI on Linux x86_64 the default torch 2.13.0 wheel is the CUDA build. A preinstalled
# CUDA torch of another version (e.g. a CUDA image's) should work but is untested; `pip install -e .`
# would replace it with 2.13.0 because of the pin.
# No network, no model hub: the ~100M-parameter tiny Qwen3-VL is built from a config with random weights.
# Writes gpu_check_out/<UTC time>/ (summary.json, one log per phase, the run folder); exit status 0 = OK.
# Not yet run on a GPU itself (dry-run tested on CPU). train.py's CUDA path it drives did run on an H200
# (bench/gpu_9x9.py, 2026-12-04); on an image with its own CUDA torch and no network, carry rlkit's
# pinned packages as wheels (bench/gpu_wheels.sh) and set PYTHON=python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
# the script's own deadline is 450 s over all phases; this is the backstop: 8 minutes in all
exec timeout --kill-after=10 480 "$PY" -m bench.gpu_check "$@"
