#!/usr/bin/env bash
# Copies the header-only nlohmann-json into scripts/gpu_check/third_party (git-ignored) so the
# GPU check builds on a machine without the nlohmann-json dev package (the device image).
# Run it here before a device run, and name scripts/gpu_check/third_party in the run's `carry`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${NLOHMANN_INCLUDE:-/usr/include/nlohmann}
[[ -f $src/json.hpp ]] || { echo "prepare.sh: $src/json.hpp not found (apt install nlohmann-json3-dev)" >&2; exit 1; }
rm -rf "$here/third_party/nlohmann"
mkdir -p "$here/third_party"
cp -r "$src" "$here/third_party/nlohmann"
echo "prepare.sh: copied $src -> $here/third_party/nlohmann ($(du -sh "$here/third_party" | cut -f1))"
