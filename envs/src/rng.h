// Portable deterministic randomness for prompt generation (private).
//
// std::uniform_int_distribution differs between standard libraries, so prompt
// sets would differ between machines; these helpers are fully specified.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace troupe::envs::detail {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of a sequence of words (seed, split tag, index, attempt, ...).
inline uint64_t Mix(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t w : words) h = SplitMix64(h ^ SplitMix64(w));
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (inclusive); lo <= hi. Modulo bias is below 2^-40 for
  // the small ranges used here.
  int64_t Uniform(int64_t lo, int64_t hi) {
    uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(Next() % span);
  }
  double UniformReal() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace troupe::envs::detail
