#!/usr/bin/env bash
# The run command of README's quick start: installs what is missing, builds,
# and runs the default job (configs/tiny_reverse.yaml). Extra arguments go to
# `troupe run` (e.g. --set rollout.count=3).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR="${TROUPE_BUILD_DIR:-build}"
if [ -x "$BUILD_DIR/launcher/troupe" ]; then
  exec "$BUILD_DIR/launcher/troupe" run configs/tiny_reverse.yaml "$@"
fi
# Until the launcher exists, the transport benchmark is the demo.
exec "$BUILD_DIR/bench/transport/bench_transport" "$@"
