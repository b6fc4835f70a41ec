#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12/13 machine: system packages, the Python venv with the
# PyTorch wheel (LibTorch for the C++ build, transformers for the golden fixtures), then
# configure + build. Re-running only does what is missing; the build is incremental.
#   MMPOST_SKIP_APT=1   skip apt (packages installed by other means)
#   Torch_DIR=/path     use a downloaded LibTorch (e.g. a CUDA build) instead of the venv's torch
#   BUILD_DIR=build     build folder;  BUILD_TYPE=Release
#   MMPOST_SKIP_BUILD=1 stop after packages + venv (scripts/sanitize.sh configures its own folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
TORCH_VERSION=2.13.0
log() { echo "[setup] $*" >&2; }

# ---- 1. Debian packages ---------------------------------------------------------------------
PKGS=(build-essential cmake ninja-build pkg-config libopencv-dev libsentencepiece-dev sentencepiece
      libcli11-dev nlohmann-json3-dev catch2 python3-venv python3-dev libgloo-dev libpcre2-dev
      libutf8proc-dev libtcmalloc-minimal4 time chromium)  # chromium: `mmpost report` in tests
if [[ "${MMPOST_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    log "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
fi

# ---- 2. Python venv: torch (LibTorch), numpy/scikit-learn (data scripts), transformers (golden) --
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION into .venv"
  .venv/bin/pip install -q "torch==$TORCH_VERSION" >&2
fi
if ! .venv/bin/python - <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(l.split("==") for l in open("scripts/requirements-dev.txt").read().split("\n")
            if l and not l.startswith("#"))
sys.exit(any(version(k) != v for k, v in want.items()))
PY
then
  log "installing scripts/requirements-dev.txt (transformers, scikit-learn, ...) into .venv"
  # torch is pinned in the same command so pip never swaps it for another build.
  .venv/bin/pip install -q "torch==$TORCH_VERSION" -r scripts/requirements-dev.txt >&2
fi
ABI=$(.venv/bin/python -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
if [[ -z "${Torch_DIR:-}" && "$ABI" != 1 ]]; then
  log "error: the venv's torch uses the pre-C++11 ABI; Debian's OpenCV/sentencepiece need the C++11 ABI"
  exit 1
fi

# ---- 3. configure + build -------------------------------------------------------------------
if [[ "${MMPOST_SKIP_BUILD:-0}" == 1 ]]; then
  log "ok: packages and .venv (MMPOST_SKIP_BUILD=1: not building)"
  exit 0
fi
GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/Makefile" ]] && GEN=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  log "configuring $BUILD_DIR ($BUILD_TYPE)"
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} >&2
fi
log "building (this takes a few minutes the first time on 2 cores)"
cmake --build "$BUILD_DIR" -j"$(nproc)" >&2
log "ok: $BUILD_DIR/mmpost"
