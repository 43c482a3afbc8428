#!/usr/bin/env bash
# Downloads, into .whl/, the wheels that a CUDA machine's own Python 3.12 image (torch preinstalled, no
# network) needs to run train.py backend=native with logger=console: rlkit's pinned transformers / peft /
# tokenizers and the config stack the image lacks. Used for the H200 run of bench/gpu_9x9.py
# (2026-12-04: that image had torch 2.11.0+cu130 and transformers 5.17, so rlkit's 5.8.1 went along).
#
#   bash bench/gpu_wheels.sh              # here, with PyPI access -> .whl/ (~16 MB)
#   # there, before anything else:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#
# --no-deps everywhere: the image's torch, numpy, safetensors, huggingface_hub, accelerate, PIL, rich,
# tqdm, psutil, pyyaml are used as they are. The versions follow pyproject.toml and this .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYV=${GPU_PYTHON_VERSION:-3.12}
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp "${PLAT[@]}" -d .whl \
  "transformers==$(ver transformers)" "peft==$(ver peft)" "tokenizers==$(ver tokenizers)" \
  "hydra-core==$(ver hydra-core)" "omegaconf==$(ver omegaconf)" "gymnasium==$(ver gymnasium)" \
  "farama-notifications==$(ver farama-notifications)" "regex==$(ver regex)"
# antlr4-python3-runtime 4.9.3 (hydra's parser) is published as a source distribution only: build its wheel here
"$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(ver antlr4-python3-runtime)"
ls .whl
du -sh .whl
