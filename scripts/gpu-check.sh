#!/usr/bin/env bash
# GPU checks of the weight broadcast's nccl backend, in one go, for a machine with
# CUDA GPUs (the rest of the suite runs without them). Builds only what it needs
# (broadcast_nccl_test, broadcast_bench) into ${TROUPE_BUILD_DIR:-build-gpu}, runs
# the nccl tests, then, with two or more GPUs, a short NCCL broadcast benchmark
# (learner on GPU 0, one receiver per further GPU, up to 4; 100 MB).
#
#   scripts/gpu-check.sh            # everything
#   GPU_CHECK_BENCH=0 scripts/gpu-check.sh   # tests only
#
# With one GPU the multi-rank test and the bench skip (NCCL needs a GPU per rank);
# the abort-on-deadline and single-rank staging tests still run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${TROUPE_BUILD_DIR:-build-gpu}"
JOBS="${TROUPE_JOBS:-$(nproc)}"

if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || true; fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTROUPE_WITH_NCCL=ON \
  -DTROUPE_WITH_GRPC=OFF >"$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
if ! grep -q "NCCL backend enabled" "$BUILD.configure.log"; then
  echo "gpu-check: CUDA + NCCL not found at configure time (see $BUILD.configure.log)" >&2
  exit 1
fi
cmake --build "$BUILD" -j "$JOBS" --target broadcast_nccl_test broadcast_bench

echo "== broadcast_nccl_test"
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE timeout 600 \
  "$BUILD/tests/broadcast/broadcast_nccl_test" --gtest_color=no

GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then GPUS=$(nvidia-smi -L | grep -c '^GPU' || true); fi
if [ "${GPU_CHECK_BENCH:-1}" = "1" ] && [ "$GPUS" -ge 2 ]; then
  K=$((GPUS - 1)); [ "$K" -gt 4 ] && K=4
  RECEIVERS=1; [ "$K" -ge 2 ] && RECEIVERS="1,2"; [ "$K" -ge 4 ] && RECEIVERS="1,2,4"
  echo "== broadcast_bench nccl (K=$RECEIVERS)"
  OMP_NUM_THREADS=1 timeout 300 "$BUILD/bench/broadcast/broadcast_bench" \
    --backends nccl --sizes 100 --receivers "$RECEIVERS" --repeats 3
else
  echo "== nccl bench skipped ($GPUS GPU(s); needs 2 or more)"
fi
