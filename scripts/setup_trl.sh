#!/usr/bin/env bash
# Builds .venv-trl (Python 3.11): Hugging Face TRL's GRPOTrainer next to rlkit, for
# bench/bench_vs_trl.py (the TRL side of the side-by-side GRPO step-time benchmark).
#
#   bash scripts/setup_trl.sh          # idempotent: reuses .venv-trl, reinstalls only what is missing
#
# Versions: torch 2.13.0 (the local CPU wheel; any other torch spec downloads a CUDA build) first,
# then trl 1.16.0 with rlkit's own transformers 5.8.1 and peft 0.18.1 (trl 1.16.0 requires
# transformers>=4.56.2 and, for its peft extra, peft>=0.13.0: both accepted), then rlkit itself
# editable (`pip install -e .`), so the TRL side imports rlkit's VisGym env, maze reward and its
# image-only Qwen3-VL processor.
# Never installs torchvision/torchaudio/torchcodec: they break transformers' Qwen-VL import with this
# torch. trl's `vlm` extra would pull torchvision, so plain `trl` is installed and Pillow comes from rlkit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-trl
TRL_VERSION=1.16.0
TRANSFORMERS_VERSION=5.8.1
PEFT_VERSION=0.18.1

fail() { echo "setup_trl: FAILED: $*" >&2; exit 1; }

"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' \
  || fail "$PY is not Python 3.11 (set PYTHON=/path/to/python3.11)"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || fail "could not create $VENV with $PY"
fi
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip || fail "pip upgrade in $VENV"
"${PIP[@]}" "torch==2.13.0" || fail "torch==2.13.0 (the local CPU wheel) did not install"
# Constraints keep every later install on these versions (and fail instead of swapping torch).
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "torch==2.13.0" "transformers==$TRANSFORMERS_VERSION" "peft==$PEFT_VERSION" "trl==$TRL_VERSION" > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" "trl==$TRL_VERSION" "transformers==$TRANSFORMERS_VERSION" "peft==$PEFT_VERSION" \
  || fail "trl==$TRL_VERSION with transformers==$TRANSFORMERS_VERSION / peft==$PEFT_VERSION did not resolve"
"${PIP[@]}" -c "$CONSTRAINTS" -e . || fail "rlkit (pip install -e .) into $VENV"
"$VENV/bin/python" - <<'PYEOF'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup_trl: FAILED: {bad} installed in .venv-trl; they break transformers' Qwen-VL imports with "
             "torch 2.13.0 - uninstall them")
import torch, transformers, peft, trl, accelerate, datasets
from transformers import Qwen3VLForConditionalGeneration  # noqa: F401  (the tiny policy's class)
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
import rlkit.policy, envs.visgym, rewards  # noqa: F401
print(f"setup_trl: ok (python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, peft {peft.__version__}, trl {trl.__version__}, accelerate "
      f"{accelerate.__version__}, datasets {datasets.__version__})")
PYEOF
