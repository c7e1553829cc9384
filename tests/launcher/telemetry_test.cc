// The head's telemetry without a job: TensorBoard event files read back by an
// independent Python reader (tb_reader.py: protobuf + crcmod), Prometheus text
// checked by `promtool check metrics`, the dashboard's HTTP API over a run
// folder written here (series, logs, rollouts with filters, access rules), and
// the run-folder readers (growing, torn and replaced files).
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "../common/node_runner.h"
#include "prometheus.h"
#include "run_view.h"
#include "troupe/launcher/dashboard.h"
#include "troupe/launcher/head.h"
#include "troupe/launcher/telemetry.h"
#include "troupe/launcher/tensorboard.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using troupe::testing::RunProcess;

class TelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("telemetry_test." + std::to_string(::getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "logs");
    run_.path = root_.string();
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }
  void Append(const std::string& file, const std::string& text) {
    std::ofstream(root_ / file, std::ios::app) << text;
  }
  // The Python reader's records of every event file in `dir`.
  std::vector<json> ReadTb(const std::string& dir) {
    auto r = RunProcess({"/usr/bin/python3", troupe::testing::SourceDir() + "/tests/launcher/tb_reader.py", dir},
                        "", 60);
    EXPECT_TRUE(r.ok) << r.error << r.err;
    std::vector<json> out;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  fs::path root_;
  RunDir run_;
};

TEST(MaskedCrc32c, MatchesTheCastagnoliCheckValue) {
  // CRC-32C("123456789") = 0xE3069283 (the standard check value), then masked.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(MaskedCrc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_F(TelemetryTest, EventFilesReadBackWithAnIndependentReader) {
  auto w = TbWriter::Open((root_ / "tb").string());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->AddScalar("train/loss", 3, 0.125, 1700000000.5).ok());
  ASSERT_TRUE((*w)->AddScalar("train/loss", 4, -2.5, 1700000001.0).ok());
  ASSERT_TRUE((*w)->AddIntegerHistogram("train/lag", 4, {5, 0, 3}, 1700000001.0).ok());
  ASSERT_TRUE((*w)->AddHistogram("train/group_reward", 4, {0.0, 0.25, 1.0, 1.0}, {0.0, 0.5, 1.0},
                                 1700000001.0)
                  .ok());
  const std::string text = "**update 4** · reward 1\n\n```\nolleh\n```";
  ASSERT_TRUE((*w)->AddText("rollouts/transcripts", 4, text, 1700000002.0).ok());
  auto recs = ReadTb((root_ / "tb").string());
  ASSERT_EQ(recs.size(), 6u);
  EXPECT_EQ(recs[0]["file_version"], "brain.Event:2");
  EXPECT_EQ(recs[1]["tag"], "train/loss");
  EXPECT_EQ(recs[1]["step"], 3);
  EXPECT_DOUBLE_EQ(recs[1]["value"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(recs[1]["wall_time"].get<double>(), 1700000000.5);
  EXPECT_DOUBLE_EQ(recs[2]["value"].get<double>(), -2.5);
  const json& lag = recs[3];
  EXPECT_EQ(lag["type"], "histogram");
  EXPECT_EQ(lag["num"], 8);
  EXPECT_EQ(lag["min"], 0);
  EXPECT_EQ(lag["max"], 2);
  EXPECT_EQ(lag["sum"], 6);  // 3 batches at lag 2
  EXPECT_EQ(lag["bucket"], json::array({5, 0, 3}));
  const json& gr = recs[4];
  EXPECT_EQ(gr["num"], 4);
  EXPECT_EQ(gr["bucket"], json::array({1, 1, 2, 0}));  // (-inf,0] (0,.5] (.5,1] (1,inf)
  EXPECT_DOUBLE_EQ(gr["sum"].get<double>(), 2.25);
  EXPECT_EQ(recs[5]["type"], "text");
  EXPECT_EQ(recs[5]["plugin"], "text");
  EXPECT_EQ(recs[5]["dtype"], 7);
  EXPECT_EQ(recs[5]["text"], text);
}

TEST_F(TelemetryTest, TheReaderRejectsACorruptRecord) {
  std::string path;
  {
    auto w = TbWriter::Open((root_ / "tb").string());
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AddScalar("train/loss", 1, 1.0, 1.0).ok());
    path = (*w)->path();
  }
  // Flip one byte of the last record's payload: its data checksum no longer holds.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-6, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-6, std::ios::end);
  c ^= 0x40;
  f.write(&c, 1);
  f.close();
  auto r = RunProcess({"/usr/bin/python3", troupe::testing::SourceDir() + "/tests/launcher/tb_reader.py", path},
                      "", 60);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.err.find("bad data checksum"), std::string::npos) << r.err;
}

TEST_F(TelemetryTest, MetricsLinesBecomeScalarsHistogramsAndTranscripts) {
  TelemetryOptions o;
  o.job_name = "t";
  o.dashboard.enabled = false;
  o.tensorboard.texts_per_eval = 2;
  auto t = Telemetry::Create(run_, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  json train = {{"kind", "train"}, {"step", 7},       {"time_ns", 1700000000000000000}, {"actor", "learner-0"},
                {"loss", 0.5},     {"policy_version", 7}, {"extra", {{"lag_histogram", {1, 2}}, {"group_rewards", {0.5, 1.0}},
                            {"is_weight_histogram", {{"edges", {0.9, 1.1}}, {"counts", {2, 30, 1}}}}}}};
  (*t)->OnMetricsLine(train);
  (*t)->OnRollouts("learner-0", 1700000000000000000,
                   json{{"sequences", {{{"step", 7}, {"task", "reverse"}, {"reward", 1.0},
                                        {"prompt_text", "abc"}, {"response_text", "cba"}}}}}
                       .dump());
  (*t)->OnMetricsLine({{"kind", "eval"}, {"step", 7}, {"eval_accuracy", 0.75}, {"time_ns", 1700000000000000000}});
  (*t)->OnMetricsLine({{"kind", "final"}, {"step", 7}, {"trained", 99}});  // not charted
  (*t)->OnRollouts("learner-0", 1, "not json");                           // ignored, no crash
  t->reset();
  std::map<std::string, json> by_tag;
  for (auto& r : ReadTb((root_ / "tb").string()))
    if (r.contains("tag")) by_tag[r["tag"]] = r;
  EXPECT_DOUBLE_EQ(by_tag["train/loss"]["value"].get<double>(), 0.5);
  EXPECT_EQ(by_tag["train/loss"]["step"], 7);
  EXPECT_EQ(by_tag["train/policy_version"]["value"], 7);
  EXPECT_EQ(by_tag["train/lag"]["bucket"], json::array({1, 2}));
  EXPECT_EQ(by_tag["train/group_reward"]["num"], 2);
  EXPECT_EQ(by_tag["train/is_weight"]["bucket"], json::array({2, 30, 1}));
  EXPECT_EQ(by_tag["train/is_weight"]["num"], 33);
  EXPECT_DOUBLE_EQ(by_tag["train/is_weight"]["bucket_limit"][1].get<double>(), 1.1);
  EXPECT_DOUBLE_EQ(by_tag["eval/eval_accuracy"]["value"].get<double>(), 0.75);
  EXPECT_EQ(by_tag.count("final/trained"), 0u);
  EXPECT_EQ(by_tag.count("train/time_ns"), 0u);
  ASSERT_TRUE(by_tag.count("rollouts/transcripts"));
  const std::string md = by_tag["rollouts/transcripts"]["text"];
  EXPECT_NE(md.find("cba"), std::string::npos) << md;
  EXPECT_NE(md.find("reverse"), std::string::npos) << md;
  // rollouts.jsonl: the sequence with the actor and time added.
  std::ifstream in(root_ / "rollouts.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  json r = json::parse(line);
  EXPECT_EQ(r["actor"], "learner-0");
  EXPECT_EQ(r["response_text"], "cba");
  EXPECT_FALSE(std::getline(in, line)) << "one line per sequence";
}

ActorStatus Actor(const std::string& id, const std::string& role, std::map<std::string, double> stats,
                  int64_t hb_ns, uint32_t restarts = 0) {
  ActorStatus a;
  a.id = id;
  a.role = role;
  a.node = "n1";
  a.state = "ready";
  a.pid = 100;
  a.restarts = restarts;
  a.last_heartbeat_ns = hb_ns;
  a.stats = std::move(stats);
  return a;
}

TEST(HeartbeatFigures, SumsTheRolesFigures) {
  const int64_t now = 10'000'000'000;
  std::vector<ActorStatus> actors = {
      Actor("rollout-0", "rollout", {{"gen_tokens_per_s", 100}, {"credits", 4}, {"outbox", 2}, {"in_flight", 16}}, now - 1'000'000'000, 1),
      Actor("rollout-1", "rollout", {{"gen_tokens_per_s", 50}, {"credits", 3}, {"outbox", 1}, {"transport.rejected", 7}}, now - 3'000'000'000),
      Actor("reward-0", "reward", {{"outbox", 5}, {"awaiting_learner", 2}}, now),
      Actor("learner-0", "learner", {{"train_tokens_per_s", 900}, {"credits_granted", 8}, {"queued_batches", 1}}, now)};
  actors.push_back(Actor("rollout-2", "rollout", {{"gen_tokens_per_s", 1e6}}, now, 2));
  actors.back().state = "lost";  // its figures are stale: not summed, its restarts are
  json h = HeartbeatFigures(actors, now);
  EXPECT_EQ(h["gen_tokens_per_s"], 150);
  EXPECT_EQ(h["credits"], 7);
  EXPECT_EQ(h["outbox_rollout"], 3);
  EXPECT_EQ(h["outbox_reward"], 5);
  EXPECT_EQ(h["train_tokens_per_s"], 900);
  EXPECT_EQ(h["credits_granted"], 8);
  EXPECT_EQ(h["restarts"], 3);
  EXPECT_EQ(h["actors_up"], 4);
  EXPECT_EQ(h["transport_rejected"], 7);
  EXPECT_DOUBLE_EQ(h["heartbeat_age_max_s"].get<double>(), 3.0);
  EXPECT_EQ(h["per_actor"]["rollout-1"]["credits"], 3);
}

json SampleStatus(int64_t now) {
  std::vector<ActorStatus> actors = {
      Actor("rollout-0", "rollout", {{"gen_tokens_per_s", 120.5}, {"credits", 4}, {"outbox", 2},
                                     {"transport.rejected.oversized", 3}, {"sender.retransmits", 1}}, now - 2'000'000'000, 1),
      Actor("learner-0", "learner", {{"train_tokens_per_s", 900}, {"credits_granted", 8}, {"dropped_stale", 64},
                                     {"dropped_invalid", 0}}, now)};
  actors[0].node = "node \"a\"\\b";  // label values are escaped
  RunDir run{"/tmp/x"};
  return StatusDocument("job1", run, "running", actors, {{"step", 12}}, now);
}

TEST(Prometheus, TextFormatPassesPromtoolAndHasTheSeries) {
  const int64_t now = 50'000'000'000;
  json train = {{"kind", "train"}, {"step", 12}, {"policy_version", 12}, {"forward_s", 0.02},
                {"backward_s", 0.05}, {"optimizer_s", 0.01}, {"lag_mean", 0.5}, {"lag_max", 2},
                {"reward_mean", 0.4}};
  json eval = {{"kind", "eval"}, {"eval_accuracy", 0.6}, {"eval_reward", 0.8}};
  const std::string text = RenderPrometheus(SampleStatus(now), train, eval, now);
  EXPECT_NE(text.find("troupe_actor_heartbeat_age_seconds{actor=\"rollout-0\",role=\"rollout\"} 2\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("troupe_actor_restarts_total{actor=\"rollout-0\",role=\"rollout\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_actor_tokens_per_second{actor=\"learner-0\",role=\"learner\"} 900\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_actor_credits{actor=\"rollout-0\",role=\"rollout\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_actor_dropped_stale_sequences_total{actor=\"learner-0\",role=\"learner\"} 64\n"),
            std::string::npos);
  EXPECT_NE(text.find("troupe_actor_stat{actor=\"rollout-0\",role=\"rollout\",stat=\"transport.rejected.oversized\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("node=\"node \\\"a\\\"\\\\b\""), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_learner_version 12\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_learner_update_seconds 0.08"), std::string::npos);
  EXPECT_NE(text.find("troupe_learner_policy_lag{stat=\"max\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_eval_accuracy 0.6\n"), std::string::npos);
  auto r = RunProcess({"promtool", "check", "metrics"}, text, 60);
  EXPECT_TRUE(r.ok) << r.error << "\n" << r.out << r.err << "\n" << text;
  EXPECT_EQ(r.out + r.err, "") << "promtool lint findings";
}

// ------------------------------------------------------------------ run folder readers

TEST_F(TelemetryTest, JsonlTailReadsCompleteLinesAndStartsOverWhenReplaced) {
  JsonlTail tail((root_ / "m.jsonl").string());
  std::vector<std::string> seen;
  int resets = 0;
  auto poll = [&] {
    tail.Poll([&](std::string_view l, uint64_t) { seen.emplace_back(l); }, [&] { ++resets; });
  };
  poll();  // no file yet
  Append("m.jsonl", "{\"a\":1}\n{\"b\":");
  poll();
  EXPECT_EQ(seen, std::vector<std::string>({"{\"a\":1}"}));
  Append("m.jsonl", "2}\n");
  poll();
  EXPECT_EQ(seen, std::vector<std::string>({"{\"a\":1}", "{\"b\":2}"}));
  // Replaced by a shorter file: read from its start.
  fs::remove(root_ / "m.jsonl");
  Append("m.jsonl", "{\"c\":3}\n");
  poll();
  EXPECT_EQ(resets, 1);
  EXPECT_EQ(seen.back(), "{\"c\":3}");
}

TEST_F(TelemetryTest, LogChunksTailAndFollowAtLineBoundaries) {
  const std::string path = (root_ / "logs" / "x.log").string();
  std::string text;
  for (int i = 0; i < 100; ++i) text += "line " + std::to_string(i) + "\n";
  Append("logs/x.log", text + "partial");
  auto tail = ReadLogChunk(path, -1, 50);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->text.rfind("line 99\n"), tail->text.size() - 8) << tail->text;
  EXPECT_EQ(tail->text.find("line"), 0u) << "starts at a line: " << tail->text;
  EXPECT_EQ(tail->next, text.size());
  Append("logs/x.log", " done\n");
  auto more = ReadLogChunk(path, static_cast<int64_t>(tail->next), 1000);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->text, "partial done\n");
  // A line longer than the chunk is returned cut (never a reader stuck on it).
  Append("logs/x.log", std::string(300, 'x') + "\n");
  auto big = ReadLogChunk(path, static_cast<int64_t>(more->next), 100);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->text.size(), 100u);
  EXPECT_FALSE(ReadLogChunk((root_ / "logs" / "none.log").string(), 0, 10).ok());
  EXPECT_TRUE(SafeFileName("rollout-0"));
  for (const char* bad : {"", "..", "../head", "a/b", ".hidden", "a b", "x\n"})
    EXPECT_FALSE(SafeFileName(bad)) << bad;
}

// A run folder as a finished job leaves it.
void WriteRun(const fs::path& root, int updates, int rollouts_per_update) {
  std::ofstream m(root / "metrics.jsonl");
  m << json{{"kind", "warm_start"}, {"step", 0}, {"eval_accuracy", 0.4}, {"time_ns", 1}}.dump() << "\n";
  std::ofstream r(root / "rollouts.jsonl");
  for (int s = 1; s <= updates; ++s) {
    m << json{{"kind", "train"}, {"step", s}, {"loss", 1.0 / s}, {"time_ns", s * 1000}, {"extra", {{"lag_histogram", {3, 1}}}}}.dump() << "\n";
    if (s % 5 == 0) m << json{{"kind", "eval"}, {"step", s}, {"eval_accuracy", 0.4 + s * 0.01}}.dump() << "\n";
    m << json{{"kind", "heartbeat"}, {"step", s}, {"gen_tokens_per_s", 100.0 * s}, {"time_ns", s * 1000}}.dump() << "\n";
    for (int k = 0; k < rollouts_per_update; ++k)
      r << json{{"step", s}, {"task", k % 2 ? "sort" : "reverse"}, {"reward", k % 2 ? 1.0 : 0.0},
                {"prompt_text", "p" + std::to_string(s)}, {"response_text", "resp " + std::to_string(s * 10 + k)}}
               .dump()
        << "\n";
  }
  m << "{\"kind\":\"final\",\"actor\":\"learner-0\",\"trained\":5}\n{torn";
  std::ofstream(root / "logs" / "learner-0.log") << "[learner-0] hello\n[learner-0] done\n";
  json st = SampleStatus(1);
  st["state"] = "finished";
  std::ofstream(root / "status.json") << st.dump();
}

class DashboardTest : public TelemetryTest {
 protected:
  void Serve(DashboardOptions o = {}) {
    auto d = Dashboard::Start(run_, o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dash_ = std::move(d).value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", dash_->port());
    client_->set_connection_timeout(5, 0);
    client_->set_read_timeout(10, 0);
  }
  json Get(const std::string& path, int want = 200) {
    auto res = client_->Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return json();
    EXPECT_EQ(res->status, want) << path << ": " << res->body;
    return json::parse(res->body, nullptr, false);
  }
  std::unique_ptr<Dashboard> dash_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(DashboardTest, ServesAFinishedRunFromItsFolder) {
  WriteRun(root_, 30, 4);
  Serve();
  auto page = client_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("app.js"), std::string::npos);
  auto uplot = client_->Get("/uPlot.iife.min.js");
  ASSERT_TRUE(uplot);
  EXPECT_EQ(uplot->status, 200) << "uPlot not embedded: " << uplot->body;
  EXPECT_GT(uplot->body.size(), 10000u);
  json job = Get("/api/job");
  EXPECT_EQ(job["state"], "finished");
  EXPECT_FALSE(job["live"].get<bool>());
  EXPECT_DOUBLE_EQ(job["warm_start"]["eval_accuracy"].get<double>(), 0.4);
  json actors = Get("/api/actors");
  ASSERT_EQ(actors["actors"].size(), 2u);
  EXPECT_EQ(actors["actors"][0]["id"], "rollout-0");
  // Series: every charted record (warm_start + 30 train + 6 eval + 30 heartbeat), in pages.
  json p1 = Get("/api/series?from=0&max=40");
  EXPECT_EQ(p1["total"], 67);
  EXPECT_EQ(p1["records"].size(), 40u);
  json p2 = Get("/api/series?from=" + std::to_string(p1["next"].get<int>()) + "&max=40");
  EXPECT_EQ(p2["records"].size(), 27u);
  EXPECT_EQ(p2["next"], 67);
  EXPECT_EQ(p1["records"][1]["kind"], "train");
  Get("/api/series?from=abc", 400);
  // Logs.
  json logs = Get("/api/logs");
  ASSERT_EQ(logs["logs"].size(), 1u);
  json log = Get("/api/logs?actor=learner-0&offset=0");
  EXPECT_EQ(log["text"], "[learner-0] hello\n[learner-0] done\n");
  Get("/api/logs?actor=../status", 400);
  Get("/api/logs?actor=nobody", 404);
  // Rollouts: newest first, filters, paging.
  json all = Get("/api/rollouts?limit=5");
  EXPECT_EQ(all["total"], 120);
  EXPECT_EQ(all["matched"], 120);
  EXPECT_EQ(all["rollouts"].size(), 5u);
  EXPECT_EQ(all["rollouts"][0]["record"]["step"], 30);
  EXPECT_EQ(all["step_min"], 1);
  EXPECT_EQ(all["tasks"], json::array({"reverse", "sort"}));
  json f = Get("/api/rollouts?step_min=10&step_max=12&reward_min=0.5&task=sort&limit=100");
  EXPECT_EQ(f["matched"], 6);  // 3 updates x 2 sort sequences
  for (auto& it : f["rollouts"]) {
    EXPECT_EQ(it["record"]["task"], "sort");
    EXPECT_GE(it["record"]["step"].get<int>(), 10);
  }
  json text = Get("/api/rollouts?text=resp%20203");
  ASSERT_EQ(text["matched"], 1);
  EXPECT_EQ(text["rollouts"][0]["record"]["step"], 20);
  json older = Get("/api/rollouts?limit=2&before=" + std::to_string(all["rollouts"][4]["index"].get<int>()));
  EXPECT_EQ(older["rollouts"][0]["index"], all["rollouts"][4]["index"].get<int>() - 1);
  Get("/api/rollouts?reward_min=x", 400);
  // Prometheus from the finished status.
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("troupe_job_running{job=\"job1\"} 0"), std::string::npos) << metrics->body;
}

TEST_F(DashboardTest, LiveStatusAndGrowingFilesShowUpWithoutARestart) {
  Serve();
  EXPECT_EQ(Get("/api/series")["total"], 0);
  EXPECT_EQ(Get("/api/rollouts")["total"], 0);
  dash_->Publish(SampleStatus(5));
  EXPECT_EQ(Get("/api/job")["state"], "running");
  EXPECT_TRUE(Get("/api/job")["live"].get<bool>());
  Append("metrics.jsonl", json{{"kind", "train"}, {"step", 1}, {"loss", 2.0}}.dump() + "\n");
  EXPECT_EQ(Get("/api/series")["total"], 1);
  Append("metrics.jsonl", json{{"kind", "train"}, {"step", 2}, {"loss", 1.0}}.dump() + "\n");
  json s = Get("/api/series?from=1");
  EXPECT_EQ(s["records"].size(), 1u);
  EXPECT_EQ(s["records"][0]["step"], 2);
  Append("rollouts.jsonl", json{{"step", 2}, {"reward", 1.0}}.dump() + "\n");
  EXPECT_EQ(Get("/api/rollouts")["total"], 1);
}

TEST_F(DashboardTest, ATokenGuardsEveryRequest) {
  WriteRun(root_, 2, 1);
  DashboardOptions o;
  o.token = "s3cret-token";
  Serve(o);
  EXPECT_NE(dash_->url().find("?token=s3cret-token"), std::string::npos);
  Get("/api/job", 401);
  Get("/", 401);
  Get("/api/job?token=wrong", 401);
  auto res = client_->Get("/?token=s3cret-token");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::string cookie = res->get_header_value("Set-Cookie");
  EXPECT_NE(cookie.find("troupe_token=s3cret-token"), std::string::npos);
  EXPECT_NE(cookie.find("HttpOnly"), std::string::npos);
  auto with_cookie = client_->Get("/api/job", {{"Cookie", "troupe_token=s3cret-token"}});
  ASSERT_TRUE(with_cookie);
  EXPECT_EQ(with_cookie->status, 200);
  auto bearer = client_->Get("/metrics", {{"Authorization", "Bearer s3cret-token"}});
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200);
}

TEST_F(DashboardTest, LoopbackAnswersOnlyLocalHostNames) {
  WriteRun(root_, 2, 1);
  Serve();
  auto evil = client_->Get("/api/job", {{"Host", "attacker.example:80"}});
  ASSERT_TRUE(evil);
  EXPECT_EQ(evil->status, 403) << "a rebound DNS name must not read the job";
  auto local = client_->Get("/api/job", {{"Host", "localhost:1234"}});
  ASSERT_TRUE(local);
  EXPECT_EQ(local->status, 200);
}

TEST(DashboardOptions, BindParsingAndNonLoopbackNeedsAToken) {
  std::string bind = "127.0.0.1";
  uint32_t port = 0;
  ASSERT_TRUE(ParseDashboardBind("0.0.0.0:8265", &bind, &port).ok());
  EXPECT_EQ(bind, "0.0.0.0");
  EXPECT_EQ(port, 8265u);
  ASSERT_TRUE(ParseDashboardBind(":9000", &bind, &port).ok());
  EXPECT_EQ(bind, "0.0.0.0");
  EXPECT_EQ(port, 9000u);
  ASSERT_TRUE(ParseDashboardBind("[::1]:7000", &bind, &port).ok());
  EXPECT_EQ(bind, "::1");
  ASSERT_TRUE(ParseDashboardBind("10.1.2.3", &bind, &port).ok());
  EXPECT_EQ(bind, "10.1.2.3");
  EXPECT_EQ(port, 7000u);
  for (const char* bad : {"", "host:", "host:99999", "host:12x", "[::1", "[::1]x", "a b:1"})
    EXPECT_FALSE(ParseDashboardBind(bad, &bind, &port).ok()) << bad;
  RunDir run{::testing::TempDir()};
  DashboardOptions o;
  o.bind = "0.0.0.0";
  auto d = Dashboard::Start(run, o);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("token"), std::string::npos);
  auto t = NewDashboardToken();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 32u);
  EXPECT_NE(*t, *NewDashboardToken());
}

}  // namespace
}  // namespace troupe::launcher
