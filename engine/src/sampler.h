// Per-sequence sampling from one row of log-probs (private to engine/).
//
// The engine computes ScaledLogSoftmax (logprob.h) for all rows of a step at once,
// then draws each row's token here with that sequence's own random stream, so a
// request's tokens depend only on its seed, its prompt and the weights — not on
// what else shares the batch. Not thread-safe per Rng; SampleRow is reentrant.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/engine/engine_config.h"

namespace troupe::engine {

// SplitMix64 stream: tiny state, good statistical quality for sampling.
class Rng {
 public:
  Rng() = default;
  // Stream `stream` of seed `seed` (sample j of a request uses stream j).
  Rng(uint64_t seed, uint64_t stream);
  uint64_t Next();
  // Uniform double in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_ = 0;
};

// Draws a token from `logp` (float32 log-probs over `vocab` entries, already temperature
// scaled): argmax when params.temperature == 0; otherwise inverse-CDF sampling over the
// distribution restricted by top_k / top_p (ties broken by lower id). `scratch` is reused
// across calls to avoid allocations.
int32_t SampleRow(const float* logp, int64_t vocab, const SamplingParams& params, Rng& rng,
                  std::vector<int32_t>& scratch);

}  // namespace troupe::engine
