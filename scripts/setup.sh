#!/usr/bin/env bash
# Installs rlkit and everything its tests need into .venv, from nothing but Python 3.11.
# torch==2.13.0 is pinned (here the local wheel directory serves the CPU wheel; on PyPI it is the CUDA build) so no
# dependency pulls another torch. Never installs torchvision/torchaudio/torchcodec: they break transformers' Qwen-VL
# import here.
#
# The installer is uv (pinned below; the same resolved versions as pip, about 20 s instead of about 2 minutes here,
# docs/speed.md); where uv cannot be installed or fails, pip installs the same set. RLKIT_INSTALLER=pip forces pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# SkyRL's config classes, so the skyrl backend's compiled config is validated by SkyRL's own schema in the tests.
# --no-deps: SkyRL's pins would replace torch/transformers/ray (see docs/skyrl.md).
NODEPS=("skyrl==0.3.0" "loguru==0.7.3")

install_with_uv() {
  .venv/bin/python -m pip install -q "uv==0.13.9" || return 1
  # uv reads neither pip.conf nor PIP_* variables: hand it pip's own index settings (find-links, index URLs,
  # constraints), as `pip config list` reports them; file:// locations that do not exist are left out.
  local args
  mapfile -t args < <(.venv/bin/python - <<'PYEOF'
import os, shlex, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flags = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "constraint": "--constraint"}
seen = set()
for line in out.splitlines():
    key, _, value = line.partition("=")
    name = key.rsplit(".", 1)[-1]
    if name not in flags:
        continue
    for item in shlex.split(value.strip().strip("'\"")):
        path = item[len("file://"):] if item.startswith("file://") else (item if "://" not in item else None)
        if path is not None and not os.path.exists(path) or (name, item) in seen:
            continue
        seen.add((name, item))
        print(flags[name]); print(item)
PYEOF
  )
  # --index-strategy unsafe-best-match: every index's versions compete, as in pip (uv's default takes a package's
  # versions from the first index that has it)
  local uv=(.venv/bin/uv pip install -q --python .venv/bin/python --index-strategy unsafe-best-match "${args[@]}")
  "${uv[@]}" "torch==2.13.0" -e ".[dev]" && "${uv[@]}" --no-deps "${NODEPS[@]}"
}

install_with_pip() {
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[dev]"
  .venv/bin/python -m pip install -q --no-deps "${NODEPS[@]}"
}

if [ "${RLKIT_INSTALLER:-uv}" = pip ] || ! install_with_uv; then
  [ "${RLKIT_INSTALLER:-uv}" = pip ] || echo "setup: uv did not install the set; installing with pip instead"
  install_with_pip
fi
.venv/bin/python - <<'PYEOF'
import importlib.util, sys
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
if bad:
    sys.exit(f"setup: {bad} installed in .venv; they break transformers' Qwen-VL imports with torch 2.13.0 - uninstall them")
import torch, transformers, peft
print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__})")
PYEOF
