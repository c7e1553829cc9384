#!/usr/bin/env bash
# One prepared, time-boxed run of Troupe's GPU checks on a machine with a CUDA GPU, a PyTorch
# wheel (torch >= 2.4 built with the C++11 ABI, i.e. >= 2.7 from PyPI), nvcc, CMake, ninja
# and a C++ compiler, but no package registry. From the repository root:
#
#   OUT=results scripts/gpu/build-and-check.sh               # on the GPU machine
#   OUT=/tmp/dry scripts/gpu/build-and-check.sh --cpu-dry-run  # anywhere: the same steps
#       against Debian's CPU libtorch; the gpu tests run their logic on the CPU
#       (TROUPE_GPU_TEST_DEVICE=cpu), the benchmark on a tiny model, no CUDA probing
#
# Needs .gpu-deps/troupe-deps.tar.gz (scripts/gpu/prepare-deps.sh makes it on a Debian 12
# machine; carry it to the GPU machine with the tree). Phases: probe, deps (unpack +
# relocate), configure (against the wheel's Torch, CUDA and NCCL; one retry without cuDNN and
# friends), build (only what the checks need, in three steps: the gpu tests and the benchmark,
# the job's binaries, the CPU tests; every compile error in one go), the gpu-labelled tests, benchmark (bench/gpu/gpu_bench, its decode
# limit from the GPU's HBM bandwidth by name; the NCCL broadcast benchmark with 2+ GPUs), the
# default job with rollouts on the GPU (then with the learner there too, if time is left), the
# CPU tests against this torch in what is left,
# summary. The most important results come first. Never stops early: a failed or
# skipped phase is noted and the next one runs if it can. Stops itself within
# GPU_RUN_BUDGET seconds (default 510: the device tool allows 600 per command). Writes at most
# 8 files into $OUT (what the device tool returns): summary.txt, results.jsonl (one JSON
# object per phase, test and benchmark), probe.txt, configure.log, build.log, tests.log,
# bench.log and, when it fits in 15 MiB, torch-headers.tar.xz (the wheel's headers, for
# scripts/gpu/check-torch-api.py on a machine without the wheel). Prints the summary last.
#
# Environment: OUT (default ./gpu-results), GPU_RUN_BUDGET, GPU_BUILD_DIR (build-gpu),
# GPU_DEPS_DIR (where the prefix is unpacked; default /tmp/troupe-gpu-deps), PYTHON
# (python3), JOBS (nproc), GPU_RUN_TESTS (test names to run instead of the default list),
# GPU_RUN_JOB (1: run the default job; default 1 on a GPU, 0 in the dry run),
# GPU_RUN_HEADERS (1: pack the wheel's headers; default 1 on a GPU), GPU_BUILD_LIMIT (seconds
# for the build, default 300), GPU_BENCH_LIMIT (170), GPU_JOB_LIMIT (150), GPU_HBM_TBPS (the
# decode limit's bandwidth; default by the GPU's name, 4.8 if unknown).
set -uo pipefail
DRY=0
[ "${1:-}" = "--cpu-dry-run" ] && DRY=1
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
BUDGET=${GPU_RUN_BUDGET:-510}
OUT=${OUT:-$ROOT/gpu-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
S=$OUT/summary.txt
J=$OUT/results.jsonl
: >"$S"
: >"$J"
: >"$OUT/tests.log"
: >"$OUT/bench.log"
B=${GPU_BUILD_DIR:-$ROOT/build-gpu}
D=${GPU_DEPS_DIR:-/tmp/troupe-gpu-deps}
PY=${PYTHON:-python3}
NJ=${JOBS:-$(nproc)}
TARBALL=$ROOT/.gpu-deps/troupe-deps.tar.gz

el() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(el))); }
note() { echo "$(printf '%4d' "$(el)")s $*" | tee -a "$S"; }
# jl key=value ...: one JSON object into results.jsonl (numbers stay numbers).
jl() {
  "$PY" - "$@" >>"$J" <<'PY'
import json, sys
o = {}
for kv in sys.argv[1:]:
    k, _, v = kv.partition("=")
    try:
        o[k] = int(v)
    except ValueError:
        try:
            o[k] = float(v)
        except ValueError:
            o[k] = v
print(json.dumps(o))
PY
}
# bounded SECONDS: a command's limit, at most what is left minus a reserve for the summary.
bounded() {
  local want=$1 l
  l=$(($(left) - 20))
  [ "$want" -gt "$l" ] && want=$l
  echo "$want"
}

note "troupe gpu run: $([ $DRY = 1 ] && echo "CPU dry run" || echo "GPU") budget ${BUDGET}s, out $OUT"

# ---- 1. probe --------------------------------------------------------------------------------
GPUS=0
TORCH_OK=1
if [ $DRY = 1 ]; then
  TORCH_CMAKE=/usr/lib/x86_64-linux-gnu/cmake
  TORCH_INC=/usr/include
  {
    echo "dry run: Debian's libtorch (CPU)"
    grep -h 'define TORCH_VERSION ' -A1 /usr/include/torch/csrc/api/include/torch/version.h
    for t in g++ cmake ninja nvcc; do printf '%-8s %s\n' "$t" "$(command -v $t)"; done
    g++ --version | head -1
    cmake --version | head -1
  } >"$OUT/probe.txt" 2>&1
else
  {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv
    for t in "$PY" nvcc gcc g++ c++ cmake ninja xz; do printf '%-8s %s\n' "$t" "$(command -v "$t")"; done
    nvcc --version | tail -2
    g++ --version | head -1
    cmake --version | head -1
    ninja --version
    ldd --version | head -1
    "$PY" - <<'PY'
import os, torch
inc = os.path.join(os.path.dirname(torch.__file__), "include")
print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi",
      torch._C._GLIBCXX_USE_CXX11_ABI, "gpu", torch.cuda.is_available(),
      "devices", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())
print("cmake_prefix_path", torch.utils.cmake_prefix_path)
for h in ("gloo/algorithm.h", "fmt/format.h", "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp",
          "torch/csrc/distributed/c10d/Store.hpp"):
    print("has", h, os.path.exists(os.path.join(inc, h)))
PY
  } >"$OUT/probe.txt" 2>&1
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  # The decode limit's HBM bandwidth (datasheet, TB/s) by the GPU's name; GPU_HBM_TBPS wins.
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$GPU_NAME" in
    *H200*) HBM=4.8 ;;
    *H100*NVL*) HBM=3.9 ;;
    *H100*PCIe*) HBM=2.0 ;;
    *H100*) HBM=3.35 ;;
    *A100*80GB*) HBM=2.04 ;;
    *A100*) HBM=1.56 ;;
    *) HBM=4.8 ;;
  esac
  HBM=${GPU_HBM_TBPS:-$HBM}
  echo "gpu_name $GPU_NAME hbm_tbps $HBM" >>"$OUT/probe.txt"
  TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  TORCH_INC=$TORCH_DIR/include
  TV=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
  ABI=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
  if [ -z "$TORCH_CMAKE" ]; then
    note "probe: $PY cannot import torch"
    TORCH_OK=0
  elif ! "$PY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 4))'; then
    note "probe: torch $TV is older than 2.4: not supported"
    TORCH_OK=0
  elif [ "$ABI" != 1 ]; then
    note "probe: torch $TV uses the pre-C++11 ABI; Debian's C++ libraries need the C++11 ABI (PyPI wheels have it from 2.7)"
    TORCH_OK=0
  fi
  NV=$("$PY" -c 'import os, nvidia.nccl as m; print(os.path.dirname(list(m.__path__)[0]))' 2>/dev/null)
  NVCC=$(command -v nvcc)
  CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
  NCCL_INC=$NV/nccl/include
  NCCL_LIB=$(ls "$NV"/nccl/lib/libnccl.so* 2>/dev/null | head -1)
  [ -f "$CUDA_ROOT/include/nccl.h" ] && [ -z "$NCCL_LIB" ] && NCCL_INC=$CUDA_ROOT/include &&
    NCCL_LIB=$(ls "$CUDA_ROOT"/lib*/libnccl.so* 2>/dev/null | head -1)
  CUDART_LIB=$(ls "$CUDA_ROOT"/lib64/libcudart.so "$CUDA_ROOT"/lib/libcudart.so \
    "$NV"/cu*/lib/libcudart.so.* "$NV"/cuda_runtime/lib/libcudart.so.* 2>/dev/null | head -1)
  CUDART_INC=$CUDA_ROOT/include
  {
    echo "gpus $GPUS torch_cmake $TORCH_CMAKE nvidia $NV"
    echo "cuda_root $CUDA_ROOT nccl $NCCL_INC $NCCL_LIB cudart $CUDART_LIB"
  } >>"$OUT/probe.txt"
  # The wheel's headers, for a syntax check on a machine without it (background).
  if [ "${GPU_RUN_HEADERS:-1}" = 1 ] && [ -n "${TORCH_DIR:-}" ]; then
    (nice -n 19 tar -C "$TORCH_DIR" -cf - include version.py 2>/dev/null | nice -n 19 xz -T4 -6 >"$OUT/torch-headers.tar.xz"
      [ "$(stat -c %s "$OUT/torch-headers.tar.xz")" -le $((15 << 20)) ] || rm -f "$OUT/torch-headers.tar.xz") &
    HDR_PID=$!
  fi
fi
if [ $DRY = 1 ]; then
  TV="$(grep -A1 'define TORCH_VERSION ' /usr/include/torch/csrc/api/include/torch/version.h | grep -o '[0-9][0-9.]*') (Debian, CPU)"
fi
note "probe: torch ${TV:-unknown}, $GPUS GPU(s) ${GPU_NAME:-} (HBM ${HBM:-?} TB/s for the decode limit)"
jl kind=phase name=probe gpus="$GPUS" torch_ok="$TORCH_OK" seconds="$(el)"

# ---- 2. deps: unpack the carried Debian 12 prefix and relocate it ---------------------------
DEPS_OK=0
if [ -f "$TARBALL" ]; then
  rm -rf "$D" && mkdir -p "$D" && tar -C "$D" -xzf "$TARBALL" &&
    (cd "$D" && xargs -a .relocate -d '\n' sed -i "s#@TROUPE_DEPS@#$D#g") && DEPS_OK=1
  # One gloo: the wheel's own when it ships its headers (they match its libtorch).
  [ -f "$TORCH_INC/gloo/algorithm.h" ] && [ "$TORCH_INC" != /usr/include ] && rm -rf "$D/usr/include/gloo"
  note "deps: unpacked into $D ($(du -sm "$D" | cut -f1) MiB, $(wc -l <"$D/.relocate") files relocated)"
else
  note "deps: $TARBALL missing (run scripts/gpu/prepare-deps.sh where apt works)"
fi
jl kind=phase name=deps ok="$DEPS_OK" seconds="$(el)"

# ---- 3. configure ------------------------------------------------------------------------------
CONF_OK=0
if [ $DEPS_OK = 1 ] && [ $TORCH_OK = 1 ]; then
  L="$D/usr/lib/x86_64-linux-gnu:$D/lib/x86_64-linux-gnu"
  # The prefix's libraries are found through RPATH (transitively: --disable-new-dtags), never
  # through LD_LIBRARY_PATH, so the machine's own tools keep their own libraries.
  LINK="-Wl,--disable-new-dtags -Wl,-rpath,$L -Wl,-rpath-link,$L"
  ARGS=(-S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=$D/usr;$TORCH_CMAKE"
    "-DPKG_CONFIG_EXECUTABLE=$D/bin/pkg-config"
    "-DCAPNP_EXECUTABLE=$D/bin/capnp" "-DCAPNPC_CXX_EXECUTABLE=$D/bin/capnpc-c++"
    "-DProtobuf_PROTOC_EXECUTABLE=$D/bin/protoc" "-DOPENSSL_ROOT_DIR=$D/usr"
    "-DCMAKE_EXE_LINKER_FLAGS=$LINK" "-DCMAKE_SHARED_LINKER_FLAGS=$LINK"
    -DTROUPE_WERROR=OFF -DTROUPE_WITH_GRPC=OFF -DTROUPE_BUILD_BENCH=ON
    -DTROUPE_TORCH_PCH=OFF)  # 16 cores need no precompiled headers: one thing less to go wrong
  if [ $DRY = 0 ]; then
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    ARGS+=("-DCUDAToolkit_ROOT=$CUDA_ROOT" "-DCMAKE_CUDA_COMPILER=$NVCC"
      "-DCUDA_TOOLKIT_ROOT_DIR=$CUDA_ROOT" "-DCMAKE_CUDA_ARCHITECTURES=${TORCH_CUDA_ARCH_LIST//./}" "-DNCCL_INCLUDE_DIR=$NCCL_INC"
      "-DNCCL_LIBRARY=$NCCL_LIB" "-DCUDART_INCLUDE_DIR=$CUDART_INC" "-DCUDART_LIBRARY=$CUDART_LIB")
  fi
  printf '%q ' cmake "${ARGS[@]}" >"$OUT/configure.log"
  echo >>"$OUT/configure.log"
  timeout "$(bounded 180)" cmake "${ARGS[@]}" >>"$OUT/configure.log" 2>&1 && CONF_OK=1
  if [ $CONF_OK = 0 ] && [ $DRY = 0 ]; then
    # One retry without what torch's CMake config may look for and this build never needs
    # (cuDNN, cuSPARSELt, cuFile), with the host compiler named for nvcc.
    note "configure: failed; retrying without cuDNN/cuSPARSELt/cuFile"
    tail -15 "$OUT/configure.log" | sed 's/^/    /' | tee -a "$S" >/dev/null
    rm -f "$B/CMakeCache.txt"
    ARGS+=(-DCAFFE2_USE_CUDNN=OFF -DUSE_CUDNN=OFF -DCAFFE2_USE_CUSPARSELT=OFF -DUSE_CUSPARSELT=OFF
      -DCAFFE2_USE_CUFILE=OFF -DUSE_CUFILE=OFF "-DCMAKE_CUDA_HOST_COMPILER=$(command -v g++)")
    echo "===== retry" >>"$OUT/configure.log"
    timeout "$(bounded 180)" cmake "${ARGS[@]}" >>"$OUT/configure.log" 2>&1 && CONF_OK=1
  fi
  # Every dependency must come from the prefix (in the dry run /usr has them too: this proves
  # the relocation, not just that something was found).
  outside=$(grep -E '^(CapnProto|spdlog|fmt|nlohmann_json|yaml-cpp|absl|simdjson|GTest|Boost)_DIR:|^(pkgcfg_lib_[A-Z0-9_]+_[a-z0-9_.+-]+|Protobuf_LIBRARY_RELEASE|Protobuf_PROTOC_EXECUTABLE|OPENSSL_SSL_LIBRARY|ICU_INCLUDE_DIR|CAPNP_EXECUTABLE):' \
    "$B/CMakeCache.txt" 2>/dev/null | grep -v "=$D/" | cut -d: -f1 | tr '\n' ' ')
  NCCL_ON=$(grep -c 'NCCL backend enabled' "$OUT/configure.log")
  note "configure: $([ $CONF_OK = 1 ] && echo ok || echo FAILED) (nccl backend: $([ "$NCCL_ON" -gt 0 ] && echo on || echo off); found outside the prefix: ${outside:-nothing})"
  [ -n "$outside" ] && CONF_OK=0 && note "configure: dependencies found outside $D: the relocation leaks"
  [ $CONF_OK = 1 ] || tail -25 "$OUT/configure.log" | sed 's/^/    /' | tee -a "$S" >/dev/null
fi
jl kind=phase name=configure ok="$CONF_OK" seconds="$(el)"

# ---- 4. build (only what the checks need; -k 0: every error in one run) ---------------------
GPU_TESTS="engine_cuda_test trainer_cuda_test broadcast_cuda_test broadcast_nccl_test"
CPU_TESTS="trainer_checkpoint_test trainer_learner_test broadcast_layout_test broadcast_protocol_test
  broadcast_inproc_test engine_model_test engine_generation_test trainer_core_test"
TESTS=${GPU_RUN_TESTS:-"$GPU_TESTS $CPU_TESTS"}
BUILD_OK=0
if [ $CONF_OK = 1 ]; then
  known=$(ninja -C "$B" -t targets all 2>/dev/null | cut -d: -f1)
  TARGETS=""
  for t in $TESTS gpu_bench broadcast_bench troupe troupe-actor; do
    grep -qx "$t" <<<"$known" && TARGETS="$TARGETS $t"
  done
  # Three steps in order of importance, so that a build cut off by its limit still leaves what
  # matters most: the gpu tests and the benchmark, then the job's binaries, then the CPU tests.
  STEP1="" STEP2="" STEP3=""
  for t in $TARGETS; do
    case " $GPU_TESTS gpu_bench " in
      *" $t "*) STEP1="$STEP1 $t" ;;
      *) case " troupe troupe-actor broadcast_bench " in *" $t "*) STEP2="$STEP2 $t" ;; *) STEP3="$STEP3 $t" ;; esac ;;
    esac
  done
  bstart=$(el)
  blimit=${GPU_BUILD_LIMIT:-300}
  : >"$OUT/build.log"
  BUILD_OK=1
  # build_step NAME TARGETS...: within what is left of the build's limit (and of the budget).
  build_step() {
    local name=$1 rest
    shift
    [ $# -gt 0 ] || return 0
    rest=$((blimit - ($(el) - bstart)))
    [ "$rest" -gt "$(bounded "$rest")" ] && rest=$(bounded "$rest")
    if [ "$rest" -lt 10 ]; then
      note "build: $name skipped (build limit ${blimit}s reached)"
      BUILD_OK=0
      return 1
    fi
    echo "===== build $name:$*" >>"$OUT/build.log"
    if timeout "$rest" cmake --build "$B" -j"$NJ" --target "$@" -- -k 0 >>"$OUT/build.log" 2>&1; then
      note "build: $name ok after $(($(el) - bstart))s"
    else
      note "build: $name FAILED or cut off after $(($(el) - bstart))s"
      BUILD_OK=0
    fi
  }
  # shellcheck disable=SC2086
  build_step "gpu tests and benchmark" $STEP1
  # shellcheck disable=SC2086
  build_step "the job's binaries" $STEP2
  # shellcheck disable=SC2086
  build_step "CPU tests" $STEP3
  errors=$(grep -c 'error:' "$OUT/build.log")
  note "build: $([ $BUILD_OK = 1 ] && echo ok || echo "FAILED or cut off") ($errors compile errors; targets:$TARGETS)"
  grep -m12 'error:' "$OUT/build.log" | sed 's/^/    /' | tee -a "$S" >/dev/null
fi
jl kind=phase name=build ok="$BUILD_OK" seconds="$(el)"

# ---- 5. tests: the gpu-labelled ones first, the CPU ones last (phase 8) -------------------
exe() { find "$B/tests" "$B/bench" "$B/launcher" "$B/actors" -maxdepth 2 -type f -name "$1" -perm -u+x 2>/dev/null | head -1; }
limit_of() { case $1 in engine_generation_test | engine_model_test | broadcast_protocol_test) echo 240 ;; *_cuda_test | broadcast_nccl_test) echo 90 ;; *) echo 120 ;; esac; }
TEST_ENV=(OMP_NUM_THREADS=4 OMP_WAIT_POLICY=PASSIVE NCCL_DEBUG=WARN "TROUPE_BUILD_DIR=$B" "TROUPE_SOURCE_DIR=$ROOT")
[ $DRY = 1 ] && TEST_ENV+=(TROUPE_GPU_TEST_DEVICE=cpu OMP_NUM_THREADS=1)
run_tests() {
  local t bin s log rc secs pass fail skip
  for t in "$@"; do
    bin=$(exe "$t")
    if [ -z "$bin" ]; then
      note "$t: not built"
      jl kind=test name="$t" status=not_built
      continue
    fi
    if [ "$(left)" -lt 40 ]; then
      note "$t: skipped (budget)"
      jl kind=test name="$t" status=budget
      continue
    fi
    s=$(date +%s)
    log=$OUT/.t.log
    (cd "$B" && env "${TEST_ENV[@]}" timeout "$(bounded "$(limit_of "$t")")" "$bin" --gtest_color=no) >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - s))
    pass=$(grep -c '^\[       OK \]' "$log")
    fail=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$log")
    skip=$(grep -c '^\[  SKIPPED \] [A-Za-z]' "$log")
    { echo "===== $t rc=$rc ${secs}s"; cat "$log"; } >>"$OUT/tests.log"
    # The figures the tests print (their measured bounds) go to the summary too.
    note "$t: rc=$rc ${secs}s passed $pass failed $fail skipped $skip"
    grep -E '^(engine cuda|rl update|.*weights after the update|aborted after)' "$log" | sed 's/^/    /' | tee -a "$S" >/dev/null
    grep '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^/    /' | tee -a "$S" >/dev/null
    jl kind=test name="$t" rc="$rc" passed="$pass" failed="$fail" skipped="$skip" seconds="$secs"
    rm -f "$log"
  done
}
# The gpu tests now; the CPU tests against this torch after the benchmark and the job.
RUN_GPU="" RUN_CPU=""
for t in $TESTS; do
  case " $GPU_TESTS " in *" $t "*) RUN_GPU="$RUN_GPU $t" ;; *) RUN_CPU="$RUN_CPU $t" ;; esac
done
# shellcheck disable=SC2086
run_tests $RUN_GPU

# ---- 6. benchmarks -----------------------------------------------------------------------------
bench=$(exe gpu_bench)
if [ -n "$bench" ] && [ "$(left)" -gt 90 ]; then
  bl=$(bounded "${GPU_BENCH_LIMIT:-170}")
  if [ $DRY = 1 ]; then
    BARGS=(--device cpu --tiny --batches 1,4 --prompt 16 --new 16 --learner-updates 1)
  else
    BARGS=(--budget-s $((bl - 40)) --hbm-tbps "$HBM")
  fi
  (env "${TEST_ENV[@]}" OMP_NUM_THREADS="$([ $DRY = 1 ] && echo 1 || echo 8)" timeout "$bl" "$bench" "${BARGS[@]}") >"$OUT/.b.log" 2>&1
  rc=$?
  { echo "===== gpu_bench ${BARGS[*]} rc=$rc"; cat "$OUT/.b.log"; } >>"$OUT/bench.log"
  line=$(grep '^{"bench":"gpu"' "$OUT/.b.log" | tail -1)
  [ -n "$line" ] && echo "$line" >>"$J"
  note "gpu_bench: rc=$rc"
  grep -E '^(decode|learner|pack)' "$OUT/.b.log" | sed 's/^/    /' | tee -a "$S" >/dev/null
  rm -f "$OUT/.b.log"
else
  note "gpu_bench: $([ -z "$bench" ] && echo "not built" || echo "skipped (budget)")"
fi
bb=$(exe broadcast_bench)
if [ "$GPUS" -ge 2 ] && [ -n "$bb" ] && [ "$(left)" -gt 100 ]; then
  K=$((GPUS - 1)); [ $K -gt 4 ] && K=4
  R=1; [ $K -ge 2 ] && R=1,2; [ $K -ge 4 ] && R=1,2,4
  (env "${TEST_ENV[@]}" timeout "$(bounded 90)" "$bb" --backends nccl --sizes 100 --receivers "$R" --repeats 3) >>"$OUT/bench.log" 2>&1
  note "broadcast_bench nccl (receivers $R): rc=$?"
  grep '^{' "$OUT/bench.log" | tail -1 >>"$J"
else
  note "broadcast_bench nccl: not run ($GPUS GPU(s): NCCL needs one GPU per rank)"
fi

# ---- 7. the default job on the GPU: the rollouts there (the learner on the CPU), then, if
# there is time, the learner there too (trainer.device), both sharing the one GPU -------------
troupe=$(exe troupe)
DEV=$([ $DRY = 1 ] && echo cpu || echo cuda)
run_job() {  # run_job LABEL --set ...: one bounded `troupe run` of the default job
  local label=$1 jt runs rc
  shift
  jt=$(($(left) - 45))
  [ "$jt" -gt "${GPU_JOB_LIMIT:-150}" ] && jt=${GPU_JOB_LIMIT:-150}
  runs=$(mktemp -d)
  (env OMP_WAIT_POLICY=PASSIVE timeout $((jt + 20)) "$troupe" run configs/tiny_reverse.yaml "$@" \
    --set stop.max_seconds=$jt --set runs_dir="$runs") >"$OUT/.j.log" 2>&1
  rc=$?
  { echo "===== troupe run configs/tiny_reverse.yaml $* max_seconds=$jt rc=$rc"; tail -60 "$OUT/.j.log"
    grep -h -E ' [EW] \[' "$runs"/*/logs/*.log 2>/dev/null | tail -20; } >>"$OUT/bench.log"
  note "default job ($label, ${jt}s at most): rc=$rc"
  grep -E 'time to|steps .*tok/s|accounting|job failed' "$OUT/.j.log" | sed 's/^/    /' | tee -a "$S" >/dev/null
  jl kind=job name="$label" rc="$rc" max_seconds="$jt" \
    summary="$(grep -E 'time to|steps .*tok/s|job failed' "$OUT/.j.log" | tr -s ' ' | tr '\n' ';')"
  rm -rf "$runs" "$OUT/.j.log"
}
if [ "${GPU_RUN_JOB:-$((1 - DRY))}" = 1 ] && [ -n "$troupe" ] && [ -n "$(exe troupe-actor)" ] && [ "$(left)" -gt 100 ]; then
  run_job "rollouts on the GPU, learner on the CPU" --set engine.device=$DEV
  if [ $DRY = 0 ] && [ "$(left)" -gt 100 ]; then
    run_job "rollouts and learner on the GPU" --set engine.device=$DEV --set trainer.device=$DEV
  fi
else
  note "default job: not run"
fi

# ---- 8. the CPU tests against this torch, in what is left -----------------------------------
# shellcheck disable=SC2086
run_tests $RUN_CPU

# ---- 9. summary ----------------------------------------------------------------------------------
[ -n "${HDR_PID:-}" ] && { timeout 30 tail --pid="$HDR_PID" -f /dev/null; }
note "done in $(el)s of ${BUDGET}s"
echo
echo "================ summary ($OUT)"
cat "$S"
