#!/usr/bin/env bash
# The test command from README.md: setup if needed (idempotent), build, run the CTest suite
# ([unit], [golden], [e2e]; [gpu] and [slow] are excluded by default), then the transformers
# round-trip check when the venv has transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2 "$@"
