#!/usr/bin/env bash
# Does the GPU image's Python environment resolve, and is docker/requirements.lock its resolution?
#
#   bash scripts/check_image_deps.sh            # check (CI): fails if the set has no solution or the lock is stale
#   bash scripts/check_image_deps.sh --update   # rewrite docker/requirements.lock after changing a pin
#
# What is compiled: the requirements docker/Dockerfile installs, i.e. pyproject.toml's dependencies with
# its `skyrl` extra (skyrl[fsdp]==0.3.0: vLLM 0.23.0, flash-attn, ...) and the image's other features (the
# `vllm`, `serve`, `hyperpod` and `tensorboard` extras), plus docker/requirements-image.in
# (torch and flash-attn's build tools), for the image's interpreter and platform (CPython 3.12, Ubuntu
# 24.04 = manylinux_2_39, x86_64), with the Dockerfile's uv version and the same --override file
# (docker/gpu-overrides.txt). One package is left out: flashinfer-jit-cache, which only flashinfer's own
# index serves and this machine cannot reach (docker/lock-excludes.txt says how; the Dockerfile installs
# it from that index). Needs only PyPI; uv is pip-installed into .cache/ when the right one is not on PATH.
#
# The check compiles into a temporary copy of the lock (so uv keeps the locked versions wherever they still
# satisfy the inputs) and compares: any difference means an input changed without `--update`.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=docker/requirements.lock
UPDATE=0
case "${1:-}" in
  --update) UPDATE=1 ;;
  "") ;;
  *) echo "usage: $0 [--update]" >&2; exit 2 ;;
esac

start=$(date +%s)
UV_VERSION=$(sed -n 's/.*"uv==\([0-9][0-9.]*\)".*/\1/p' docker/Dockerfile | head -n 1)
if [ -z "$UV_VERSION" ]; then
  echo "check_image_deps: no \"uv==<version>\" found in docker/Dockerfile; the check uses the image's uv" >&2
  exit 2
fi
FLASHINFER_VERSION=$(sed -n 's/^ARG FLASHINFER_VERSION=\([0-9][0-9.]*\).*/\1/p' docker/Dockerfile | head -n 1)

UV=""
if command -v uv >/dev/null 2>&1 && [ "$(uv --version | awk '{print $2}')" = "$UV_VERSION" ]; then
  UV=uv
else
  TOOL=.cache/uv-$UV_VERSION
  if [ ! -x "$TOOL/bin/uv" ]; then
    PY=$(command -v python3.11 || command -v python3)
    "$PY" -m venv "$TOOL"
    "$TOOL/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
  fi
  UV=$TOOL/bin/uv
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f "$LOCK" ] && cp "$LOCK" "$tmp/requirements.lock"

if ! "$UV" pip compile pyproject.toml docker/requirements-image.in \
      --extra skyrl --extra vllm --extra serve --extra hyperpod --extra tensorboard \
      --python-version 3.12 --python-platform x86_64-manylinux_2_39 \
      --override docker/gpu-overrides.txt --override docker/lock-excludes.txt \
      --cache-dir .cache/uv --quiet \
      --custom-compile-command "bash scripts/check_image_deps.sh --update" \
      -o "$tmp/requirements.lock" 2>"$tmp/uv.err"; then
  cat "$tmp/uv.err" >&2
  echo "check_image_deps: FAIL: the GPU image's requirements have no solution (uv $UV_VERSION, Python 3.12," \
       "manylinux_2_39 x86_64). Fix the conflicting pin named above in pyproject.toml or" \
       "docker/requirements-image.in, or settle it in docker/gpu-overrides.txt (which the Dockerfile uses too)." >&2
  exit 1
fi

# The Dockerfile takes flashinfer-jit-cache (left out above) from flashinfer's index at this version.
LOCKED_FLASHINFER=$(sed -n 's/^flashinfer-python==\([^ ]*\).*/\1/p' "$tmp/requirements.lock")
if [ "$LOCKED_FLASHINFER" != "$FLASHINFER_VERSION" ]; then
  echo "check_image_deps: FAIL: docker/Dockerfile has ARG FLASHINFER_VERSION=${FLASHINFER_VERSION:-<none>}" \
       "but the lock has flashinfer-python==$LOCKED_FLASHINFER; flashinfer-jit-cache must match it" >&2
  exit 1
fi
if ! grep -q "$LOCK" docker/Dockerfile; then
  echo "check_image_deps: FAIL: docker/Dockerfile does not install from $LOCK" >&2
  exit 1
fi

n=$(grep -c '^[A-Za-z0-9]' "$tmp/requirements.lock")
if [ "$UPDATE" = 1 ]; then
  cp "$tmp/requirements.lock" "$LOCK"
  echo "check_image_deps: wrote $LOCK ($n packages) in $(( $(date +%s) - start )) s"
  exit 0
fi
if [ ! -f "$LOCK" ]; then
  echo "check_image_deps: FAIL: $LOCK is missing; run: bash scripts/check_image_deps.sh --update" >&2
  exit 1
fi
if ! diff -u "$LOCK" "$tmp/requirements.lock" > "$tmp/lock.diff"; then
  head -n 60 "$tmp/lock.diff" >&2
  echo "check_image_deps: FAIL: $LOCK is stale (its inputs changed; the diff above is what the resolution" \
       "gives now); run: bash scripts/check_image_deps.sh --update, and commit the lock" >&2
  exit 1
fi
echo "check_image_deps: ok: the image's requirements resolve ($n packages, uv $UV_VERSION, Python 3.12," \
     "manylinux_2_39 x86_64; flashinfer-jit-cache left out) and $LOCK is current ($(( $(date +%s) - start )) s)"
