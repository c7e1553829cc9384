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

// A config file under the test temp dir, removed when the test ends.
class ConfigFile {
 public:
  ConfigFile(const std::string& name, const std::string& text)
      : path_((fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()) + ".yaml"))
                  .string()) {
    std::ofstream(path_) << text;
  }
  ~ConfigFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  ConfigFile(const ConfigFile&) = delete;
  ConfigFile& operator=(const ConfigFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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
  ConfigFile minimal("minimal", "name: m\n");
  auto c = LoadJobConfig(minimal.path(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GE(c->model.vocab_size, 3 + static_cast<int64_t>(TokenizerAlphabet(c->tokenizer).size()));
  // The resolved config round-trips.
  ConfigFile resolved("resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ResolvedConfigYaml(*again), ResolvedConfigYaml(*c));
}

TEST(JobConfig, BadValuesNameTheKeyAndFile) {
  ConfigFile bad("bad", "name: b\n");
  const std::string& path = bad.path();
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

// Across nodes with CURVE on, the weight backends CURVE cannot cover (gloo's and NCCL's own
// connections) are refused unless the user consents with a key that names what it gives up.
TEST(JobConfig, UnauthenticatedWeightBackendsAcrossNodesNeedConsent) {
  ConfigFile remote("remote", "name: r\ncluster:\n  backend: ssh\n  hosts:\n    - name: h1\n");
  auto gloo = LoadJobConfig(remote.path(), {"broadcast.backend=gloo"});
  ASSERT_FALSE(gloo.ok());
  EXPECT_NE(gloo.status().message().find("broadcast.backend"), std::string::npos);
  EXPECT_NE(gloo.status().message().find("broadcast.allow_unauthenticated_gloo"), std::string::npos)
      << gloo.status().message();
  auto nccl = LoadJobConfig(remote.path(), {"broadcast.backend=nccl"});
  ASSERT_FALSE(nccl.ok());
  // (a build without NCCL refuses it for that reason first)
  EXPECT_NE(nccl.status().message().find("nccl"), std::string::npos) << nccl.status().message();
  EXPECT_TRUE(LoadJobConfig(remote.path(),
                            {"broadcast.backend=gloo", "broadcast.allow_unauthenticated_gloo=true"})
                  .ok());
  EXPECT_TRUE(LoadJobConfig(remote.path(), {"broadcast.backend=zmq"}).ok());
  // Without CURVE there is nothing to be consistent with; on one host gloo binds loopback.
  EXPECT_TRUE(LoadJobConfig(remote.path(), {"broadcast.backend=gloo", "cluster.curve=off"}).ok());
  ConfigFile local("local", "name: l\ncluster:\n  curve: on\nbroadcast:\n  backend: gloo\n");
  EXPECT_TRUE(LoadJobConfig(local.path(), {}).ok());
}

}  // namespace
}  // namespace troupe::launcher
