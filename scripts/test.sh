#!/usr/bin/env bash
# The test command of README's quick start (and of .ci/run): installs what is
# missing, builds, and runs the whole suite through CTest.
# Pass a CTest label regex to run a subset: scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR="${TROUPE_BUILD_DIR:-build}"
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "${TROUPE_TEST_JOBS:-2}" "$@" </dev/null
