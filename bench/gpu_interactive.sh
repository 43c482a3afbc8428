#!/usr/bin/env bash
# The interactive VisGym 9x9 setting on one GPU, at most 10 minutes: python -m bench.gpu_9x9 --mode interactive
# (env=visgym_interactive: one move a turn, a new picture each turn, 18 turns; a warm start on the env's multi-turn
# demonstrations, then the 9x9 recipe's GRPO), printing the warm start's and GRPO's success curves.
#
#   bash bench/gpu_interactive.sh                          # ~106M tiny Qwen3-VL (bench/common.py GPU_SIZES)
#   bash bench/gpu_interactive.sh --sizes 8b_shapes        # Qwen3-VL-8B's widths and heads, 2 + 2 layers (~506M)
#   bash bench/gpu_interactive.sh --dry-run --budget-s 420 --threads 1     # tiny, on CPU (~6 minutes)
#
# Other arguments go to bench/gpu_9x9.py (--budget-s, --sft-lr, --lr, --sft-steps, --grpo-steps, --extra, --out).
# Its phases end by its deadline (--budget-s, 540 s by default); this `timeout` is the backstop: 590 s, then SIGKILL
# 10 s later, to the whole process group (the train.py phases too). Python: $PYTHON if set, else .venv/bin/python,
# else python3 (bench/gpu_check.sh says what it needs; on an image with its own CUDA torch, bench/gpu_wheels.sh).
# Not yet run on a GPU (the CPU dry run ran to the end).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
exec timeout --kill-after=10 590 "$PY" -m bench.gpu_9x9 --mode interactive "$@"
