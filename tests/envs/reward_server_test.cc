// troupe-reward-server: the task verifiers served over HTTP give the same
// rewards as local scoring, explain failures, and stop cleanly on SIGTERM.
#include <signal.h>

#include <gtest/gtest.h>

#include "server_process.h"
#include "troupe/envs/reward_client.h"
#include "troupe/envs/scorer.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {
namespace {

class RewardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<testing::ServerProcess>(std::vector<std::string>{
        TROUPE_REWARD_SERVER, "--port", "0", "--task", "reverse", "--task", "add::partial",
        "--task", "word_problem:wp", "--default-task", "reverse"});
    ASSERT_TRUE(server_->ok()) << "troupe-reward-server did not start";
    RewardClientConfig c;
    RewardServiceConfig s;
    s.name = "troupe";
    s.url = server_->Url("/verify");
    s.backoff_ms = 5;
    c.services = {s};
    c.default_service = "troupe";
    auto client = RewardClient::Create(c);
    ASSERT_TRUE(client.ok());
    client_ = std::move(client).value();
  }
  std::unique_ptr<testing::ServerProcess> server_;
  std::unique_ptr<RewardClient> client_;
};

TEST_F(RewardServerTest, RemoteRewardsEqualLocalOnes) {
  TaskConfig add;
  add.name = "add";
  add.scoring = "partial";
  TaskConfig wp;
  wp.name = "wp";
  wp.kind = "word_problem";
  auto reg = TaskRegistry::Create({TaskConfig{}, add, wp});
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  std::vector<RewardRequest> remote;
  std::vector<double> local;
  for (const char* name : {"reverse", "add", "wp"}) {
    const Task* t = (*reg)->Find(name);
    for (uint64_t i = 0; i < 30; ++i) {
      Prompt p = t->GetPrompt(Split::kTrain, i);
      // Right, wrong and partly right answers.
      std::string response =
          i % 3 == 0 ? p.reference : (i % 3 == 1 ? "x" + p.reference : p.reference.substr(1));
      remote.push_back({"", name, p.messages.back().content, response, p.reference, p.metadata});
      local.push_back(t->Verify({"", response, p.reference, p.metadata}).reward);
    }
  }
  auto results = client_->VerifyBatch(remote, Deadline::InMs(60000));
  ASSERT_EQ(results.size(), local.size());
  int partial = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].failure;
    EXPECT_DOUBLE_EQ(results[i].reward, local[i]) << remote[i].task << " " << remote[i].response;
    partial += results[i].reward > 0 && results[i].reward < 1;
  }
  EXPECT_GT(partial, 0) << "add is scored with partial credit";
}

TEST_F(RewardServerTest, FailuresCarryTheServersReason) {
  VerifyResult r = client_->Verify({"", "sort", "", "x", "y", ""});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.failure.find("HTTP status 422: unknown task 'sort'"), std::string::npos) << r.failure;
  EXPECT_EQ(client_->Stats()[0].attempts, 1u) << "4xx is not retried";
  VerifyResult d = client_->Verify({"", "", "", "cba", "cba", ""});
  EXPECT_EQ(d.reward, 1.0) << "empty task: --default-task";
  EXPECT_EQ(server_->Get("/health"), "{\"ok\": true}");
}

TEST_F(RewardServerTest, StopsCleanlyOnSigterm) {
  EXPECT_EQ(server_->Stop(SIGTERM, 20000), 0);
}

TEST(RewardServerArgs, BadArgumentsFailFast) {
  testing::ServerProcess bad({TROUPE_REWARD_SERVER, "--task", "palindrome"});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.Stop(SIGKILL, 20000), 2) << "usage error exit status";
}

}  // namespace
}  // namespace troupe::envs
