#!/usr/bin/env bash
# Fuzzes the transport's message decoder with libFuzzer (clang + ASan) for a
# bounded time and merges new coverage-increasing inputs into the regression
# corpus tests/transport/corpus (replayed by transport_fuzz_corpus_test in
# every CI run). Usage: scripts/fuzz-transport.sh [seconds=60] [jobs=1]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-60}"
JOBS="${2:-1}"
BUILD_DIR="${TROUPE_FUZZ_BUILD_DIR:-build-fuzz}"
CORPUS=tests/transport/corpus
CC_BIN="$(command -v clang-14 || command -v clang)"
CXX_BIN="$(command -v clang++-14 || command -v clang++)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer" \
  -DTROUPE_FUZZ=ON -DTROUPE_BUILD_BENCH=OFF -DTROUPE_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "${TROUPE_JOBS:-2}" --target transport_decoder_fuzzer transport_fuzz_seeds
mkdir -p "$CORPUS"
"$BUILD_DIR/transport/transport_fuzz_seeds" "$CORPUS"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp "$CORPUS"/* "$WORK"/
# Decoder errors are logged at warn level; keep the fuzzer's output readable.
"$BUILD_DIR/transport/transport_decoder_fuzzer" "$WORK" -max_total_time="$SECONDS_TO_RUN" \
  -max_len=65536 -timeout=10 -rss_limit_mb=2048 -jobs="$JOBS" -workers="$JOBS" \
  -print_final_stats=1 2>&1 | grep -v " W \[" | tail -n 25
# Keep only inputs that add coverage.
"$BUILD_DIR/transport/transport_decoder_fuzzer" -merge=1 "$CORPUS" "$WORK" 2>&1 | tail -n 3
echo "corpus: $(ls "$CORPUS" | wc -l) inputs in $CORPUS"
