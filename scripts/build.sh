#!/usr/bin/env bash
# Configures and builds Troupe into ${TROUPE_BUILD_DIR:-build} (Release, ccache
# when present). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${TROUPE_BUILD_DIR:-build}"
JOBS="${TROUPE_JOBS:-$(nproc)}"
# A new build folder uses Ninja (installed by install-deps.sh): it starts a target's
# compiles before the libraries it links are linked, so both cores stay busy to the
# end; an existing folder keeps the generator it was made with.
GEN=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE="${TROUPE_BUILD_TYPE:-Release}" "$@"
fi
# TROUPE_BUILD_TARGETS: build only these targets (space-separated); default all.
TARGETS=()
for t in ${TROUPE_BUILD_TARGETS:-}; do TARGETS+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"
