// The scratch workspace: confinement, quotas, tools, cleanup.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "troupe/envs/workspace.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class WorkspaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe-ws-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    config_.root = root_ + "/episodes";
    fs::create_directory(config_.root);
    // A file outside the workspace that must never be read or changed.
    outside_ = root_ + "/secret.txt";
    std::ofstream(outside_) << "top secret";
    auto ws = Workspace::Create(config_);
    ASSERT_TRUE(ws.ok()) << ws.status().ToString();
    ws_ = std::move(ws).value();
  }
  void TearDown() override {
    ws_.reset();
    std::ifstream in(outside_);
    std::string content((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(content, "top secret") << "a file outside the workspace changed";
    fs::remove_all(root_);
  }
  std::string root_, outside_;
  WorkspaceConfig config_;
  std::unique_ptr<Workspace> ws_;
};

TEST_F(WorkspaceTest, WriteReadEditList) {
  ASSERT_TRUE(ws_->WriteFile("a.txt", "hello world").ok());
  ASSERT_TRUE(ws_->WriteFile("dir/sub/b.txt", "x").ok()) << "parents are created";
  EXPECT_EQ(*ws_->ReadFile("a.txt"), "hello world");
  EXPECT_EQ(*ws_->ReadFile("./dir//sub/b.txt"), "x");
  ASSERT_TRUE(ws_->EditFile("a.txt", "world", "there").ok());
  EXPECT_EQ(*ws_->ReadFile("a.txt"), "hello there");
  ASSERT_TRUE(ws_->WriteFile("a.txt", "aa aa").ok());
  Status twice = ws_->EditFile("a.txt", "aa", "b");
  EXPECT_NE(twice.message().find("occurs 2 times"), std::string::npos) << twice.message();
  EXPECT_EQ(ws_->EditFile("a.txt", "zz", "b").code(), Code::kNotFound);
  EXPECT_FALSE(ws_->EditFile("a.txt", "", "b").ok());
  auto entries = ws_->List(".");
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].name, "a.txt");
  EXPECT_EQ((*entries)[0].bytes, 5);
  EXPECT_EQ((*entries)[1].type, Workspace::Entry::Type::kDir);
  EXPECT_EQ(ws_->ReadFile("missing.txt").status().code(), Code::kNotFound);
  EXPECT_NE(ws_->ReadFile("dir").status().message().find("directory"), std::string::npos);
}

TEST_F(WorkspaceTest, PathsCannotLeaveTheWorkspace) {
  for (std::string bad :
       std::vector<std::string>{"../secret.txt", "../../etc/passwd", "a/../../secret.txt",
                                "/etc/passwd", std::string("a\0b", 3), "a\nb", "", ".",
                                std::string(300, 'a'), "a/b/c/d/e/f/g/h/i/j.txt"}) {
    EXPECT_FALSE(ws_->ReadFile(bad).ok()) << bad;
    EXPECT_FALSE(ws_->WriteFile(bad, "pwned").ok()) << bad;
  }
  EXPECT_NE(ws_->ReadFile("../../etc/passwd").status().message().find("leaves the workspace"),
            std::string::npos);
  EXPECT_NE(ws_->ReadFile(std::string("a\0b", 3)).status().message().find("NUL"),
            std::string::npos);
  std::string msg = ws_->ReadFile("/etc/passwd").status().message();
  EXPECT_EQ(msg.find(ws_->path()), std::string::npos) << "never reveals the host path";
  EXPECT_FALSE(ws_->List("..").ok());
}

TEST_F(WorkspaceTest, SymlinksAreNeverFollowed) {
  // Planted links (a task or a previous tool could not make them; we do it by hand).
  ASSERT_EQ(symlink(outside_.c_str(), (ws_->path() + "/link.txt").c_str()), 0);
  ASSERT_EQ(symlink(root_.c_str(), (ws_->path() + "/linkdir").c_str()), 0);
  EXPECT_NE(ws_->ReadFile("link.txt").status().message().find("symbolic link"), std::string::npos);
  EXPECT_FALSE(ws_->WriteFile("link.txt", "pwned").ok());
  EXPECT_FALSE(ws_->ReadFile("linkdir/secret.txt").ok());
  EXPECT_FALSE(ws_->WriteFile("linkdir/secret.txt", "pwned").ok());
  EXPECT_FALSE(ws_->WriteFile("linkdir/new.txt", "x").ok());
  EXPECT_FALSE(ws_->List("linkdir").ok());
  EXPECT_FALSE(fs::exists(root_ + "/new.txt"));
  auto entries = ws_->List("");
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].type, Workspace::Entry::Type::kLink);
}

TEST_F(WorkspaceTest, SpecialFilesAreRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo((ws_->path() + "/fifo").c_str(), 0600), 0);
  EXPECT_NE(ws_->ReadFile("fifo").status().message().find("not a regular file"), std::string::npos);
  EXPECT_FALSE(ws_->WriteFile("fifo", "x").ok());
}

TEST_F(WorkspaceTest, QuotasAreEnforced) {
  config_.max_file_bytes = 100;
  config_.max_total_bytes = 250;
  config_.max_files = 4;
  auto ws = Workspace::Create(config_);
  ASSERT_TRUE(ws.ok());
  Workspace& w = **ws;
  EXPECT_EQ(w.WriteFile("big", std::string(101, 'x')).code(), Code::kResourceExhausted);
  ASSERT_TRUE(w.WriteFile("a", std::string(100, 'x')).ok());
  ASSERT_TRUE(w.WriteFile("b", std::string(100, 'x')).ok());
  Status total = w.WriteFile("c", std::string(100, 'x'));
  EXPECT_EQ(total.code(), Code::kResourceExhausted);
  EXPECT_NE(total.message().find("limit of 250"), std::string::npos) << total.message();
  ASSERT_TRUE(w.WriteFile("a", std::string(50, 'y')).ok()) << "replacing counts the old size";
  ASSERT_TRUE(w.WriteFile("c", "1").ok());
  Status files = w.WriteFile("d/e", "1");
  EXPECT_NE(files.message().find("limit of 4"), std::string::npos) << files.message();
  ASSERT_TRUE(w.WriteFile("d", "1").ok());
  EXPECT_EQ(w.ComputeUsage().files, 4);
  EXPECT_EQ(w.ComputeUsage().bytes, 152);
  // A file grown behind the workspace's back is still read safely.
  std::ofstream(w.path() + "/a") << std::string(5000, 'z');
  EXPECT_EQ(w.ReadFile("a").status().code(), Code::kResourceExhausted);
}

TEST_F(WorkspaceTest, DestructorRemovesEverything) {
  std::string path = ws_->path();
  ASSERT_TRUE(ws_->WriteFile("x/y/z.txt", "1").ok());
  ASSERT_EQ(symlink(outside_.c_str(), (path + "/x/link").c_str()), 0);
  ws_.reset();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::exists(outside_)) << "links are removed, not followed";
}

TEST_F(WorkspaceTest, ToolEnvironment) {
  std::optional<std::string> seen_answer;
  bool seen_submitted = false;
  auto env = NewWorkspaceEnvironment(
      config_, {{"w.txt", "abc"}},
      [&](const Workspace& ws, const std::optional<std::string>& answer, bool submitted) {
        seen_answer = answer;
        seen_submitted = submitted;
        VerifyResult r;
        r.reward = ws.ReadFile("out.txt").ok() ? 1.0 : 0.0;
        return r;
      });
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  Environment& e = **env;
  EXPECT_EQ(e.tools().size(), 5u);
  EXPECT_EQ(e.Call("read", {{"path", "w.txt"}}).output, "abc");
  EXPECT_EQ(e.Call("read", {{"path", "w.txt"}, {"offset", 1}, {"limit", 1}}).output, "b");
  ToolResult bad = e.Call("read", {{"path", "w.txt"}, {"offset", 99}});
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.output.find("past the end"), std::string::npos);
  EXPECT_FALSE(e.Call("read", {{"path", 5}}).ok);
  EXPECT_FALSE(e.Call("read", {{"file", "w.txt"}}).ok);
  EXPECT_TRUE(e.Call("write", {{"path", "out.txt"}, {"content", "cba"}}).ok);
  EXPECT_TRUE(e.Call("edit", {{"path", "out.txt"}, {"old", "b"}, {"new", "B"}}).ok);
  EXPECT_EQ(e.Call("read", {{"path", "out.txt"}}).output, "cBa");
  EXPECT_EQ(e.Call("list", json::object()).output, "out.txt 3\nw.txt 3");
  ToolResult sub = e.Call("submit", {{"answer", "cba"}});
  EXPECT_TRUE(sub.submitted);
  VerifyResult score = e.Score();
  EXPECT_EQ(score.reward, 1.0);
  EXPECT_EQ(seen_answer, std::optional<std::string>("cba"));
  EXPECT_TRUE(seen_submitted);
}

}  // namespace
}  // namespace troupe::envs
