// The `troupe` CLI on bad input: every bad invocation and every bad file is
// one line on stderr naming the problem, exit code 2 — never an uncaught
// exception (exit 134), a stack of lines, or a job started by mistake.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;

std::string Troupe() {
  const char* b = std::getenv("TROUPE_BUILD_DIR");
  return std::string(b ? b : "build") + "/launcher/troupe";
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("cli." + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "runs");
    fs::create_directories(dir_ / "a folder");
    Write("empty.yaml", "");
    Write("comments.yaml", "# nothing\n# but comments\n");
    std::string binary(3000, '\0');
    for (size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<char>((i * 7919) % 256);
    Write("binary.yaml", binary);
    Write("list.yaml", "- a\n- b\n");
    Write("scalar.yaml", "just a string\n");
    Write("syntax.yaml", "name: x\n  bad: [\n");
    Write("huge.yaml", "name: x\n" + std::string(5 << 20, '#') + "\n");
    Write("ok.yaml", "name: ok\n");
    ASSERT_EQ(::mkfifo((dir_ / "fifo.yaml").c_str(), 0600), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  struct Outcome {
    ExitInfo exit;
    std::string output;
  };
  Outcome Run(std::vector<std::string> args) const {
    SpawnOptions o;
    o.argv = {Troupe(), "--runs-dir", (dir_ / "runs").string()};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.output_file = (dir_ / "out.txt").string();
    fs::remove(o.output_file);
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    Outcome out;
    if (!p.ok()) return out;
    auto e = p->Wait(Deadline::InMs(30000));
    EXPECT_TRUE(e.ok()) << "troupe did not return";
    if (e.ok()) out.exit = *e;
    auto text = ReadFile(o.output_file);
    if (text.ok()) out.output = *text;
    return out;
  }
  fs::path dir_;
};

struct Case {
  std::vector<std::string> args;  // "@name" is replaced by the path of test file `name`
  std::string expect;             // a part of the one error line
};

TEST_F(CliTest, BadInvocationsAndBadFilesAreOneLineErrorsWithExitTwo) {
  const std::string long_name(300, 'n');
  const std::vector<Case> cases = {
      {{}, "subcommand is required"},
      {{"run"}, "needs a CONFIG"},
      {{"run", "@a folder"}, "is a folder"},
      {{"run", "@empty.yaml"}, "is empty"},
      {{"run", "@comments.yaml"}, "is empty"},
      {{"run", "@binary.yaml"}, "binary"},
      {{"run", "@list.yaml"}, "not a YAML mapping"},
      {{"run", "@scalar.yaml"}, "not a YAML mapping"},
      {{"run", "@syntax.yaml"}, "line 2"},
      {{"run", "@huge.yaml"}, "at most"},
      {{"run", "@fifo.yaml"}, "not a regular file"},
      {{"run", "@missing.yaml"}, "does not exist"},
      {{"run", "@no such dir/x y\xc3\xbc.yaml"}, "does not exist"},
      {{"run", "@ok.yaml", "--set", "name=" + long_name}, "1-100 characters"},
      {{"run", "@ok.yaml", "--set", "name=a/b"}, "key 'name'"},
      {{"run", "@ok.yaml", "--set", "name=a b"}, "key 'name'"},
      {{"run", "@ok.yaml", "--set", "name=../up"}, "key 'name'"},
      {{"run", "@ok.yaml", "--set", "name=\xff\xfe"}, "key 'name'"},
      {{"run", "@ok.yaml", "--set", "nosuch.key=1"}, "unknown key"},
      {{"run", "@ok.yaml", "--set", "trainer.lr=abc"}, "trainer.lr"},
      {{"run", "@ok.yaml", "--set", "novalue"}, "--set"},
      {{"run", "@ok.yaml", "--set"}, "--set"},
      {{"run", "--resume", "nosuch"}, "unknown run"},
      {{"run", "--resume", long_name}, "unknown run"},
      {{"status", "nosuch"}, "unknown run"},
      {{"status", long_name}, "unknown run"},
      {{"status", "a", "b"}, "at most"},
      {{"logs"}, "needs an ACTOR"},
      {{"logs", "nosuch", "learner-0"}, "unknown run"},
      {{"scale", "rollout=abc"}, "COUNT"},
      {{"scale", "learner=2"}, "only rollout and reward"},
      {{"scale"}, "ROLE=COUNT"},
      {{"stop", "nosuch"}, "unknown run"},
      {{"run", "@ok.yaml", "--bogus-flag"}, "bogus-flag"},
      {{"export"}, "--to is required"},
      {{"export", "nosuch", "--to", "@out"}, "unknown run"},
      {{"export", "--to", "@out", "--max-shard-size", "5XB"}, "unknown unit"},
      {{"export", "--to", "@out", "--max-shard-size", "0"}, "must be > 0"},
      {{"export", "--to", "@out", "--checkpoint", "abc"}, "--checkpoint"},
      {{"run", "@ok.yaml", "--dashboard-bind", "host:99999"}, "0-65535"},
      {{"run", "@ok.yaml", "--dashboard-bind", "[::1"}, "--dashboard-bind"},
      {{"run", "@ok.yaml", "--set", "dashboard.sample_ms=5"}, "dashboard.sample_ms"},
      {{"run", "@ok.yaml", "--set", "rollout_samples.per_update=100000"}, "rollout_samples.per_update"},
      {{"dashboard", "nosuch"}, "unknown run"},
      {{"dashboard", "a", "b"}, "at most"},
      {{"dashboard", "@a folder"}, "not a run folder"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args;
    std::string shown;
    for (const auto& a : c.args) {
      args.push_back(a.rfind('@', 0) == 0 ? P(a.substr(1)) : a);
      shown += " " + a.substr(0, 40);
    }
    Outcome o = Run(args);
    SCOPED_TRACE("troupe" + shown);
    EXPECT_TRUE(o.exit.exited) << o.exit.ToString() << "\n" << o.output;
    EXPECT_EQ(o.exit.code, 2) << o.output;
    ASSERT_FALSE(o.output.empty());
    EXPECT_EQ(o.output.rfind("troupe: ", 0), 0u) << o.output;
    EXPECT_EQ(o.output.find('\n'), o.output.size() - 1) << "not one line:\n" << o.output;
    EXPECT_NE(o.output.find(c.expect), std::string::npos) << o.output;
  }
  // No bad input started a job.
  EXPECT_TRUE(fs::is_empty(dir_ / "runs"));
}

}  // namespace
}  // namespace troupe::launcher
