// The job config as users write it: every shipped config loads, a minimal one
// is valid with defaults, and bad values stop with an error naming the key and file.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "troupe/launcher/job_config.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;

std::string SourceDir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  return s ? s : ".";
}

std::string WriteConfig(const std::string& name, const std::string& text) {
  fs::path p = fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()) + ".yaml");
  std::ofstream(p) << text;
  return p.string();
}

TEST(JobConfig, EveryShippedConfigLoads) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(SourceDir() + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    auto c = LoadJobConfig(e.path().string(), {});
    EXPECT_TRUE(c.ok()) << e.path() << ": " << c.status().ToString();
    ++n;
  }
  EXPECT_GE(n, 1);
}

TEST(JobConfig, MinimalConfigIsValidWithDefaults) {
  // Defaults alone must describe a valid job (e.g. the model's vocabulary
  // follows the tokenizer unless set).
  auto c = LoadJobConfig(WriteConfig("minimal", "name: m\n"), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GE(c->model.vocab_size, 3 + static_cast<int64_t>(TokenizerAlphabet(c->tokenizer).size()));
  // The resolved config round-trips.
  std::string path = WriteConfig("resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ResolvedConfigYaml(*again), ResolvedConfigYaml(*c));
}

TEST(JobConfig, BadValuesNameTheKeyAndFile) {
  std::string path = WriteConfig("bad", "name: b\n");
  struct Case {
    std::string set, key;
  };
  for (const Case& k : std::vector<Case>{{"trainer.max_policy_lag=-1", "max_policy_lag"},
                                         {"model.vocab_size=5", "model.vocab_size"},
                                         {"learner.count=0", "learner.count"},
                                         {"trainer.lrr=1", "trainer.lrr"}}) {
    auto c = LoadJobConfig(path, {k.set});
    ASSERT_FALSE(c.ok()) << k.set;
    EXPECT_NE(c.status().message().find(k.key), std::string::npos)
        << k.set << ": " << c.status().message();
    EXPECT_NE(c.status().message().find("bad"), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace troupe::launcher
