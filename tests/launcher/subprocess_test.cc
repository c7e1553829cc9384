#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {
namespace {

TEST(Subprocess, RunsAndReportsExitCode) {
  auto p = Subprocess::Spawn({{"sh", "-c", "exit 7"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto e = p->Wait(Deadline::InMs(10000));
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->exited);
  EXPECT_EQ(e->code, 7);
}

TEST(Subprocess, MissingProgramIsAClearError) {
  auto p = Subprocess::Spawn({{"/nonexistent/troupe-actor"}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/nonexistent/troupe-actor"), std::string::npos);
}

TEST(Subprocess, StopKillsTheWholeGroup) {
  std::string pidfile = ::testing::TempDir() + "grandchild." + std::to_string(::getpid());
  // The child starts a grandchild that ignores SIGTERM; Stop() must still end both.
  auto p = Subprocess::Spawn(
      {{"sh", "-c", "(trap '' TERM; exec sleep 300) & echo $! > " + pidfile + "; wait"},
       {},
       "",
       "",
       "",
       500});
  ASSERT_TRUE(p.ok());
  pid_t gc = 0;
  for (int i = 0; i < 2000 && gc == 0; ++i) {
    std::ifstream in(pidfile);
    in >> gc;
    if (gc == 0) usleep(5000);
  }
  ASSERT_GT(gc, 0);
  EXPECT_EQ(::kill(gc, 0), 0);
  p->Stop();
  // The grandchild is reaped by init; poll until it is gone (bounded).
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; ++i) {
    gone = ::kill(gc, 0) != 0;
    if (!gone) usleep(5000);
  }
  EXPECT_TRUE(gone);
  std::filesystem::remove(pidfile);
}

TEST(Subprocess, StdinCarriesSecretsAndOutputGoesToFile) {
  std::string out = ::testing::TempDir() + "out." + std::to_string(::getpid());
  auto p = Subprocess::Spawn({{"sh", "-c", "read x; echo got:$x"}, {}, out, "", "s3cret\n"});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->Wait(Deadline::InMs(10000)).ok());
  auto text = ReadFile(out);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "got:s3cret\n");
  std::filesystem::remove(out);
}

TEST(RunDir, CreatesLayoutAndLatest) {
  std::string root = ::testing::TempDir() + "runs." + std::to_string(::getpid());
  auto a = CreateRunDir(root, "job");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = CreateRunDir(root, "job");
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->path, b->path);
  EXPECT_TRUE(std::filesystem::is_directory(a->logs()));
  auto latest = ResolveRunDir(root, "");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->path, b->path);
  auto by_name = ResolveRunDir(root, a->name());
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ(by_name->path, a->path);
  auto missing = ResolveRunDir(root, "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("unknown run 'nope'"), std::string::npos);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace troupe::launcher
