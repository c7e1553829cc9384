// The seed of a randomised test: drawn once per test binary and printed, so a failure can be
// replayed with TROUPE_TEST_SEED=<seed>.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace troupe::test_support {

// `who` names the tests in the printed line (the first caller's name is printed).
inline uint64_t TestSeed(const char* who) {
  static const uint64_t seed = [who] {
    const char* env = std::getenv("TROUPE_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("%s: seed %llu (TROUPE_TEST_SEED replays)\n", who,
                static_cast<unsigned long long>(s));
    std::fflush(stdout);
    return s;
  }();
  return seed;
}

}  // namespace troupe::test_support
