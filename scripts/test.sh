#!/usr/bin/env bash
# The test command (README, CI): the default suite, CPU only, under 15 minutes on 2 cores.
# Long tests are marked slow (run them with: scripts/test.sh -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
export WANDB_MODE=offline WANDB_SILENT=true
# --durations: the 20 slowest tests close the report, to keep the suite under its 15 minutes
exec .venv/bin/python -m pytest -q --durations=20 "$@"
