#!/usr/bin/env bash
# Device run of the GPU check: configure against the machine's python torch (CUDA), build with
# ninja, run the driver on cpu+cuda, and copy the log and the JSON summary to $OUT.
# Needs scripts/gpu_check/third_party (prepare.sh, named in the run's `carry`) when the machine
# has no nlohmann-json package. Usage (repo root): bash scripts/gpu_check/run_on_device.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/gpu_check_out}
mkdir -p "$out"
build=${GPU_CHECK_BUILD:-/tmp/gpuchk-build}
py=${PYTHON:-python3}
log=$out/gpu_check.log
main() {

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
nvcc --version 2>&1 | tail -1 || true
cmake --version | head -1
prefix=$($py -c 'import torch;print(torch.utils.cmake_prefix_path)') || { echo "no python torch"; return 1; }
torch_root=$($py -c 'import torch,os;print(os.path.dirname(torch.__file__))')
$py -c 'import torch;print("python torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
[[ -f $root/scripts/gpu_check/third_party/nlohmann/json.hpp ]] || echo "note: no third_party/nlohmann (carry it) - trying the system package"

export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
jobs=${JOBS:-16}
t0=$(date +%s)
echo "== configure (find_package(Torch))"
if ! cmake -S "$root/scripts/gpu_check" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$prefix" > "$out/cmake.log" 2>&1; then
  tail -40 "$out/cmake.log"
  echo "== configure failed; falling back to GPU_CHECK_MANUAL_TORCH=ON"
  build=$build-manual
  cmake -S "$root/scripts/gpu_check" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGPU_CHECK_MANUAL_TORCH=ON -DGPU_CHECK_TORCH_ROOT="$torch_root" >> "$out/cmake.log" 2>&1 \
    || { tail -40 "$out/cmake.log"; echo '{"ok": false, "error": "configure"}'; return 1; }
fi
grep -iE 'warning|gpu_check|cuda' "$out/cmake.log" | head -20
echo "== build (-j$jobs)"
if ! ninja -C "$build" -j"$jobs" > "$out/build.log" 2>&1; then
  grep -B2 -A12 'error' "$out/build.log" | head -80
  echo '{"ok": false, "error": "build"}'
  return 1
fi
echo "build took $(( $(date +%s) - t0 )) s"
echo "== run"
"$build/gpu_check" --device "${GPU_CHECK_DEVICE:-cuda}" "$@"
rc=$?
echo "gpu_check exit code $rc"
return $rc
}

main "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
grep '^{"ok"' "$log" | tail -1 > "$out/gpu_check.json"
exit "$rc"
