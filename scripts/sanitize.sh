#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the unit and e2e tests (issue 9, part 7).
# Builds build-asan/ with -DMMPOST_SANITIZE=ON (mmpost_lib, mmpost_cli, mmpost, mmpost_tests
# instrumented; LibTorch/OpenCV/sentencepiece are prebuilt and are not), then runs
# `ctest -L 'unit|e2e'` there. The e2e tests run build-asan/mmpost (MMPOST_BINARY points at the
# target in the same build folder), so the CLI's children are checked too: the sanitizer options
# below are environment variables and reach every process the tests start.
# Every ASan/UBSan/LeakSanitizer report goes to a file under build-asan/sanitizer-logs/, so a
# report is caught even in a child whose exit status a test expects to be non-zero; the run
# fails on any failed test or any report, and the last line says how many of each.
#   ASAN_BUILD_DIR=build-asan   build folder
#   CTEST_JOBS=2                parallel tests
#   extra arguments go to ctest (e.g. -R 'unit: ' or --repeat until-fail:3)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
log() { echo "[sanitize] $*" >&2; }

# Packages and .venv (the torch whose LibTorch we link); setup.sh's own build/ is not needed here.
MMPOST_SKIP_BUILD=1 bash scripts/setup.sh

t0=$SECONDS
GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/Makefile" ]] && GEN=(-G Ninja)
# Debug = no -DNDEBUG, so assertions in headers (nlohmann::json, c10 debug checks) are live;
# MMPOST_SANITIZE adds -O1 -g after the build type's flags.
log "configuring $BUILD_DIR (MMPOST_SANITIZE=ON)"
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Debug -DMMPOST_SANITIZE=ON \
      ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} >&2
log "building (from scratch about 10 min on 2 cores)"
cmake --build "$BUILD_DIR" -j"$(nproc)" >&2
build_s=$((SECONDS - t0))

LOGS="$ROOT/$BUILD_DIR/sanitizer-logs"
rm -rf "$LOGS" && mkdir -p "$LOGS"
# ASan (also drives LeakSanitizer inside an ASan process):
#   halt_on_error=1        stop at the first error (the default without -fsanitize-recover=address;
#                          spelled out so nobody turns recovery on by accident)
#   abort_on_error=1       die by SIGABRT instead of exit(1): several e2e tests expect exit 1
#                          ("runtime failure"), so a plain exit(1) could pass as the expected error
#   detect_leaks=1         LeakSanitizer on (the default on x86_64 Linux, spelled out)
#   check_initialization_order=1  static-initialization-order fiasco between our TUs
#   detect_stack_use_after_return=1  use of a dead stack frame's address (fake stacks: slower, catches
#                          returning references to locals)
#   log_path               one file per reporting process (NAME.PID), counted below
#   (no alloc_dealloc_mismatch=0, no detect_odr_violation=0: nothing needed them)
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:check_initialization_order=1:detect_stack_use_after_return=1:log_path=$LOGS/asan"
# LeakSanitizer: suppressions for leaks allocated entirely inside third-party libraries; see the
# file for why each one is there. print_suppressions=0 keeps matched (suppressed) leaks silent.
export LSAN_OPTIONS="suppressions=$ROOT/scripts/sanitize.supp:print_suppressions=0"
# UBSan: every check is already fatal (-fno-sanitize-recover=undefined); halt/abort as for ASan.
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$LOGS/ubsan"

log "running ctest -L 'unit|e2e' in $BUILD_DIR"
t1=$SECONDS
set +e
ctest --test-dir "$BUILD_DIR" -L 'unit|e2e' --output-on-failure -j"${CTEST_JOBS:-2}" --timeout 1200 "$@" \
  2>&1 | tee "$BUILD_DIR/sanitize-ctest.log"
ctest_rc=${PIPESTATUS[0]}
set -e
test_s=$((SECONDS - t1))

summary=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$BUILD_DIR/sanitize-ctest.log" || true)
total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$summary")
failed=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$summary")
skipped=$(grep -cE '\(Skipped\)$' "$BUILD_DIR/sanitize-ctest.log" || true)
if [[ -z "$summary" ]]; then total=0; failed=1; fi
passed=$((total - failed - skipped))

shopt -s nullglob
reports=("$LOGS"/*)
for f in "${reports[@]}"; do
  echo "==================== $f" >&2
  cat "$f" >&2
done

echo "sanitizers: build ${build_s} s, tests ${test_s} s"
echo "sanitizers: ${passed} tests passed, ${failed} failed, ${skipped} skipped, ${#reports[@]} reports"
if ((ctest_rc != 0 || failed != 0 || ${#reports[@]} != 0 || total == 0)); then
  exit 1
fi
