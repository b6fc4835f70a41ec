#!/usr/bin/env bash
# Builds build/mmpost's sources against a CUDA LibTorch on a machine without a GPU or a CUDA
# toolkit, to prove that the CUDA-only code compiles and links (the NCCL process group in
# lib/mmpost/dist/, MMPOST_WITH_NCCL) and that the binary still trains on the CPU.
#
#   bash scripts/gpu_check/cuda_build.sh        # about 5 GB of wheels, ~20 min on 2 cores
#
# Everything comes from PyPI: torch==2.13.0 (the CUDA 13 build, with its nvidia-* libraries and
# nvidia-nccl) and NVIDIA's cuda-toolkit wheels for cudart, nvcc and CCCL headers, which
# LibTorch's CMake config asks for. It goes to .venv-cuda/ (never the project's .venv), the build
# to build-cuda/. The wheels ship versioned libraries only (libcudart.so.13), which CMake's FindCUDA
# cannot find, so build-cuda/cuda-shim/ is a toolkit-shaped folder of links to them.
# Checks, each printed as "ok ..." (exit 1 on the first failure):
#   CMake reports "dist/ builds the NCCL backend"; the binary references ProcessGroupNCCL;
#   `mmpost --version` runs; a 3-step SFT on the CPU completes; `--device cuda` without a GPU is
#   a usage error (exit 2) naming the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV=$ROOT/.venv-cuda
BUILD=$ROOT/build-cuda
SHIM=$BUILD/cuda-shim
CUDA_TOOLKIT=13.0.3  # torch 2.13.0's Requires-Dist: cuda-toolkit[...]==13.0.3
log() { echo "[cuda_build] $*" >&2; }
ok() { echo "ok $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") and torch.version.cuda else 1)' 2>/dev/null; then
  log "installing torch==2.13.0 (CUDA) and cuda-toolkit[cudart,nvcc,cccl]==$CUDA_TOOLKIT from PyPI into $VENV"
  # --isolated: ignore pip configuration that points at a local CPU-only wheel.
  "$VENV/bin/pip" install --isolated -q --index-url https://pypi.org/simple \
    torch==2.13.0 "cuda-toolkit[cudart,nvcc,cccl]==$CUDA_TOOLKIT"
fi
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
CU=$SP/nvidia/cu13
[ -x "$CU/bin/nvcc" ] || { log "error: no nvcc in $CU/bin"; exit 1; }

# A toolkit-shaped folder: include/ bin/ nvvm/ -> the wheel's, lib64/ = links with and without
# the version suffix. nvcc finds its libraries at bin/../lib64 after resolving bin's link, so the
# wheel's folder gets a lib64 link too.
mkdir -p "$SHIM/lib64"
for d in include bin nvvm; do ln -sfn "$CU/$d" "$SHIM/$d"; done
for f in "$CU"/lib/*.so.* "$CU"/lib/*.a; do
  b=$(basename "$f")
  ln -sf "$f" "$SHIM/lib64/$b"
  u=${b%%.so.*}
  [ "$u" != "$b" ] && ln -sf "$f" "$SHIM/lib64/$u.so"
done
ln -sfn "$SHIM/lib64" "$CU/lib64"

export PATH=$CU/bin:$PATH
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # no GPU to detect: name one (H100/H200)
GEN=()
command -v ninja >/dev/null && [ ! -f "$BUILD/Makefile" ] && GEN=(-G Ninja)
mkdir -p "$BUILD"
log "configuring $BUILD"
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DMMPOST_BUILD_TESTS=OFF \
  -DTorch_DIR="$SP/torch/share/cmake/Torch" -DCUDA_TOOLKIT_ROOT_DIR="$SHIM" \
  -DCUDAToolkit_ROOT="$SHIM" -DCMAKE_CUDA_COMPILER="$SHIM/bin/nvcc" 2>&1 | tee "$BUILD/configure.log" >&2
grep -q "dist/ builds the NCCL backend" "$BUILD/configure.log" || { log "error: CMake did not enable NCCL"; exit 1; }
ok "CMake enables the NCCL backend ($(sed -n 's/.*NCCL backend (\(.*\))/\1/p' "$BUILD/configure.log"))"
log "building $BUILD/mmpost"
cmake --build "$BUILD" -j"$(nproc)" --target mmpost >&2
# grep without -q reads all of nm's output (with -q, nm's SIGPIPE fails the pipeline under pipefail)
nm -C "$BUILD/mmpost" | grep ProcessGroupNCCL >/dev/null || { log "error: no ProcessGroupNCCL in the binary"; exit 1; }
ok "build-cuda/mmpost links ProcessGroupNCCL"
ok "$("$BUILD/mmpost" --version | tr '\n' ' ')"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$BUILD/mmpost" sft -r recipes/tiny/sft-tiny.json --set data.eval= --set train.max_steps=3 \
  --output "$T/sft" >"$T/sft.out" 2>"$T/sft.err" || { cat "$T/sft.err"; exit 1; }
grep -q '"exit_reason":"completed"' "$T/sft.out" && ok "a 3-step SFT on the CPU completes"
if "$BUILD/mmpost" --version | grep -q "CUDA not available"; then
  set +e
  "$BUILD/mmpost" sft -r recipes/tiny/sft-tiny.json --set data.eval= --output "$T/cuda" \
    --device cuda >/dev/null 2>"$T/cuda.err"
  rc=$?
  set -e
  [ $rc = 2 ] && grep -q 'device "cuda" requested' "$T/cuda.err" ||
    { cat "$T/cuda.err"; log "error: --device cuda without a GPU exited $rc"; exit 1; }
  ok "--device cuda without a GPU: exit 2, $(head -n 1 "$T/cuda.err")"
fi
