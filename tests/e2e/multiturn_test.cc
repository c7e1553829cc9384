// End-to-end: multi-turn tool tasks and external reward services through the
// real actors (`troupe run` with real processes; bounded by update counts,
// never by wall time).
//
//   * configs/multiturn_file_reverse.yaml: rollout actors play file_reverse
//     episodes through EpisodeDriver; the learner trains on them with the
//     tool (environment) tokens masked out, evaluates held-out episodes, and
//     the accounting invariant holds;
//   * configs/external_reward.yaml: every sample is scored by a real
//     troupe-reward-server process the test starts (rewards arrive, the
//     per-service counters count them), and when the server is killed mid-run
//     samples get reward 0 with a reason while the job still completes.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "e2e_util.h"
#include "troupe/launcher/control_client.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using e2e::BuildDir;
using e2e::Eventually;
using e2e::ExpectAccountingHolds;
using e2e::Job;
using e2e::SourceDir;

fs::path TestDir(const std::string& name) {
  return e2e::TestDir("mt." + name);
}

using e2e::Short;

TEST(MultiTurnJob, TrainsOnEpisodesWithToolTokensMasked) {
  fs::path dir = TestDir("file_reverse");
  Job job("multiturn_file_reverse.yaml",
          Short(12, {"warm_start.steps=100", "eval.every_steps=6", "eval.prompts=16"}), dir);
  auto e = job.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();
  ExpectAccountingHolds(job);

  // Rollout actors played episodes (through EpisodeDriver) and shipped tool tokens.
  auto rollouts = job.Finals("rollout");
  ASSERT_FALSE(rollouts.empty()) << job.Output();
  double episodes = 0, model_tokens = 0, env_tokens = 0;
  for (auto& r : rollouts) {
    episodes += r.value("episodes.count", 0.0);
    model_tokens += r.value("gen_tokens", 0.0);
    env_tokens += r.value("gen_env_tokens", 0.0);
  }
  EXPECT_GT(episodes, 0) << rollouts[0].dump();
  EXPECT_GT(env_tokens, 0) << rollouts[0].dump();

  // The learner trained on them: the trained (mask 1) tokens never exceed the
  // model's own tokens, and the batches it received held environment tokens.
  auto trains = job.Metrics("train");
  ASSERT_FALSE(trains.empty()) << job.Output();
  double trained = 0;
  for (auto& t : trains) trained += t.value("tokens", 0.0);
  EXPECT_GT(trained, 0);
  EXPECT_LE(trained, model_tokens);
  const json& last = trains.back();
  EXPECT_GT(last.value("received_env_tokens", 0.0), 0) << last.dump();
  EXPECT_LT(last.value("received_env_tokens", 0.0), last.value("received_response_tokens", 0.0));

  // Held-out evaluation played episodes too.
  auto warm = job.Metrics("warm_start");
  ASSERT_EQ(warm.size(), 1u);
  auto evals = job.Metrics("eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_EQ(evals.back().value("eval_prompts", 0.0), 16.0);
}

// A troupe-reward-server on a free port; killed (by pid) when the test ends.
class RewardServer : public e2e::PortedServer {
 public:
  // `task`: the server's --task (KIND[:NAME[:SCORING]]).
  explicit RewardServer(const fs::path& dir, const std::string& task = "reverse")
      : PortedServer({BuildDir() + "/envs/troupe-reward-server", "--port", "0", "--task", task},
                     (dir / "reward-server.out").string()) {}
  std::string ServicesOverride() const {
    return "reward_services.services=[{name: verifier, url: \"http://127.0.0.1:" +
           std::to_string(port()) + "/verify\", timeout_ms: 1000, max_attempts: 2}]";
  }
};

TEST(ExternalRewardJob, ScoresThroughARealServer) {
  fs::path dir = TestDir("external");
  RewardServer server(dir);
  ASSERT_GT(server.port(), 0);
  Job job("external_reward.yaml", Short(15, {server.ServicesOverride(), "eval.every_steps=5"}),
          dir);
  auto e = job.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();
  ExpectAccountingHolds(job);
  auto rewards = job.Finals("reward");
  ASSERT_FALSE(rewards.empty()) << job.Output();
  const json& r = rewards[0];
  EXPECT_GT(r.value("reward_service.verifier.ok", 0.0), 0) << r.dump();
  EXPECT_EQ(r.value("reward_service.verifier.failed", 0.0), 0) << r.dump();
  EXPECT_GT(r.value("task.reverse.reward_mean", 0.0), 0) << r.dump();
  // The learner trained on the service's rewards and evaluated with it.
  auto trains = job.Metrics("train");
  ASSERT_FALSE(trains.empty());
  double reward_sum = 0;
  for (auto& t : trains) reward_sum += t.value("reward_mean", 0.0);
  EXPECT_GT(reward_sum, 0);
  auto warm = job.Metrics("warm_start");
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_GT(warm[0].value("eval_reward", 0.0), 0) << warm[0].dump();
}

TEST(ExternalRewardJob, ServerKilledMidRunGivesZeroRewardsWithAReasonAndTheJobCompletes) {
  fs::path dir = TestDir("external-kill");
  RewardServer server(dir);
  ASSERT_GT(server.port(), 0);
  Job job("external_reward.yaml", Short(30, {server.ServicesOverride(), "eval.every_steps=0"}),
          dir);
  // Kill the server once the learner trained a few updates on its rewards.
  ASSERT_TRUE(Eventually([&] { return job.Metrics("train").size() >= 3; }, 600000)) << job.Output();
  server.Kill();
  auto e = job.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();
  ExpectAccountingHolds(job);
  auto rewards = job.Finals("reward");
  ASSERT_FALSE(rewards.empty()) << job.Output();
  const json& r = rewards[0];
  EXPECT_GT(r.value("reward_service.verifier.ok", 0.0), 0) << r.dump();
  EXPECT_GT(r.value("reward_service.verifier.failed", 0.0), 0) << r.dump();
  EXPECT_GT(r.value("reward_service.verifier.unreachable", 0.0) +
                r.value("reward_service.verifier.connection", 0.0),
            0)
      << r.dump();
  // The reason is logged by the reward actor.
  auto run = ResolveRunDir(job.runs(), "");
  ASSERT_TRUE(run.ok());
  bool reason = false;
  for (auto& f : fs::directory_iterator(fs::path(run->path) / "logs")) {
    if (f.path().filename().string().rfind("reward", 0) != 0) continue;
    auto t = ReadFile(f.path().string());
    if (t.ok() && t->find("verifier") != std::string::npos &&
        (t->find("unreachable") != std::string::npos || t->find("connection") != std::string::npos))
      reason = true;
  }
  EXPECT_TRUE(reason) << "no failure reason naming the service in the reward actor's log";
}

// A hung reward service (SIGSTOP: connections open, nothing answers) with
// on_failure: drop, in a job that mixes a locally verified task with one the
// service scores. The circuit breaker cuts the service off after a few
// failures, so samples of the remote task fail at once and are left out of
// training (dropped_unscored) while the local task keeps the updates coming;
// when the service answers again (SIGCONT) a probe closes the breaker.
TEST(ExternalRewardJob, AHungServiceIsCutOffAndDroppedSamplesKeepTrainingGoing) {
  fs::path dir = TestDir("external-hung");
  RewardServer server(dir, "reverse:remote");
  ASSERT_GT(server.port(), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/verify";
  // The default job with its one task replaced by a local and a remote one.
  auto base = ReadFile(SourceDir() + "/configs/tiny_reverse.yaml");
  ASSERT_TRUE(base.ok());
  std::string yaml = std::regex_replace(*base, std::regex("\ntask:\n(  .*\n)+"),
                                        "\ntasks:\n  - {name: local, kind: reverse}\n"
                                        "  - {name: remote, kind: reverse, scoring: external, "
                                        "service: verifier}\n");
  ASSERT_NE(yaml, *base);
  const std::string config = (dir / "mixed.yaml").string();
  std::ofstream(config) << yaml;
  Job job(config,
          Short(120, {"reward_services.services=[{name: verifier, url: \"" + url +
                          "\", timeout_ms: 1000, max_attempts: 2, breaker_failures: 4, "
                          "breaker_cooldown_ms: 2000, on_failure: drop}]",
                      "reward_services.call_timeout_ms=3000", "eval.every_steps=0"}),
          dir);
  auto step = [&] {
    double s = -1;
    job.WaitStatus(
        [&](const ControlResult& st) {
          auto it = st.progress.find("step");
          s = it == st.progress.end() ? -1 : it->second;
          return true;
        },
        10000);
    return s;
  };
  auto wait_step = [&](double target) {
    return job.WaitStatus(
        [&](const ControlResult& st) {
          auto it = st.progress.find("step");
          return it != st.progress.end() && it->second >= target;
        },
        300000);
  };
  ASSERT_TRUE(wait_step(5)) << job.Output();
  // The same number of updates with the service up, for the log's comparison
  // (wall clock: printed, never asserted).
  const double before0 = step();
  auto tb = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_step(before0 + 30)) << job.Output();
  const double normal_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tb).count();
  const double s0 = step();
  auto t0 = std::chrono::steady_clock::now();
  server.Signal(SIGSTOP);
  // Nothing stalls: training goes on through the outage.
  const bool went_on = wait_step(s0 + 30);
  const double outage_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  server.Signal(SIGCONT);
  ASSERT_TRUE(went_on) << "training stalled while the reward service hung\n" << job.Output();
  std::printf("30 updates: %.1f s with the service up, %.1f s while it hung (%.2fx)\n", normal_s,
              outage_s, outage_s / std::max(normal_s, 1e-3));
  auto e = job.Wait(600000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();
  ExpectAccountingHolds(job);
  auto js = job.Metrics("job_summary");
  ASSERT_EQ(js.size(), 1u);
  EXPECT_GT(js[0]["accounting"].value("dropped_unscored", 0.0), 0) << js[0].dump();
  auto rewards = job.Finals("reward");
  ASSERT_FALSE(rewards.empty()) << job.Output();
  const json& r = rewards.back();
  EXPECT_GE(r.value("reward_service.verifier.breaker_opened", 0.0), 1) << r.dump();
  // The breaker, not per-sample timeouts, carried the outage.
  EXPECT_GT(r.value("reward_service.verifier.short_circuited", 0.0),
            r.value("reward_service.verifier.timeouts", 0.0))
      << r.dump();
  // The service scored samples before the outage and again after it.
  EXPECT_GT(r.value("reward_service.verifier.ok", 0.0), 0) << r.dump();
  EXPECT_EQ(r.value("reward_service.verifier.http_status", 0.0), 0) << r.dump();
}

}  // namespace
}  // namespace troupe::launcher
