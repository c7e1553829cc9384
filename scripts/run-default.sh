#!/usr/bin/env bash
# The run command of README's quick start: installs what is missing, builds,
# and runs the default job (configs/tiny_reverse.yaml). Extra arguments go to
# `troupe run` (e.g. --set rollout.count=3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Only what the job runs (the CLI and the actor host), not every test and
# benchmark: the test command builds those.
TROUPE_BUILD_TARGETS=troupe-run scripts/build.sh
BUILD_DIR="${TROUPE_BUILD_DIR:-build}"
exec "$BUILD_DIR/launcher/troupe" run configs/tiny_reverse.yaml "$@"
