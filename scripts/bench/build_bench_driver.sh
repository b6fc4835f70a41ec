#!/usr/bin/env bash
# Builds OUT_DIR/mmpost-bench (the bench-preprocess stage only) for when build/mmpost predates
# that subcommand: compiles apps/mmpost/bench.cpp + scripts/bench/bench_main.cpp against the
# headers of git revision REV (default HEAD, which the lead's build/ is assumed to match: others
# may be editing lib/ headers in the working tree) and links the lead's build/libmmpost_lib.a
# with the flags CMake recorded in build/compile_commands.json. Touches nothing under build/.
# Usage: scripts/bench/build_bench_driver.sh OUT_DIR [REV]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT_DIR="$1"; REV="${2:-HEAD}"
BUILD="${BUILD_DIR:-$ROOT/build}"
mkdir -p "$OUT_DIR"
rm -rf "$OUT_DIR/src" && mkdir -p "$OUT_DIR/src"
git -C "$ROOT" archive "$REV" lib apps | tar -x -C "$OUT_DIR/src"
cp "$ROOT/apps/mmpost/bench.cpp" "$OUT_DIR/src/apps/mmpost/bench.cpp"
TORCH_LIB="$("$ROOT/.venv/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
# A CLI source's flags (defines, includes, PCH) minus -o/-c, with $ROOT/{apps,lib} -> the snapshot.
FLAGS="$("$ROOT/.venv/bin/python" - "$BUILD/compile_commands.json" "$ROOT" "$OUT_DIR/src" <<'PY'
import json, shlex, sys
cc, root, src = sys.argv[1:4]
for c in json.load(open(cc)):
    if "/apps/mmpost/" in c["file"]:
        out, skip = [], False
        for x in shlex.split(c["command"])[1:]:
            if skip: skip = False; continue
            if x in ("-o", "-c"): skip = True; continue
            out.append(x.replace(f"-I{root}/apps", f"-I{src}/apps").replace(f"-I{root}/lib", f"-I{src}/lib"))
        print(" ".join(shlex.quote(x) for x in out)); break
PY
)"
for src in "$OUT_DIR/src/apps/mmpost/bench.cpp" "$ROOT/scripts/bench/bench_main.cpp"; do
  eval c++ $FLAGS -I"$OUT_DIR/src/apps" -c "$src" -o "$OUT_DIR/$(basename "$src" .cpp).o"
done
c++ -O3 "$OUT_DIR/bench.o" "$OUT_DIR/bench_main.o" "$BUILD/libmmpost_lib.a" \
  -Wl,-rpath,"$TORCH_LIB" -L"$TORCH_LIB" -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed \
  -lopencv_imgcodecs -lopencv_imgproc -lopencv_core -lsentencepiece -lpthread \
  -o "$OUT_DIR/mmpost-bench"
echo "$OUT_DIR/mmpost-bench"
