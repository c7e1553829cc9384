// The dashboard, TensorBoard files and rollouts.jsonl of a real job.
//
//   troupe run (default job, until stopped) ──▶ headless Chromium (Debian, driven by
//   playwright-core: tests/reference/npm/dashboard_browser.mjs) loads the live page:
//   the actors table lists every actor ready and the sampled-reward curve gains
//   points while the job runs (screenshot kept);
//   troupe stop ──▶ RUN/tb/ read back by an independent reader (tests/launcher/tb_reader.py:
//   Python protobuf + crcmod) and checked against metrics.jsonl: names, steps, values;
//   rollouts.jsonl holds each update's sample within its quota and the lag window;
//   troupe dashboard RUN ──▶ the finished run's page from the folder alone (state,
//   actors, curves, rollout viewer with a filter, a log) in Chromium.
// Screenshots: $TROUPE_BUILD_DIR/test-artifacts/dashboard/*.png.
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/node_runner.h"
#include "e2e_util.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json RunJson(const std::vector<std::string>& argv, int timeout_s, bool expect_ok = true) {
  auto r = troupe::testing::RunProcess(argv, "", timeout_s);
  EXPECT_EQ(r.ok, expect_ok) << argv[1] << ": " << r.error << "\nstdout: " << r.out << "\nstderr: " << r.err;
  auto j = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  return j.is_discarded() ? json{{"raw", r.out}} : j;
}

std::string Browser() {
  return troupe::testing::SourceDir() + "/tests/reference/npm/dashboard_browser.mjs";
}

// The first "troupe: dashboard URL" line a process printed.
std::string DashboardUrl(const std::string& output) {
  const std::string key = "troupe: dashboard http";
  auto at = output.find(key);
  if (at == std::string::npos) return "";
  auto end = output.find_first_of(" \n", at + key.size() - 4);
  return output.substr(at + key.size() - 4, end - (at + key.size() - 4));
}

// TensorBoard records of the run, by tag -> step -> record.
std::map<std::string, std::map<int64_t, json>> ReadTb(const std::string& dir) {
  std::map<std::string, std::map<int64_t, json>> out;
  auto r = troupe::testing::RunProcess(
      {"/usr/bin/python3", troupe::testing::SourceDir() + "/tests/launcher/tb_reader.py", dir}, "", 120);
  EXPECT_TRUE(r.ok) << r.error << r.err;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("tag")) out[j["tag"]][j["step"].get<int64_t>()] = j;
  }
  return out;
}

void ExpectFloat32(double tb, double jsonl, const std::string& what) {
  EXPECT_NEAR(tb, jsonl, 1e-6 * std::max(1.0, std::fabs(jsonl))) << what;
}

TEST(Dashboard, LiveJobInChromiumThenTensorBoardReadBackThenTheFinishedRunFromItsFolder) {
  ASSERT_EQ(troupe::testing::NodeReferenceMissing(), "") << "the browser test needs node and playwright-core";
  ASSERT_EQ(::access("/usr/bin/chromium", X_OK), 0) << "Debian's chromium is not installed (scripts/install-deps.sh)";
  const fs::path artifacts = fs::path(e2e::BuildDir()) / "test-artifacts" / "dashboard";
  fs::create_directories(artifacts);
  // Runs until stopped: the live checks never race the job's end.
  e2e::Job job("tiny_reverse.yaml",
               e2e::Short(1000000, {"eval.every_steps=10", "dashboard.sample_ms=500",
                                    "rollout_samples.per_update=3"}),
               e2e::TestDir("dashboard"));
  std::string url;
  ASSERT_TRUE(e2e::Eventually([&] { return !(url = DashboardUrl(job.Output())).empty(); }, 60000))
      << job.Output();
  EXPECT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << "bound to loopback by default: " << url;

  // ---- the live page
  json live = RunJson({"node", Browser(), "live", url, "--actors", "learner-0,rollout-0,rollout-1,reward-0",
                       "--chart", "reward", "--grow", "3", "--screenshot", (artifacts / "live.png").string(),
                       "--timeout", "240"},
                      300);
  ASSERT_FALSE(live.contains("error")) << live.dump() << "\n" << job.Output();
  ASSERT_TRUE(live.contains("points_after") && live.contains("canvases"))
      << "the browser script answered nothing usable: " << live.dump();
  EXPECT_EQ(live["actors"].size(), 4u) << live.dump();
  EXPECT_GE(live["points_after"].get<int>(), live["points_before"].get<int>() + 3);
  EXPECT_EQ(live["state"], "running");
  EXPECT_GE(live["canvases"].get<int>(), 10) << "curves drawn by uPlot";
  EXPECT_TRUE(fs::exists(artifacts / "live.png"));

  auto run = job.run();
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(SendControl(*run, "stop", Deadline::InMs(5000)).ok());
  auto e = job.Wait(180000);
  ASSERT_TRUE(e.exited && e.code == 0) << e.ToString() << "\n" << job.Output();
  e2e::ExpectAccountingHolds(job);

  // ---- TensorBoard files against metrics.jsonl
  auto tb = ReadTb(run->path + "/tb");
  auto trains = job.Metrics("train");
  auto evals = job.Metrics("eval");
  auto beats = job.Metrics("heartbeat");
  ASSERT_GE(trains.size(), 3u);
  ASSERT_GE(evals.size(), 1u);
  ASSERT_GE(beats.size(), 2u);
  for (size_t i = 0; i < trains.size(); ++i)  // the RL update, as eval records count it
    EXPECT_EQ(trains[i]["step"], static_cast<int64_t>(i + 1)) << trains[i].dump();
  EXPECT_EQ(tb["train/loss"].size(), trains.size());
  for (const auto& t : trains) {
    const int64_t step = t["step"];
    for (const char* f : {"loss", "reward_mean", "kl", "entropy", "clip_fraction", "lag_mean",
                          "is_weight_mean", "train_tokens_per_s", "policy_version"}) {
      ASSERT_TRUE(tb["train/" + std::string(f)].count(step)) << f << " at " << step;
      ExpectFloat32(tb["train/" + std::string(f)][step]["value"], t[f], std::string(f) + " at " + std::to_string(step));
    }
    ASSERT_TRUE(tb["train/lag"].count(step));
    EXPECT_EQ(tb["train/lag"][step]["bucket"], t["extra"]["lag_histogram"]) << step;
    EXPECT_EQ(tb["train/lag"][step]["num"], t["batches"]) << step;
    ASSERT_TRUE(tb["train/is_weight"].count(step)) << step;
    EXPECT_EQ(tb["train/is_weight"][step]["num"], t["tokens"]) << "every trained token, once";
    EXPECT_EQ(tb["train/is_weight"][step]["bucket"], t["extra"]["is_weight_histogram"]["counts"]);
    ASSERT_TRUE(tb["train/group_reward"].count(step)) << step;
    EXPECT_EQ(tb["train/group_reward"][step]["num"], t["groups"]) << step;
  }
  for (const auto& ev : evals) {
    const int64_t step = ev["step"];
    ASSERT_TRUE(tb["eval/eval_accuracy"].count(step)) << step;
    ExpectFloat32(tb["eval/eval_accuracy"][step]["value"], ev["eval_accuracy"], "eval_accuracy");
  }
  ASSERT_TRUE(tb["warm_start/eval_accuracy"].count(0));
  EXPECT_EQ(tb["heartbeat/gen_tokens_per_s"].size() + 0, [&] {
    std::set<int64_t> steps;  // heartbeat lines share steps while the learner is between updates
    for (auto& b : beats) steps.insert(b["step"].get<int64_t>());
    return steps.size();
  }());
  ASSERT_FALSE(tb["rollouts/transcripts"].empty()) << "no transcripts at the evaluations";
  const std::string md = tb["rollouts/transcripts"].rbegin()->second["text"];
  EXPECT_NE(md.find("prompt:"), std::string::npos) << md;
  EXPECT_NE(md.find("reward"), std::string::npos) << md;

  // ---- rollouts.jsonl: a sample of every update
  std::ifstream rin(run->path + "/rollouts.jsonl");
  std::map<int64_t, int> per_step;
  size_t lines = 0;
  for (std::string line; std::getline(rin, line); ++lines) {
    json r = json::parse(line);
    const int64_t step = r["step"];
    per_step[step]++;
    EXPECT_GE(step, 1);
    EXPECT_LE(step, static_cast<int64_t>(trains.size()) + 3) << line;  // (the last updates' batches)
    EXPECT_LE(r["lag"].get<int64_t>(), 2) << line;
    EXPECT_EQ(r["lag"].get<int64_t>(), r["learner_version"].get<int64_t>() - r["policy_version"].get<int64_t>());
    EXPECT_FALSE(r["prompt_text"].get<std::string>().empty()) << line;
    EXPECT_EQ(r["task"], "reverse");
    EXPECT_EQ(r["response_tokens"].size(), r["loss_mask"].size()) << line;
    EXPECT_EQ(r["response_tokens"].size(), r["token_versions"].size()) << line;
    EXPECT_GE(r["reward"].get<double>(), 0.0);
    EXPECT_LE(r["reward"].get<double>(), 1.0);
    EXPECT_EQ(r["actor"], "learner-0");
    EXPECT_EQ(r["scorer"], "reverse");
  }
  ASSERT_GT(lines, trains.size()) << "fewer samples than updates";
  EXPECT_TRUE(job.Metrics("rollouts").empty()) << "samples belong in rollouts.jsonl, not metrics.jsonl";
  for (auto& [step, n] : per_step) EXPECT_LE(n, 3) << "update " << step << " over rollout_samples.per_update";
  EXPECT_GE(per_step.size(), trains.size() * 9 / 10) << "most updates have samples";
  ASSERT_TRUE(fs::exists(run->path + "/status.json"));
  EXPECT_EQ(json::parse(*ReadFile(run->path + "/status.json"))["state"], "stopped");

  // ---- the finished run, from its folder alone
  SpawnOptions so;
  so.argv = {e2e::BuildDir() + "/launcher/troupe", "--runs-dir", job.runs(), "dashboard", run->name()};
  so.output_file = (fs::path(job.runs()) / "dashboard.out").string();
  auto dash = Subprocess::Spawn(so);
  ASSERT_TRUE(dash.ok()) << dash.status().ToString();
  std::string furl;
  ASSERT_TRUE(e2e::Eventually(
      [&] {
        auto t = ReadFile(so.output_file);
        return t.ok() && !(furl = DashboardUrl(*t)).empty();
      },
      30000));
  json fin = RunJson({"node", Browser(), "finished", furl, "--screenshot", (artifacts / "finished.png").string(),
                      "--timeout", "120"},
                     180);
  ASSERT_FALSE(fin.contains("error")) << fin.dump();
  EXPECT_EQ(fin["state"], "stopped");
  EXPECT_EQ(fin["actors"].size(), 4u);
  EXPECT_EQ(fin["points"]["reward"].get<size_t>(), trains.size()) << "one point per update, each once";
  EXPECT_EQ(fin["points"]["accuracy"].get<size_t>(), evals.size() + 1) << "the warm start and every eval";
  EXPECT_GT(fin["points"]["gen"].get<int>(), 0);
  EXPECT_NE(fin["summary"].get<std::string>().find("[holds]"), std::string::npos) << fin["summary"];
  EXPECT_EQ(fin["rollout_cards"], 40) << "one page of the viewer";
  EXPECT_NE(fin["filtered_info"].get<std::string>().find(" of " + std::to_string(lines)), std::string::npos)
      << fin["filtered_info"];
  for (auto& rw : fin["filtered_rewards"]) EXPECT_GE(rw.get<double>(), 1.0) << "filter reward >= 1";
  EXPECT_GT(fin["log_chars"].get<int>(), 100);
  EXPECT_TRUE(fs::exists(artifacts / "finished-rollouts.png"));
  auto ex = dash->Stop();
  EXPECT_TRUE(ex.signal == SIGTERM || (ex.exited && ex.code == 0)) << ex.ToString();
}

}  // namespace
}  // namespace troupe::launcher
