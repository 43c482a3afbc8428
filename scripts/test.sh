#!/usr/bin/env bash
# The test command (README, CI): the default suite, CPU only, under 15 minutes on 2 cores.
# Long tests are marked slow (run them with: scripts/test.sh -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
export WANDB_MODE=offline WANDB_SILENT=true
# the 25 slowest tests' durations go to tests/durations.txt (tests/conftest.py), so a test that slows down shows in
# its diff; RLKIT_DURATIONS_FILE=0 leaves the file alone
export RLKIT_DURATIONS_FILE=${RLKIT_DURATIONS_FILE:-1}
# Two pytest-xdist workers, one a core, each test file whole on one worker (--dist loadfile: a file's module
# fixtures, such as its Ray instance, are built once): 475 s here against 800 s in one process.
# One process (pytest's own output order, for debugging): RLKIT_TEST_WORKERS=1, or pass -n yourself; options
# that need one process (--pdb, --trace, -s, --capture=no, -p no:xdist) get one without asking.
workers=${RLKIT_TEST_WORKERS:-2}
case "$workers" in *[!0-9]*) echo "test.sh: RLKIT_TEST_WORKERS=$workers is not a whole number (try 1 or 2)" >&2; exit 2;; esac
for arg in "$@"; do
  case "$arg" in
    -n*|--numprocesses*|--pdb|--trace|-s|--capture=no|-pno:xdist|no:xdist) workers=1;;
  esac
done
if [ "$workers" -gt 1 ]; then
  if .venv/bin/python -c "import xdist" 2>/dev/null; then
    set -- -n "$workers" --dist loadfile "$@"
  else
    echo "test.sh: pytest-xdist is not in .venv (a .venv from before it joined the dev extras): running in one process; bash scripts/setup.sh adds it" >&2
  fi
fi
# --durations: the 20 slowest tests close the report, to keep the suite under its 15 minutes
exec .venv/bin/python -m pytest -q --durations=20 "$@"
