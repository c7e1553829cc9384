// The head's /metrics scraped by a real Prometheus server (Debian's
// `prometheus`, started here on a free loopback port with a generated config
// and killed by its pid), queried through Prometheus' HTTP API; the live text
// passes `promtool check metrics`. The job: a head with two echo actors
// (real troupe-actor processes heartbeating their transport counters).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "../common/eventually.h"
#include "../common/node_runner.h"
#include "troupe/launcher/head.h"
#include "troupe/launcher/subprocess.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string BuildDir() {
  const char* b = std::getenv("TROUPE_BUILD_DIR");
  return b ? b : "build";
}

// A loopback port nobody listens on now (Prometheus cannot bind port 0 and
// tell us which it got). The race with another process taking it in between
// is accepted: the test then fails naming the port.
int FreePort() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(s);
    return -1;
  }
  ::close(s);
  return ntohs(a.sin_port);
}

void RunChecks(const fs::path& root);

TEST(PrometheusScrape, ARealPrometheusServerScrapesTheHeadAndAnswersQueries) {
  ASSERT_FALSE(FindExecutable("prometheus").empty() || FindExecutable("promtool").empty())
      << "prometheus/promtool not installed (scripts/install-deps.sh installs Debian's prometheus)";
  const fs::path root = fs::path(::testing::TempDir()) / ("prometheus_test." + std::to_string(::getpid()));
  fs::remove_all(root);
  RunChecks(root);
  fs::remove_all(root);  // after the head ended (it writes status.json to the end)
}

void RunChecks(const fs::path& root) {
  auto run = CreateRunDir((root / "runs").string(), "echo");
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  std::ofstream(run->config()) << "name: echo\n";

  HeadOptions o;
  o.job_name = "echo";
  o.run = *run;
  o.spec.heartbeat_interval_ms = 100;
  o.spec.heartbeat_timeout_ms = 3000;
  o.spec.head_grace_ms = 3000;
  o.spec.stop_grace_ms = 5000;
  RoleProcess echo;
  echo.count = 2;
  o.roles["echo"] = echo;
  o.completion_role = "";
  o.actor_binary = BuildDir() + "/actors/troupe-actor";
  TelemetryOptions t;
  t.job_name = "echo";
  t.dashboard.sample_ms = 200;
  o.telemetry = t;
  transport::ZmqNetworkOptions no;
  no.identity.actor_id = "head";
  auto net = transport::NewZmqNetwork(no);
  ASSERT_TRUE(net.ok());
  auto head = Head::Create(o, std::move(net).value(), NewLocalSpawner());
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  std::thread th([&] { (void)(*head)->Run(); });
  struct Stopper {
    std::unique_ptr<Head>& h;
    std::thread& t;
    ~Stopper() {
      h->RequestStop();
      t.join();
    }
  } stopper{*head, th};

  const std::string url = (*head)->dashboard_url();
  ASSERT_FALSE(url.empty());
  const int dash_port = std::stoi(url.substr(url.rfind(':') + 1));
  httplib::Client dash("127.0.0.1", dash_port);
  dash.set_read_timeout(5, 0);
  // Both echo actors registered and heartbeating.
  ASSERT_TRUE(troupe::testing::Eventually(
      [&] {
        auto r = dash.Get("/api/actors");
        if (!r || r->status != 200) return false;
        auto j = json::parse(r->body, nullptr, false);
        int ready = 0;
        for (auto& a : j["actors"]) ready += a["state"] == "ready" && a["last_heartbeat_ns"].get<int64_t>() > 0;
        return ready == 2;
      },
      30000, 100));

  // The live text is lint-clean.
  auto text = dash.Get("/metrics");
  ASSERT_TRUE(text && text->status == 200);
  EXPECT_EQ(text->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  auto lint = troupe::testing::RunProcess({"promtool", "check", "metrics"}, text->body, 60);
  EXPECT_TRUE(lint.ok) << lint.error << lint.out << lint.err << "\n" << text->body;
  EXPECT_EQ(lint.out + lint.err, "");

  // Prometheus, scraping every second.
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const fs::path cfg = root / "prometheus.yml";
  std::ofstream(cfg) << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                     << "scrape_configs:\n  - job_name: troupe\n    metrics_path: /metrics\n"
                     << "    static_configs:\n      - targets: ['127.0.0.1:" << dash_port << "']\n";
  SpawnOptions so;
  so.argv = {"prometheus", "--config.file=" + cfg.string(), "--storage.tsdb.path=" + (root / "tsdb").string(),
             "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"};
  so.output_file = (root / "prometheus.out").string();
  so.term_grace_ms = 5000;
  auto prom = Subprocess::Spawn(so);
  ASSERT_TRUE(prom.ok()) << prom.status().ToString();
  const pid_t prom_pid = prom->pid();
  httplib::Client api("127.0.0.1", port);
  api.set_read_timeout(5, 0);
  json result;
  const bool scraped = troupe::testing::Eventually(
      [&] {
        auto r = api.Get("/api/v1/query?query=troupe_actor_up");
        if (!r || r->status != 200) return false;
        result = json::parse(r->body, nullptr, false);
        return result.is_object() && result["data"]["result"].size() == 2;
      },
      60000, 250);
  auto out = ReadFile(so.output_file);
  ASSERT_TRUE(scraped) << "Prometheus on port " << port << " never had troupe_actor_up: " << result.dump()
                       << "\n" << (out.ok() ? *out : "");
  std::set<std::string> actors;
  for (auto& s : result["data"]["result"]) {
    actors.insert(s["metric"]["actor"].get<std::string>());
    EXPECT_EQ(s["metric"]["job"], "troupe");
    EXPECT_EQ(s["metric"]["role"], "echo");
    EXPECT_EQ(s["value"][1], "1") << s.dump();
  }
  EXPECT_EQ(actors, std::set<std::string>({"echo-0", "echo-1"}));
  // Heartbeat figures, transport counters included, are series too.
  auto sent = api.Get("/api/v1/query?query=troupe_actor_stat%7Bstat%3D%22transport.messages_sent%22%7D");
  ASSERT_TRUE(sent && sent->status == 200);
  auto sj = json::parse(sent->body);
  ASSERT_EQ(sj["data"]["result"].size(), 2u) << sj.dump();
  EXPECT_GT(std::stod(sj["data"]["result"][0]["value"][1].get<std::string>()), 0);
  // The scrape itself was healthy.
  auto up = api.Get("/api/v1/query?query=up%7Bjob%3D%22troupe%22%7D");
  ASSERT_TRUE(up && up->status == 200);
  EXPECT_EQ(json::parse(up->body)["data"]["result"][0]["value"][1], "1");
  prom->Stop();
  EXPECT_NE(::kill(prom_pid, 0), 0) << "prometheus outlived the test";
}

}  // namespace
}  // namespace troupe::launcher
