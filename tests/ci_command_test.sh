#!/usr/bin/env bash
# CI runs exactly what a newcomer runs: README's quick-start test line (the
# one running scripts/test.sh) must appear verbatim in .ci/run.
set -euo pipefail
root="${1:-$(dirname "$0")/..}"
line=$(grep -E '^scripts/test\.sh( |$)' "$root/README.md" | head -1)
[ -n "$line" ] || { echo "README.md: no quick-start line running scripts/test.sh" >&2; exit 1; }
grep -Fxq -- "$line" "$root/.ci/run" || {
  echo ".ci/run does not run README's test line verbatim: '$line'" >&2; exit 1; }
echo "ok: .ci/run runs '$line'"
