#!/usr/bin/env bash
# The skyrl312 tests: SkyRL 0.3.0's own generator, datasets, evaluate, config classes and entry point run
# against rlkit's env on CPU, in .venv-skyrl (Python 3.12; built by scripts/setup_skyrl.sh when missing).
#
#   bash scripts/test_skyrl.sh                 # what CI runs: -m "skyrl312 and not slow" (~1 minute)
#   bash scripts/test_skyrl.sh -m skyrl312     # also the entry-point probe (a Ray cluster; 2.5-5.5 minutes here)
#
# Where no Python 3.12 can be found, it says so and exits 0 (the default suite does not need it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-skyrl/bin/python ]; then
  rc=0
  bash scripts/setup_skyrl.sh || rc=$?
  if [ "$rc" = 3 ]; then
    echo "test_skyrl: skipped: no Python 3.12 on this machine (see scripts/setup_skyrl.sh)"
    exit 0
  fi
  [ "$rc" = 0 ] || exit "$rc"
fi
export WANDB_MODE=offline WANDB_SILENT=true
if [ "$#" = 0 ]; then
  set -- -m "skyrl312 and not slow"
fi
exec .venv-skyrl/bin/python -m pytest -q -p no:cacheprovider tests/skyrl312 "$@"
