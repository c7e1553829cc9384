// The device of the gpu-labelled tests: CUDA device 0 when torch sees one; otherwise each case
// skips (GTEST_SKIP) — with Debian's CPU-only libtorch, or on a machine without a GPU.
//
// TROUPE_GPU_TEST_DEVICE=cpu runs the same cases with the CPU standing in for the GPU: a dry
// run of their logic on a machine without one (the comparisons are then CPU against CPU, and
// engine cases run the device path's plain torch ops against the fused CPU kernels). It
// proves the test code, not the GPU.
#pragma once

#include <cstdlib>
#include <string>

#include <c10/core/Device.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

namespace troupe::test_support {

// True when the cases run on the CPU as a dry run (see above).
inline bool GpuTestDryRun() {
  const char* env = std::getenv("TROUPE_GPU_TEST_DEVICE");
  return env != nullptr && std::string(env) == "cpu";
}

// The device the cases run on.
inline c10::Device GpuTestDevice() {
  return GpuTestDryRun() ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

// Why the cases cannot run here ("" when they can).
inline std::string GpuTestSkipReason() {
  if (GpuTestDryRun() || torch::cuda::is_available()) return "";
  return "no CUDA device visible to torch (a CPU-only libtorch or no GPU); "
         "TROUPE_GPU_TEST_DEVICE=cpu dry-runs these cases on the CPU";
}

}  // namespace troupe::test_support

#define TROUPE_REQUIRE_GPU_DEVICE()                                               \
  do {                                                                            \
    const std::string troupe_skip_ = ::troupe::test_support::GpuTestSkipReason(); \
    if (!troupe_skip_.empty()) GTEST_SKIP() << troupe_skip_;                      \
  } while (0)
