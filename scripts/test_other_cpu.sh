#!/usr/bin/env bash
# The dtype-sensitive tests (marker dtype_sensitive: serving against the evaluation, exact resume, builds, the
# dtype resolution) once more with the other CPU class's dtype path forced, so a change that breaks the class this
# machine is not shows here before it reaches a machine of that class: RLKIT_CPU_BF16=0 (float32) on a CPU with
# native bf16 matmuls (avx512_bf16 / amx_bf16), RLKIT_CPU_BF16=1 (bf16, emulated and slower) on one without.
#
#   bash scripts/test_other_cpu.sh        # what CI runs after scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
other=$(.venv/bin/python -c "from rlkit.hardware import cpu_info, native_bf16; i = cpu_info(); print(0 if native_bf16(i.flags, i.arch) else 1)")
flags=$(.venv/bin/python -c "from rlkit.hardware import cpu_info; f = cpu_info().flags; print(' '.join(sorted(x for x in f if x in {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'})))")
echo "test_other_cpu: this CPU has [$flags]; forcing RLKIT_CPU_BF16=$other for the dtype-sensitive tests"
RLKIT_CPU_BF16=$other RLKIT_DURATIONS_FILE=0 exec bash scripts/test.sh -m dtype_sensitive "$@"
