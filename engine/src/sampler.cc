#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <ATen/ATen.h>

namespace troupe::engine {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Sum of p[0, n) in double with eight independent partial sums (the compiler vectorises
// them; the order is fixed, so the result is deterministic).
double SumRange(const float* p, int64_t n) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(p[i + k]);
  double tail = 0.0;
  for (; i < n; ++i) tail += static_cast<double>(p[i]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) +
         tail;
}

}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream)
    : state_(Mix64(seed + 0x9E3779B97F4A7C15ull) ^ Mix64((stream + 1) * 0xD1B54A32D192ED03ull)) {}

uint64_t Rng::Next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return Mix64(state_);
}

int32_t SampleRow(const float* logp, int64_t vocab, const SamplingParams& params, Rng& rng,
                  SampleScratch& scratch) {
  if (params.temperature <= 0.0) {
    return static_cast<int32_t>(std::max_element(logp, logp + vocab) - logp);
  }
  const double u = rng.Uniform();
  // exp(logp) in one vectorised pass; the total is summed (not assumed 1) so rounding never
  // pushes the target past the end.
  scratch.probs.resize(static_cast<size_t>(vocab));
  float* p = scratch.probs.data();
  {
    at::Tensor out = at::from_blob(p, {vocab}, at::kFloat);
    at::exp_out(out, at::from_blob(const_cast<float*>(logp), {vocab}, at::kFloat));
  }
  const bool truncate = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0;
  if (!truncate) {
    // Inverse CDF in id order: whole blocks are skipped by their (vectorised) sums, the
    // block that holds the target is walked one id at a time.
    constexpr int64_t kBlock = 512;
    const double target = u * SumRange(p, vocab);
    double cum = 0.0;
    for (int64_t b = 0; b < vocab; b += kBlock) {
      const int64_t e = std::min(vocab, b + kBlock);
      const double block = SumRange(p + b, e - b);
      if (cum + block <= target) {
        cum += block;
        continue;
      }
      for (int64_t i = b; i < e; ++i) {
        cum += static_cast<double>(p[i]);
        if (cum > target) return static_cast<int32_t>(i);
      }
    }
    // Rounding left the target at the very end: the last id with any probability.
    for (int64_t i = vocab - 1; i > 0; --i)
      if (p[i] > 0.0f) return static_cast<int32_t>(i);
    return 0;
  }
  // Candidates in descending probability (ties: lower id first).
  std::vector<int32_t>& ids = scratch.ids;
  ids.resize(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [logp](int32_t a, int32_t b) {
    return logp[a] != logp[b] ? logp[a] > logp[b] : a < b;
  };
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), better);
  } else {
    std::sort(ids.begin(), ids.end(), better);
  }
  if (params.top_p < 1.0) {
    const double total = SumRange(p, vocab);
    double cum = 0.0;
    int64_t n = 0;
    while (n < keep) {
      cum += p[ids[static_cast<size_t>(n)]];
      ++n;
      if (cum >= params.top_p * total) break;
    }
    keep = n;
  }
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i) mass += p[ids[static_cast<size_t>(i)]];
  const double target = u * mass;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[ids[static_cast<size_t>(i)]];
    if (cum > target) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(keep - 1)];
}

}  // namespace troupe::engine
