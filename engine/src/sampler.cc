#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace troupe::engine {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream)
    : state_(Mix64(seed + 0x9E3779B97F4A7C15ull) ^ Mix64((stream + 1) * 0xD1B54A32D192ED03ull)) {}

uint64_t Rng::Next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return Mix64(state_);
}

int32_t SampleRow(const float* logp, int64_t vocab, const SamplingParams& params, Rng& rng,
                  std::vector<int32_t>& scratch) {
  if (params.temperature <= 0.0) {
    return static_cast<int32_t>(std::max_element(logp, logp + vocab) - logp);
  }
  const double u = rng.Uniform();
  const bool truncate = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0;
  if (!truncate) {
    // Inverse CDF in id order; the total is summed (not assumed 1) so rounding never
    // pushes the target past the end.
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logp[i]));
    const double target = u * total;
    double cum = 0.0;
    int64_t last_positive = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double p = std::exp(static_cast<double>(logp[i]));
      if (p > 0.0) last_positive = i;
      cum += p;
      if (cum > target) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last_positive);
  }
  // Candidates in descending probability (ties: lower id first).
  scratch.resize(static_cast<size_t>(vocab));
  std::iota(scratch.begin(), scratch.end(), 0);
  auto better = [logp](int32_t a, int32_t b) {
    return logp[a] != logp[b] ? logp[a] > logp[b] : a < b;
  };
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    std::partial_sort(scratch.begin(), scratch.begin() + keep, scratch.end(), better);
  } else {
    std::sort(scratch.begin(), scratch.end(), better);
  }
  if (params.top_p < 1.0) {
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logp[i]));
    double cum = 0.0;
    int64_t n = 0;
    while (n < keep) {
      cum += std::exp(static_cast<double>(logp[scratch[static_cast<size_t>(n)]]));
      ++n;
      if (cum >= params.top_p * total) break;
    }
    keep = n;
  }
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i)
    mass += std::exp(static_cast<double>(logp[scratch[static_cast<size_t>(i)]]));
  const double target = u * mass;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += std::exp(static_cast<double>(logp[scratch[static_cast<size_t>(i)]]));
    if (cum > target) return scratch[static_cast<size_t>(i)];
  }
  return scratch[static_cast<size_t>(keep - 1)];
}

}  // namespace troupe::engine
