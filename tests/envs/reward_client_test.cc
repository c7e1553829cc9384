// External reward services: a real HTTP server process (tests/envs/reward_server.py)
// on port 0; success, routing by name and by default, every failure mode,
// retries, deadlines and concurrency; and the reward actor's scorer on top.
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/eventually.h"
#include "server_process.h"
#include "troupe/envs/reward_client.h"
#include "troupe/envs/scorer.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

// The test server (tests/envs/reward_server.py) with request counters.
class ServerProcess : public testing::ServerProcess {
 public:
  ServerProcess()
      : testing::ServerProcess(
            {"python3", std::string(TROUPE_ENVS_TEST_DIR) + "/reward_server.py", "--port", "0"}) {}
  json Stats() const { return json::parse(Get("/stats"), nullptr, false); }
  int64_t Count(const std::string& path) const {
    json s = Stats();
    return s["paths"].contains(path) ? s["paths"][path].get<int64_t>() : 0;
  }
};

class RewardClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()) << "the test server did not start"; }

  static RewardServiceConfig Service(const std::string& name, const std::string& path) {
    RewardServiceConfig s;
    s.name = name;
    s.url = server_->Url(path);
    s.timeout_ms = 5000;
    s.max_attempts = 3;
    s.backoff_ms = 5;
    return s;
  }
  static std::unique_ptr<RewardClient> Client(RewardClientConfig c) {
    auto client = RewardClient::Create(c);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }
  static RewardRequest Sample(const std::string& service, const std::string& response = "cba",
                              const std::string& metadata = "") {
    return RewardRequest{service, "reverse", "abc=", response, "cba", metadata};
  }
  static RewardServiceStats StatsOf(const RewardClient& c, const std::string& name) {
    for (const auto& s : c.Stats())
      if (s.name == name) return s;
    ADD_FAILURE() << "no stats for " << name;
    return {};
  }
  static ServerProcess* server_;
};
ServerProcess* RewardClientTest::server_ = nullptr;

TEST_F(RewardClientTest, ScoresASample) {
  RewardClientConfig c;
  c.services = {Service("ok", "/verify")};
  c.default_service = "ok";
  auto client = Client(c);
  VerifyResult hit = client->Verify(Sample(""));
  EXPECT_TRUE(hit.ok()) << hit.failure;
  EXPECT_EQ(hit.reward, 1.0);
  EXPECT_EQ(hit.scorer, "http:ok");
  ASSERT_EQ(hit.components.size(), 1u);
  EXPECT_EQ(hit.components[0].first, "exact");
  EXPECT_EQ(client->Verify(Sample("", "abc")).reward, 0.0);
  EXPECT_EQ(client->Verify(Sample("", "x", R"({"reward": 0.75})")).reward, 0.75);
  RewardServiceStats s = StatsOf(*client, "ok");
  EXPECT_EQ(s.samples, 3u);
  EXPECT_EQ(s.ok, 3u);
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(s.retries, 0u);
}

TEST_F(RewardClientTest, RoutesByNameAndByDefault) {
  RewardClientConfig c;
  c.services = {Service("alpha", "/r/0.25/verify"), Service("beta", "/r/0.75/verify"),
                Service("gamma", "/r/0.5/verify")};
  c.default_service = "gamma";
  auto client = Client(c);
  auto results =
      client->VerifyBatch({Sample("alpha"), Sample("beta"), Sample(""), Sample("delta")});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].reward, 0.25);
  EXPECT_EQ(results[0].scorer, "http:alpha");
  EXPECT_EQ(results[1].reward, 0.75);
  EXPECT_EQ(results[2].reward, 0.5) << "no name: the default service";
  EXPECT_FALSE(results[3].ok());
  EXPECT_EQ(results[3].reward, 0.0);
  EXPECT_NE(results[3].failure.find("unknown reward service 'delta'"), std::string::npos);
  EXPECT_EQ(StatsOf(*client, "alpha").ok, 1u);
  EXPECT_EQ(StatsOf(*client, "gamma").ok, 1u);
  EXPECT_EQ(StatsOf(*client, "<unrouted>").failed, 1u);

  c.default_service.clear();
  auto no_default = Client(c);
  VerifyResult r = no_default->Verify(Sample(""));
  EXPECT_NE(r.failure.find("no default_service"), std::string::npos) << r.failure;
}

struct FailureCase {
  std::string path;
  std::string reason;
  int64_t attempts;
  uint64_t RewardServiceStats::*counter;
};

TEST_F(RewardClientTest, EachFailureModeGivesZeroWithAReasonAfterBoundedRetries) {
  std::vector<FailureCase> cases = {
      {"/status/500/verify", "HTTP status 500", 3, &RewardServiceStats::http_status},
      {"/status/503/verify", "HTTP status 503", 3, &RewardServiceStats::http_status},
      {"/status/404/verify", "HTTP status 404", 1,
       &RewardServiceStats::http_status},  // not retried
      {"/malformed/verify", "not a JSON object", 3, &RewardServiceStats::malformed},
      {"/noreward/verify", "no numeric \"reward\"", 3, &RewardServiceStats::malformed},
      {"/nan/verify", "malformed response", 3, &RewardServiceStats::malformed},
      {"/huge/verify", "body over 65536 bytes", 3, &RewardServiceStats::malformed},
      {"/close/verify", "connection failed", 3, &RewardServiceStats::connection},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const FailureCase& fc = cases[i];
    SCOPED_TRACE(fc.path);
    std::string path = fc.path + "?case=" + std::to_string(i);
    RewardClientConfig c;
    c.services = {Service("svc", path)};
    auto client = Client(c);
    VerifyResult r = client->Verify(Sample("svc"));
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.reward, 0.0);
    EXPECT_NE(r.failure.find(fc.reason), std::string::npos) << r.failure;
    EXPECT_NE(r.failure.find("reward service 'svc'"), std::string::npos) << r.failure;
    RewardServiceStats s = StatsOf(*client, "svc");
    EXPECT_EQ(s.attempts, static_cast<uint64_t>(fc.attempts));
    EXPECT_EQ(s.retries, static_cast<uint64_t>(fc.attempts - 1));
    EXPECT_EQ(s.*fc.counter, static_cast<uint64_t>(fc.attempts));
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(server_->Count(path), fc.attempts) << "the server saw every attempt";
  }
}

TEST_F(RewardClientTest, UnreachableServiceIsRetriedThenFails) {
  // A bound socket that never listens: connections are refused, and nobody
  // else can take the port while we hold it.
  int sock = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  RewardClientConfig c;
  RewardServiceConfig s = Service("down", "/verify");
  s.url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/verify";
  c.services = {s};
  c.default_service = "down";
  auto client = Client(c);
  VerifyResult r = client->Verify(Sample(""));
  close(sock);
  EXPECT_EQ(r.reward, 0.0);
  EXPECT_NE(r.failure.find("unreachable"), std::string::npos) << r.failure;
  EXPECT_EQ(StatsOf(*client, "down").unreachable, 3u);
}

TEST_F(RewardClientTest, FlakyServiceSucceedsAfterRetries) {
  RewardClientConfig c;
  c.services = {Service("flaky", "/flaky/2/verify")};
  auto client = Client(c);
  VerifyResult r = client->Verify(Sample("flaky", "cba", R"({"key": "flaky-test"})"));
  EXPECT_TRUE(r.ok()) << r.failure;
  EXPECT_EQ(r.reward, 1.0);
  RewardServiceStats s = StatsOf(*client, "flaky");
  EXPECT_EQ(s.attempts, 3u);
  EXPECT_EQ(s.retries, 2u);
  EXPECT_EQ(s.http_status, 2u);
  EXPECT_EQ(s.ok, 1u);
  // With one attempt allowed, the same failure is final.
  c.services[0].max_attempts = 1;
  auto once = Client(c);
  VerifyResult f = once->Verify(Sample("flaky", "cba", R"({"key": "flaky-test-2"})"));
  EXPECT_NE(f.failure.find("HTTP status 503"), std::string::npos);
}

TEST_F(RewardClientTest, TimeoutsBoundTheCall) {
  RewardClientConfig c;
  RewardServiceConfig slow = Service("slow", "/slow/30/verify");
  slow.timeout_ms = 300;
  slow.max_attempts = 5;
  c.services = {slow};
  c.call_timeout_ms = 1000;
  auto client = Client(c);
  auto t0 = std::chrono::steady_clock::now();
  VerifyResult r = client->Verify(Sample("slow"));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.reward, 0.0);
  EXPECT_NE(r.failure.find("timeout"), std::string::npos) << r.failure;
  EXPECT_LT(seconds, 20.0) << "bounded by call_timeout_ms, not the server's 30 s";
  RewardServiceStats s = StatsOf(*client, "slow");
  EXPECT_GE(s.timeouts, 1u);
  EXPECT_LE(s.attempts, 5u);
  // A caller deadline shorter than call_timeout_ms wins.
  VerifyResult d = client->Verify(Sample("slow"), Deadline::InMs(100));
  EXPECT_NE(d.failure.find("timeout"), std::string::npos) << d.failure;
  // A batch of many slow samples returns by its deadline too, all failed.
  c.max_concurrency = 4;
  auto batch_client = Client(c);
  std::vector<RewardRequest> batch(24, Sample("slow"));
  t0 = std::chrono::steady_clock::now();
  auto results = batch_client->VerifyBatch(batch);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20.0);
  for (const auto& res : results) {
    EXPECT_EQ(res.reward, 0.0);
    // Timed out, or failed at once once the circuit breaker opened.
    EXPECT_TRUE(res.failure.find("time") != std::string::npos ||
                res.failure.find("circuit open") != std::string::npos)
        << res.failure;
  }
}

// The attempt limit was cut to what was left of the sample's time: the
// reason says so instead of a bare "timeout after 878 ms" next to a 2000 ms
// timeout_ms.
TEST_F(RewardClientTest, TimeoutReasonNamesTheLimitThatEndedTheAttempt) {
  RewardClientConfig c;
  RewardServiceConfig slow = Service("slow", "/slow/30/verify?case=cut");
  slow.timeout_ms = 2000;
  slow.max_attempts = 1;
  c.services = {slow};
  c.call_timeout_ms = 400;
  auto client = Client(c);
  VerifyResult r = client->Verify(Sample("slow"));
  EXPECT_NE(r.failure.find("cut to the time left"), std::string::npos) << r.failure;
  EXPECT_NE(r.failure.find("timeout_ms 2000"), std::string::npos) << r.failure;
  c.call_timeout_ms = 5000;
  c.services[0].timeout_ms = 300;
  auto own = Client(c);
  VerifyResult o = own->Verify(Sample("slow"));
  EXPECT_NE(o.failure.find("no answer within timeout_ms 300 ms"), std::string::npos) << o.failure;
}

// After breaker_failures samples in a row failed, samples fail at once
// without a request; after the cooldown one probe goes out; a failed probe
// opens the breaker again, a good one closes it.
TEST_F(RewardClientTest, CircuitBreakerFailsFastAfterRepeatedFailuresAndProbes) {
  RewardClientConfig c;
  // 503 for the first 4 requests of this key, then ok.
  RewardServiceConfig s = Service("flaky", "/flaky/4/verify?case=breaker");
  s.max_attempts = 1;
  s.breaker_failures = 3;
  s.breaker_cooldown_ms = 200;
  c.services = {s};
  auto client = Client(c);
  const std::string path = "/flaky/4/verify?case=breaker";
  const int64_t before = server_->Count(path);
  const auto sample = Sample("flaky", "cba", R"({"key": "breaker-test"})");
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(client->Verify(sample).ok());
  EXPECT_EQ(server_->Count(path) - before, 3);
  // Open: no request reaches the service.
  for (int i = 0; i < 20; ++i) {
    VerifyResult r = client->Verify(sample);
    EXPECT_NE(r.failure.find("circuit open"), std::string::npos) << r.failure;
  }
  EXPECT_EQ(server_->Count(path) - before, 3);
  RewardServiceStats st = StatsOf(*client, "flaky");
  EXPECT_EQ(st.short_circuited, 20u);
  EXPECT_EQ(st.breaker_opened, 1u);
  // The cooldown passes: one probe (the 4th request, still 503) reopens it.
  ASSERT_TRUE(troupe::testing::Eventually(
      [&] {
        (void)client->Verify(sample);
        return server_->Count(path) - before == 4;
      },
      10000));
  EXPECT_NE(client->Verify(sample).failure.find("circuit open"), std::string::npos);
  // Next probe succeeds (5th request): closed, samples flow again.
  ASSERT_TRUE(troupe::testing::Eventually([&] { return client->Verify(sample).ok(); }, 10000));
  EXPECT_EQ(server_->Count(path) - before, 5);
  EXPECT_TRUE(client->Verify(sample).ok());
  EXPECT_EQ(server_->Count(path) - before, 6);
}

// on_failure: drop marks what the service could not score as unscored (left
// out of training); zero (the default) keeps it as a 0 reward. Verdicts are
// never unscored, and a wrong request (4xx) does not open the breaker.
TEST_F(RewardClientTest, OnFailureDropMarksUnscoredSamples) {
  RewardClientConfig c;
  RewardServiceConfig down = Service("down", "/status/503/verify?case=drop");
  down.max_attempts = 1;
  down.on_failure = "drop";
  RewardServiceConfig bad = Service("bad", "/status/400/verify?case=drop");
  bad.max_attempts = 1;
  bad.breaker_failures = 2;
  RewardServiceConfig good = Service("good", "/verify?case=drop");
  good.on_failure = "drop";
  c.services = {down, bad, good};
  auto client = Client(c);
  VerifyResult d = client->Verify(Sample("down"));
  EXPECT_TRUE(d.unscored) << d.failure;
  VerifyResult z = client->Verify(Sample("bad"));
  EXPECT_FALSE(z.unscored);
  EXPECT_EQ(z.reward, 0.0);
  VerifyResult v = client->Verify(Sample("good", "xyz"));  // a wrong answer: scored 0
  EXPECT_TRUE(v.ok());
  EXPECT_FALSE(v.unscored);
  for (int i = 0; i < 5; ++i) (void)client->Verify(Sample("bad"));
  EXPECT_EQ(StatsOf(*client, "bad").breaker_opened, 0u);
  EXPECT_EQ(StatsOf(*client, "bad").short_circuited, 0u);
}

TEST_F(RewardClientTest, ManyCallsRunInParallel) {
  RewardClientConfig c;
  c.services = {Service("slowish", "/slow/0.2/verify?parallel")};
  c.default_service = "slowish";
  c.max_concurrency = 32;
  c.call_timeout_ms = 60000;
  c.services[0].timeout_ms = 30000;
  auto client = Client(c);
  std::vector<RewardRequest> batch;
  for (int i = 0; i < 64; ++i) batch.push_back(Sample("", "x", json{{"reward", i / 100.0}}.dump()));
  auto results = client->VerifyBatch(batch);
  ASSERT_EQ(results.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i].failure;
    EXPECT_DOUBLE_EQ(results[i].reward, i / 100.0) << "results keep the input order";
  }
  EXPECT_GE(server_->Stats()["max_inflight"].get<int>(), 2) << "requests overlapped";
  // Many threads sharing one client.
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int k = 0; k < 8; ++k) good += client->Verify(Sample("", "cba")).reward == 1.0;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 64);
  RewardServiceStats s = StatsOf(*client, "slowish");
  EXPECT_EQ(s.samples, 128u);
  EXPECT_EQ(s.ok, 128u);
}

TEST_F(RewardClientTest, ScorerRoutesLocalAndExternalTasks) {
  TaskConfig local;
  local.name = "reverse";
  TaskConfig ext = local;
  ext.name = "reverse_remote";
  ext.kind = "reverse";
  ext.scoring = "external";
  ext.service = "alpha";
  TaskConfig ext_default = ext;
  ext_default.name = "reverse_default";
  ext_default.service.clear();
  TaskConfig episode;
  episode.name = "file_reverse";
  episode.eval_size = 10;
  RewardClientConfig c;
  c.services = {Service("alpha", "/r/0.25/verify"), Service("main", "/verify")};
  c.default_service = "main";
  auto scorer = RewardScorer::Create({local, ext, ext_default, episode}, c);
  ASSERT_TRUE(scorer.ok()) << scorer.status().ToString();
  std::vector<ScoreRequest> batch = {
      {"reverse", "abc=", "cba", "cba", "", ""},
      {"reverse", "abc=", "cab", "cba", "", ""},
      {"reverse_remote", "abc=", "cba", "cba", "", ""},        // task's service alpha
      {"reverse_default", "abc=", "cba", "cba", "", ""},       // default service: exact match
      {"reverse_default", "abc=", "cba", "cba", "alpha", ""},  // the sample names a service
      {"file_reverse", "", "", "cba", "", R"({"episode": {"score": 1}})"},
      {"nope", "", "", "", "", ""},
  };
  // The rollout actor fills `service` from Prompt.service: reverse_remote carries "alpha".
  batch[2].service = "alpha";
  auto results = (*scorer)->ScoreBatch(batch, Deadline::InMs(30000));
  ASSERT_EQ(results.size(), batch.size());
  EXPECT_EQ(results[0].reward, 1.0);
  EXPECT_EQ(results[0].scorer, "reverse");
  EXPECT_EQ(results[1].reward, 0.0);
  EXPECT_TRUE(results[1].ok());
  EXPECT_EQ(results[2].reward, 0.25);
  EXPECT_EQ(results[3].reward, 1.0);
  EXPECT_EQ(results[3].scorer, "http:main");
  EXPECT_EQ(results[4].reward, 0.25);
  EXPECT_EQ(results[5].reward, 1.0);
  EXPECT_FALSE(results[6].ok());
  EXPECT_NE(results[6].failure.find("unknown task 'nope'"), std::string::npos);
  auto stats = (*scorer)->TaskStats();
  EXPECT_EQ(stats["reverse"].samples, 2u);
  EXPECT_EQ(stats["<unknown>"].failures, 1u);
  bool has_service_metric = false;
  for (const auto& [k, v] : (*scorer)->StatsForMetrics())
    has_service_metric |= k == "reward_service.alpha.ok";
  EXPECT_TRUE(has_service_metric);
}

TEST(RewardConfig, RoutingIsValidatedBeforeAnythingRuns) {
  TaskConfig ext;
  ext.name = "r";
  ext.kind = "reverse";
  ext.scoring = "external";
  RewardClientConfig none;
  EXPECT_NE(ValidateRewardRouting({ext}, none).message().find("no reward services"),
            std::string::npos);
  RewardClientConfig c;
  RewardServiceConfig s;
  s.name = "a";
  s.url = "http://127.0.0.1:1/verify";
  c.services = {s};
  EXPECT_NE(ValidateRewardRouting({ext}, c).message().find("no default_service"),
            std::string::npos);
  ext.service = "b";
  EXPECT_NE(ValidateRewardRouting({ext}, c).message().find("service 'b'"), std::string::npos);
  ext.service = "a";
  EXPECT_TRUE(ValidateRewardRouting({ext}, c).ok());
  c.default_service = "zzz";
  EXPECT_NE(c.Validate().message().find("default_service 'zzz'"), std::string::npos);
  c.default_service.clear();
  c.services[0].url = "ftp://x";
  EXPECT_NE(c.Validate().message().find("url 'ftp://x'"), std::string::npos);
  c.services[0].url = "http://x/verify";
  c.services[0].max_attempts = 0;
  EXPECT_NE(c.Validate().message().find("max_attempts = 0"), std::string::npos);
  c.services[0].max_attempts = 1;
  c.services.push_back(c.services[0]);
  EXPECT_NE(c.Validate().message().find("defined twice"), std::string::npos);
}

}  // namespace
}  // namespace troupe::envs
