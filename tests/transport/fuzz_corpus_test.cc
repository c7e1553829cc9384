// Replays the decoder fuzz corpus (tests/transport/corpus, grown by
// scripts/fuzz-transport.sh) through the decoder in every CI run: no input
// may crash it, and the seed messages must still decode.
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "fuzz_input.h"

namespace troupe::transport {
namespace {

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(FuzzCorpus, EveryInputIsHandledWithoutCrashing) {
  const std::filesystem::path dir = TROUPE_FUZZ_CORPUS_DIR;
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  size_t files = 0, decoded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string bytes = ReadFile(entry.path());
    decoded += fuzz::DecodeOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++files;
  }
  std::fprintf(stderr, "replayed %zu corpus inputs, %zu decoded\n", files, decoded);
  EXPECT_GE(files, 4u);
  EXPECT_GE(decoded, 1u);
}

TEST(FuzzCorpus, SeedsDecodeAndMatchTheCheckedInCopies) {
  const std::filesystem::path dir = TROUPE_FUZZ_CORPUS_DIR;
  for (const auto& [name, bytes] : fuzz::SeedInputs()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(fuzz::DecodeOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 1);
    // The checked-in seed decodes too (it may differ in timestamps/keys only).
    const auto path = dir / name;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    const std::string disk = ReadFile(path);
    EXPECT_EQ(fuzz::DecodeOne(reinterpret_cast<const uint8_t*>(disk.data()), disk.size()), 1);
  }
}

TEST(FuzzCorpus, TruncationsOfASeedNeverCrash) {
  auto seeds = fuzz::SeedInputs();
  for (const auto& [name, bytes] : seeds) {
    for (size_t n = 0; n < bytes.size(); n += 1 + n / 16) {
      fuzz::DecodeOne(reinterpret_cast<const uint8_t*>(bytes.data()), n);
    }
  }
}

}  // namespace
}  // namespace troupe::transport
