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

// Buffers SampleRow reuses across calls (one per engine loop; not shared between threads).
struct SampleScratch {
  std::vector<float> probs;   // exp(logp) of the row being sampled
  std::vector<int32_t> ids;   // candidates in descending probability (top-k / top-p)
};

// Draws a token from `logp` (float32 log-probs over `vocab` entries, already temperature
// scaled): argmax when params.temperature == 0; otherwise inverse-CDF sampling over the
// distribution restricted by top_k / top_p (ties broken by lower id). The probabilities
// are exp(logp) in float32, computed with ATen's vectorised exp (one pass; a 151,936-entry
// Qwen row costs ~0.1 ms, not the ~3 ms of two scalar double exp passes), and summed in
// double.
int32_t SampleRow(const float* logp, int64_t vocab, const SamplingParams& params, Rng& rng,
                  SampleScratch& scratch);

}  // namespace troupe::engine
