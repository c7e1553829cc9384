// Multi-node jobs with real daemons on hosts made of network namespaces.
//
// The suite brings up one cluster with tests/multinode/netns-cluster.sh:
//
//   head 10.78.0.1 (this test's network: `troupe run`, the CLI, salloc)
//   h1..h5 10.78.0.11-15: sshd + slurmd, each with its own host name and a
//          private tmpfs over <dir>/private (no shared run folder over ssh)
//   h9: an sshd that accepts no key (a host that refuses)
//   ctl 10.78.0.2: slurmctld + munged
//
// and runs real jobs (configs/multinode_ssh.yaml, configs/multinode_slurm.yaml
// with test overrides) through the ssh and slurm backends: placement, `troupe
// status` nodes, remote logs, scale onto a new host, a refusing host, CURVE
// refusal across nodes, no secret on any command line or log, a stranger
// without keys refused by every socket of a job (training unaffected), a
// network partition, srun steps under salloc and a job submitted with sbatch. Every
// namespace, daemon and process is torn down at the end, also when a test
// fails (a watchdog runs the teardown if this process dies).
//
// Needs root; skips (with the reason) when not root or when network
// namespaces cannot be created. Label `multinode`.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "../common/eventually.h"
#include <nlohmann/json.hpp>

#include "troupe/core/log.h"
#include "troupe/launcher/control_client.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"
#include "troupe/transport/curve.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
std::string SourceDir() {
  return EnvOr("TROUPE_SOURCE_DIR", ".");
}
std::string BuildDir() {
  return EnvOr("TROUPE_BUILD_DIR", "build");
}
std::string Script() {
  return SourceDir() + "/tests/multinode/netns-cluster.sh";
}
std::string Troupe() {
  return fs::absolute(BuildDir() + "/launcher/troupe").string();
}
std::string ActorBinary() {
  return fs::absolute(BuildDir() + "/actors/troupe-actor").string();
}
std::string Probe() {
  return fs::absolute(BuildDir() + "/tests/multinode/multinode_probe").string();
}

struct Cmd {
  int code = -1;
  std::string out;
};

// Runs argv to completion (bounded), capturing stdout+stderr.
Cmd RunCmd(const std::vector<std::string>& argv, int timeout_ms = 60000,
        const std::map<std::string, std::string>& env = {}) {
  static int counter = 0;
  std::string out = ::testing::TempDir() + "multinode-cmd." + std::to_string(::getpid()) + "." +
                    std::to_string(counter++);
  ::unlink(out.c_str());
  SpawnOptions o;
  o.argv = argv;
  o.env = env;
  o.output_file = out;
  o.term_grace_ms = 1000;
  Cmd c;
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) {
    c.out = p.status().ToString();
    return c;
  }
  auto e = p->Wait(Deadline::InMs(timeout_ms));
  if (!e.ok()) {
    p->Stop();
    c.out = "timed out: ";
  } else if (e->exited) {
    c.code = e->code;
  }
  auto text = ReadFile(out);
  if (text.ok()) c.out += *text;
  ::unlink(out.c_str());
  return c;
}

// The daemons and processes under test answer slowly: poll every 200 ms.
template <typename Pred>
bool Eventually(Pred pred, int timeout_ms) {
  return troupe::testing::Eventually(pred, timeout_ms, 200);
}

std::string Slurp(const std::string& path) {
  auto t = ReadFile(path);
  return t.ok() ? *t : "";
}

// ------------------------------------------------------------------ the cluster

class MultinodeTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) {
      skip_ = "needs root (network namespaces, sshd, slurmd)";
      return;
    }
    std::string probe = "tmnprobe" + std::to_string(::getpid());
    Cmd add = RunCmd({"ip", "netns", "add", probe});
    RunCmd({"ip", "netns", "del", probe}).code;
    if (add.code != 0) {
      skip_ = "network namespaces are not available here: " + add.out;
      return;
    }
    for (const char* tool : {"/usr/sbin/sshd", "/usr/sbin/slurmd", "/usr/sbin/slurmctld",
                             "/usr/sbin/munged", "/usr/bin/srun", "/usr/bin/nsenter"}) {
      if (::access(tool, X_OK) != 0) {
        error_ = std::string(tool) + " is missing (scripts/install-deps.sh installs it)";
        return;
      }
    }
    dir_ = fs::absolute(::testing::TempDir() + "multinode." + std::to_string(::getpid())).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Cmd up = RunCmd({Script(), "up", dir_, "--hosts", "h1 h2 h3 h4 h5", "--refusing", "h9", "--slurm",
                  "--private", dir_ + "/private", "--watch", std::to_string(::getpid())},
                 180000);
    std::cout << up.out << std::flush;
    if (up.code != 0) {
      error_ = "netns-cluster.sh up failed: " + up.out;
      return;
    }
    std::ifstream env(dir_ + "/cluster.env");
    for (std::string line; std::getline(env, line);) {
      auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string v = line.substr(eq + 1);
      if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
      env_[line.substr(0, eq)] = v;
    }
    // This process joins the launch node's network: `troupe run`, salloc and the
    // CLI calls below all start there, like on a login node.
    root_ns_ = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int head_ns = ::open(("/run/netns/" + env_["TAG"] + "-head").c_str(), O_RDONLY | O_CLOEXEC);
    if (root_ns_ < 0 || head_ns < 0 || ::setns(head_ns, CLONE_NEWNET) != 0) {
      error_ = "cannot join the head's network namespace";
    }
    if (head_ns >= 0) ::close(head_ns);
  }

  static void TearDownTestSuite() {
    if (root_ns_ >= 0) {
      if (::setns(root_ns_, CLONE_NEWNET) != 0) std::cerr << "cannot return to the root netns\n";
      ::close(root_ns_);
      root_ns_ = -1;
    }
    if (dir_.empty()) return;
    Cmd down = RunCmd({Script(), "down", dir_}, 120000);
    std::cout << down.out << std::flush;
    EXPECT_EQ(down.code, 0) << down.out;
    // Nothing of ours is left: no namespace with our tag.
    Cmd list = RunCmd({"ip", "netns", "list"});
    if (!env_["TAG"].empty()) {
      EXPECT_EQ(list.out.find(env_["TAG"]), std::string::npos) << list.out;
    }
    if (!::testing::Test::HasFailure() && EnvOr("TROUPE_KEEP_MULTINODE", "") != "1")
      fs::remove_all(dir_);
  }

 protected:
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(error_.empty()) << error_;
    std::cout << "cluster " << env_["TAG"] << " in " << dir_ << "\n";
  }

  static std::string Addr(const std::string& host) { return env_["ADDR_" + host]; }
  static std::string Ns(const std::string& host) { return env_["TAG"] + "-" + host; }
  static std::map<std::string, std::string> SlurmEnv() {
    return {{"SLURM_CONF", env_["SLURM_CONF"]}};
  }

  // Runs argv inside `host` (its network, host name and mounts).
  static Cmd InHost(const std::string& host, std::vector<std::string> argv, int timeout_ms = 30000) {
    std::vector<std::string> a = {Script(), "exec", dir_, host};
    a.insert(a.end(), argv.begin(), argv.end());
    return RunCmd(a, timeout_ms);
  }

  // "pid cmdline" of every troupe-actor process in `host`'s network namespace.
  static std::vector<std::string> ActorsIn(const std::string& host) {
    std::vector<std::string> out;
    Cmd pids = RunCmd({"ip", "netns", "pids", Ns(host)});
    std::istringstream in(pids.out);
    for (std::string pid; in >> pid;) {
      std::string cmd = Slurp("/proc/" + pid + "/cmdline");
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      if (cmd.find("troupe-actor") != std::string::npos) out.push_back(pid + " " + cmd);
    }
    return out;
  }
  static std::vector<std::string> ActorsAnywhere() {
    std::vector<std::string> out;
    for (const char* h : {"h1", "h2", "h3", "h4", "h5", "h9", "head"})
      for (auto& a : ActorsIn(h)) out.push_back(std::string(h) + ": " + a);
    return out;
  }

  // The hosts as the ssh config lists them (h9 first: it refuses every key).
  static std::string SshHosts() {
    std::string s = "[";
    for (const char* h : {"h9", "h1", "h2", "h3", "h4", "h5"}) {
      s += std::string(s.size() > 1 ? ", " : "") + "{name: " + h + ", address: " + Addr(h) +
           (std::string(h) == "h4" ? ", resources: [gpu]" : "") + "}";
    }
    return s + "]";
  }

  // Overrides that turn a config/ file into a short test job on this cluster.
  static std::vector<std::string> QuickJob() {
    return {"warm_start.steps=100",
            "eval.every_steps=0",
            "eval.prompts=20",
            "stop.target_accuracy=0",
            "checkpoint.every_steps=10",
            "checkpoint.ack=trained",
            "head.heartbeat_interval_ms=300",
            "head.register_timeout_ms=60000",
            "cluster.actor_binary=" + ActorBinary()};
  }

  static inline std::string skip_, error_, dir_;
  static inline std::map<std::string, std::string> env_;
  static inline int root_ns_ = -1;
};

// ------------------------------------------------------------------ a job

class Job {
 public:
  Job(std::string runs, std::vector<std::string> argv, std::map<std::string, std::string> env = {})
      : runs_(std::move(runs)) {
    fs::create_directories(runs_);
    SpawnOptions o;
    o.argv = std::move(argv);
    o.env = std::move(env);
    o.env["OMP_WAIT_POLICY"] = "PASSIVE";
    o.env["OMP_NUM_THREADS"] = "1";
    o.output_file = runs_ + "/troupe-run.out";
    o.term_grace_ms = 20000;
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) proc_.emplace(std::move(p).value());
  }

  std::string output() const { return Slurp(runs_ + "/troupe-run.out"); }

  // Waits for the head to write its run folder; false when it did not.
  bool WaitStarted(int timeout_ms = 60000) {
    bool ok = Eventually(
        [&] {
          auto r = ResolveRunDir(runs_, "");
          if (!r.ok() || !ReadHeadInfo(*r).ok()) return !Running();
          run_ = *r;
          return true;
        },
        timeout_ms);
    return ok && !run_.path.empty();
  }
  bool Running() { return proc_ && !proc_->Poll(); }
  const RunDir& run() const { return run_; }

  ControlResult Status() {
    auto r = SendControl(run_, "status", Deadline::InMs(5000));
    return r.ok() ? *r : ControlResult{};
  }
  const ActorStatus* Find(const ControlResult& st, const std::string& id) {
    for (auto& a : st.actors)
      if (a.id == id) return &a;
    return nullptr;
  }
  // Waits until `ids` are all ready; returns the last status.
  bool WaitReady(const std::vector<std::string>& ids, int timeout_ms, ControlResult* last) {
    return Eventually(
        [&] {
          *last = Status();
          for (auto& id : ids) {
            auto* a = Find(*last, id);
            if (!a || (a->state != "ready" && a->state != "busy")) return false;
          }
          return true;
        },
        timeout_ms);
  }
  double Step() {
    auto st = Status();
    auto it = st.progress.find("step");
    return it == st.progress.end() ? 0 : it->second;
  }
  bool WaitStep(double step, int timeout_ms) {
    return Eventually([&] { return Step() >= step; }, timeout_ms);
  }

  std::optional<ExitInfo> Wait(int timeout_ms) {
    if (!proc_) return std::nullopt;
    auto e = proc_->Wait(Deadline::InMs(timeout_ms));
    if (!e.ok()) return std::nullopt;
    return *e;
  }

  json Summary() const {
    std::ifstream in(run_.metrics());
    json last;
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("kind", "") == "job_summary") last = j;
    }
    return last;
  }
  std::map<std::string, double> FinalOf(const std::string& actor) const {
    std::ifstream in(run_.metrics());
    std::map<std::string, double> out;
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || j.value("kind", "") != "final" || j.value("actor", "") != actor)
        continue;
      for (auto& [k, v] : j.items())
        if (v.is_number()) out[k] = v.get<double>();
    }
    return out;
  }

 private:
  std::string runs_;
  std::optional<Subprocess> proc_;
  RunDir run_;
};

// generated = trained + skipped + dropped_* + in_flight + lost_*, and the head's checks pass.
void ExpectAccounting(const json& summary) {
  ASSERT_TRUE(summary.contains("accounting")) << summary.dump();
  auto a = summary["accounting"];
  auto get = [&](const char* k) { return a.contains(k) ? a[k].get<double>() : 0.0; };
  double rhs = 0;
  for (const char* t : {"trained", "skipped", "dropped_stale", "dropped_invalid",
                        "dropped_unscored", "in_flight", "lost_with_actor", "lost_with_learner"})
    rhs += get(t);
  EXPECT_TRUE(summary.value("accounting_holds", false)) << summary.dump();
  EXPECT_GT(get("generated"), 0) << a.dump();
  EXPECT_GT(get("trained"), 0) << a.dump();
  EXPECT_NEAR(get("generated"), rhs, 0.5) << "accounting invariant broken: " << a.dump();
}

// Lines of `text` matching `re`.
std::vector<std::smatch> Matches(const std::string& text, const std::string& re) {
  std::vector<std::smatch> out;
  std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator();
       ++it)
    out.push_back(*it);
  return out;
}

// ------------------------------------------------------------------ ssh

// Rollout on two hosts, reward on a third, the learner on a fourth (the only
// one tagged gpu); a host that refuses is reported and avoided; `troupe scale`
// puts a new rollout actor on a fifth host; remote logs reach the head; every
// socket is CURVE-encrypted and a client without the job's key is refused.
TEST_F(MultinodeTest, SshPlacesScalesOntoANewHostAndRefusesKeylessClients) {
  std::string runs = dir_ + "/private/ssh-runs";  // hosts see an empty tmpfs here
  std::vector<std::string> argv = {Troupe(), "--runs-dir", runs, "run",
                                   SourceDir() + "/configs/multinode_ssh.yaml"};
  std::vector<std::string> sets = QuickJob();
  sets.insert(sets.end(), {"cluster.hosts=" + SshHosts(), "cluster.ssh_config=" + dir_ + "/ssh/ssh_config",
                           "rollout.hosts=[h9, h1, h2, h5]",
                           "reward.hosts=[h3]", "stop.max_steps=100000", "stop.max_seconds=240"});
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Job job(runs, argv);
  ASSERT_TRUE(job.WaitStarted()) << job.output();
  ControlResult st;
  ASSERT_TRUE(job.WaitReady({"learner-0", "reward-0", "rollout-0", "rollout-1"}, 120000, &st))
      << FormatStatusTable(st) << job.output();
  std::cout << FormatStatusTable(st);
  // Placement, as `troupe status` shows it (the node each actor reported itself).
  EXPECT_EQ(job.Find(st, "learner-0")->node, "h4");
  EXPECT_EQ(job.Find(st, "reward-0")->node, "h3");
  std::set<std::string> rollout_nodes = {job.Find(st, "rollout-0")->node,
                                         job.Find(st, "rollout-1")->node};
  EXPECT_EQ(rollout_nodes, (std::set<std::string>{"h1", "h2"}));
  // h9 refused (no key accepted): reported with ssh's own words, the actor went elsewhere.
  std::string head_log = Slurp(job.run().logs() + "/head.log");
  EXPECT_NE(head_log.find("could not start it on h9: root@" + Addr("h9") +
                          ": Permission denied (publickey)."),
            std::string::npos)
      << head_log;
  // Every actor is a real process on its host, and only there.
  EXPECT_EQ(ActorsIn("h3").size(), 1u);
  EXPECT_EQ(ActorsIn("h4").size(), 1u);
  EXPECT_TRUE(ActorsIn("h5").empty());
  EXPECT_TRUE(ActorsIn("h9").empty());
  ASSERT_TRUE(job.WaitStep(2, 120000)) << job.output();

  // Scale onto the fifth host while the job runs.
  Cmd scale = RunCmd({Troupe(), "--runs-dir", runs, "scale", "rollout=3"});
  ASSERT_EQ(scale.code, 0) << scale.out;
  EXPECT_NE(scale.out.find("scaled rollout from 2 to 3"), std::string::npos) << scale.out;
  ASSERT_TRUE(job.WaitReady({"rollout-2"}, 120000, &st)) << FormatStatusTable(st);
  EXPECT_EQ(job.Find(st, "rollout-2")->node, "h5");
  EXPECT_EQ(ActorsIn("h5").size(), 1u);
  ASSERT_TRUE(Eventually(
      [&] {
        auto s = job.Status();
        auto* a = job.Find(s, "rollout-2");
        return a && a->stats.count("generated") && a->stats.at("generated") > 0;
      },
      120000))
      << "rollout-2 on h5 never generated";
  Cmd status = RunCmd({Troupe(), "--runs-dir", runs, "status"});
  std::cout << status.out;
  EXPECT_NE(status.out.find("h5"), std::string::npos);

  // Logs of remote actors stream to the head (the hosts do not share the run folder).
  EXPECT_FALSE(InHost("h5", {"test", "-e", job.run().log_file("rollout-2")}).code == 0)
      << "h5 must not see the head's run folder";
  EXPECT_EQ(InHost("h5", {"test", "-s", job.run().config()}).code, 0)
      << "rollout-2 wrote the config it received on stdin";
  Cmd logs = RunCmd({Troupe(), "--runs-dir", runs, "logs", "rollout-2"});
  EXPECT_EQ(logs.code, 0);
  EXPECT_NE(logs.out.find("[rollout-2] rollout: rollout actor up"), std::string::npos) << logs.out;

  // CURVE across nodes, probed from h5 with the real CLI and three sets of keys.
  auto curve = json::parse(Slurp(job.run().secrets() + "/curve.json"), nullptr, false);
  ASSERT_FALSE(curve.is_discarded());
  auto probe = [&](const std::string& name, const json* secrets) {
    std::string d = dir_ + "/probe/" + name;
    fs::create_directories(d + "/secrets");
    fs::copy_file(job.run().head_file(), d + "/head.json", fs::copy_options::overwrite_existing);
    if (secrets) {
      std::ofstream(d + "/secrets/curve.json") << secrets->dump();
    }
    return InHost("h5", {Troupe(), "--runs-dir", dir_ + "/probe", "status", name}, 30000);
  };
  Cmd keyed = probe("keyed", &curve);
  EXPECT_EQ(keyed.code, 0) << keyed.out;
  EXPECT_NE(keyed.out.find("rollout-2"), std::string::npos) << keyed.out;
  Cmd keyless = probe("keyless", nullptr);
  EXPECT_NE(keyless.code, 0) << "a client without CURVE keys got an answer: " << keyless.out;
  auto stranger = transport::GenerateCurveKeyPair();
  ASSERT_TRUE(stranger.ok());
  json wrong = curve;
  wrong["client_public"] = stranger->public_key;
  wrong["client_secret"] = stranger->secret_key;
  Cmd refused = probe("wrong-key", &wrong);
  EXPECT_NE(refused.code, 0) << "a client with another key got an answer: " << refused.out;
  ASSERT_TRUE(Eventually(
      [&] {
        return Slurp(job.run().logs() + "/head.log")
                   .find("refused a client from " + Addr("h5") + ": client key not allowed") !=
               std::string::npos;
      },
      10000))
      << "the head did not log the refused key";

  // The keys never appear on a command line (any process on the machine) or in a log.
  std::vector<std::string> keys = {curve.value("server_secret", ""),
                                   curve.value("client_secret", "")};
  for (auto& k : keys) ASSERT_EQ(k.size(), 40u);
  for (auto& e : fs::directory_iterator("/proc")) {
    std::string cmd = Slurp(e.path().string() + "/cmdline");
    for (auto& k : keys) EXPECT_EQ(cmd.find(k), std::string::npos) << e.path() << ": " << cmd;
  }

  // Stop the job: the learner checkpoints, every actor drains and exits.
  Cmd stop = RunCmd({Troupe(), "--runs-dir", runs, "stop", "--wait", "0"}, 30000);
  EXPECT_EQ(stop.code, 0) << stop.out;
  auto e = job.Wait(120000);
  ASSERT_TRUE(e.has_value()) << job.output();
  EXPECT_TRUE(e->exited && e->code == 0) << e->ToString() << job.output();
  auto summary = job.Summary();
  EXPECT_TRUE(summary.value("stopped", false)) << summary.dump();
  ExpectAccounting(summary);
  EXPECT_TRUE(ActorsAnywhere().empty()) << ActorsAnywhere()[0];
  for (const auto& f : fs::recursive_directory_iterator(job.run().path)) {
    if (!f.is_regular_file() || f.path().parent_path().filename() == "secrets") continue;
    std::string text = Slurp(f.path().string());
    for (auto& k : keys) EXPECT_EQ(text.find(k), std::string::npos) << "key in " << f.path();
  }
  for (const auto& f : fs::directory_iterator(dir_ + "/logs")) {
    std::string text = Slurp(f.path().string());
    for (auto& k : keys) EXPECT_EQ(text.find(k), std::string::npos) << "key in " << f.path();
  }
}

// A stranger on the network: from h5, a host that is not part of the job, a
// client without the job's keys tries every endpoint the job exposes — the
// head, the learner's data and weight-broadcast control sockets, both rollout
// actors' weight data sockets (the chain), the reward actor — three ways each:
// raw garbage over TCP, a plain ZeroMQ client sending well-formed Troupe
// messages (a Register under a real actor's name, a valid-looking weight chunk
// "from the learner") and garbage frames, and a CURVE client that knows the
// server's public key but not the job's client key. Nothing gets in; each
// refusal is counted by the socket it hit (logged by its owner: the handshake
// failure on that endpoint, the ZAP denial of the unknown key), and training is
// unaffected: every rollout actor holds the learner's bytes (the stream checksum
// it verified after the probes equals the learner's for the same version).
TEST_F(MultinodeTest, UnauthenticatedPeersAreRefusedEverywhereAndTrainingIsUnaffected) {
  std::string runs = dir_ + "/private/stranger-runs";
  std::vector<std::string> argv = {Troupe(), "--runs-dir", runs, "run",
                                   SourceDir() + "/configs/multinode_ssh.yaml"};
  std::vector<std::string> sets = QuickJob();
  sets.insert(sets.end(),
              {"cluster.hosts=" + SshHosts(), "cluster.ssh_config=" + dir_ + "/ssh/ssh_config",
               "rollout.hosts=[h1, h2]", "reward.hosts=[h3]", "broadcast.checksum=true",
               "stop.max_steps=100000", "stop.max_seconds=300"});
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Job job(runs, argv);
  ASSERT_TRUE(job.WaitStarted()) << job.output();
  ControlResult st;
  const std::vector<std::string> actors = {"learner-0", "reward-0", "rollout-0", "rollout-1"};
  ASSERT_TRUE(job.WaitReady(actors, 120000, &st)) << FormatStatusTable(st) << job.output();
  ASSERT_EQ(job.Find(st, "learner-0")->node, "h4");
  ASSERT_TRUE(job.WaitStep(2, 120000)) << job.output();
  auto log = [&](const std::string& id) { return Slurp(job.run().logs() + "/" + id + ".log"); };

  // Every endpoint the job exposes, as its owner announced it.
  struct Target {
    std::string owner, what, endpoint;
  };
  std::vector<Target> targets;
  auto head = ReadHeadInfo(job.run());
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  targets.push_back({"head", "head control", head->endpoint});
  auto find = [&](const std::string& owner, const std::string& what, const std::string& in,
                  const std::string& re) {
    std::string ep;
    EXPECT_TRUE(Eventually(
        [&] {
          auto m = Matches(log(in), re);
          if (!m.empty()) ep = m[0][1].str();
          return !ep.empty();
        },
        30000))
        << "no line /" << re << "/ in " << in << ".log";
    targets.push_back({owner, what, ep});
  };
  find("learner-0", "learner data", "reward-0", "learner at (tcp://[0-9.]+:[0-9]+)");
  find("learner-0", "weight broadcast control", "learner-0",
       "weights sender learner-0 on (tcp://[0-9.]+:[0-9]+)");
  for (const char* r : {"rollout-0", "rollout-1"})
    find(r, "weight chain data", r,
         std::string("weights receiver ") + r + " \\(data (tcp://[0-9.]+:[0-9]+)\\)");
  find("reward-0", "reward data", "reward-0", "reward actor serving at (tcp://[0-9.]+:[0-9]+)");
  ASSERT_FALSE(HasFailure());
  auto curve = json::parse(Slurp(job.run().secrets() + "/curve.json"), nullptr, false);
  ASSERT_FALSE(curve.is_discarded());
  const std::string server_key = curve.value("server_public", "");
  ASSERT_EQ(server_key.size(), 40u);

  // The stranger tries them all.
  std::vector<std::string> probe = {Probe(), "--server-key", server_key};
  for (const auto& t : targets) probe.push_back(t.endpoint);
  Cmd tried = InHost("h5", probe, 180000);
  std::cout << tried.out;
  ASSERT_EQ(tried.code, 0) << tried.out;
  auto lines = Matches(tried.out, "PROBE (\\S+) (raw|plain|curve) (\\S+)");
  EXPECT_EQ(lines.size(), targets.size() * 3) << tried.out;
  for (const auto& m : lines)
    EXPECT_NE(m[3].str(), "accepted") << m[2] << " client got into " << m[1];

  // Each refusal is counted by the socket it hit: its owner's transport logs the refused
  // handshake naming that endpoint, and its ZAP handler the unknown client key (log lines
  // are rate-limited per process: a probe is repeated until its line is there).
  for (const auto& t : targets) {
    const std::string owner_log = t.owner == "head" ? "head" : t.owner;
    const std::string refused = t.endpoint + ": refused a connection (handshake failed";
    const std::string denied = "refused a client from " + Addr("h5") + ": client key not allowed";
    EXPECT_TRUE(Eventually(
        [&] {
          std::string text = log(owner_log);
          if (text.find(refused) != std::string::npos && text.find(denied) != std::string::npos)
            return true;
          InHost("h5", {Probe(), "--server-key", server_key, "--wait-ms", "500", t.endpoint},
                 30000);
          return false;
        },
        60000))
        << t.what << " (" << t.endpoint << "): no refusal counted in " << owner_log << ".log";
    if (t.owner != "head") {
      // The counter reaches the head with the owner's next heartbeat, which can come after
      // the log line: wait for it (bounded).
      double failures = 0;
      EXPECT_TRUE(Eventually(
          [&] {
            ControlResult now = job.Status();
            auto* a = job.Find(now, t.owner);
            if (a && a->stats.count("transport.handshake_failures"))
              failures = a->stats.at("transport.handshake_failures");
            return failures > 0;
          },
          20000))
          << t.owner << ": transport.handshake_failures still " << failures
          << " in its heartbeats after the refusal was logged";
    }
  }
  // Nothing reached the broadcast: it never had to refuse a message itself.
  for (const auto& id : actors) {
    std::string text = log(id);
    EXPECT_EQ(text.find("refused a message"), std::string::npos) << id;
    EXPECT_EQ(text.find("rejected version"), std::string::npos) << id;
  }

  // Training is unaffected: after the probes, each rollout actor holds exactly the bytes the
  // learner sent (the stream checksum it verified equals the learner's for the same version).
  uint64_t after = 0;
  ControlResult now = job.Status();
  for (const char* r : {"rollout-0", "rollout-1"}) {
    auto* a = job.Find(now, r);
    ASSERT_NE(a, nullptr);
    after = std::max(after, a->policy_version);
  }
  std::map<uint64_t, std::string> sent;  // version -> learner's stream checksum
  const std::string sent_re =
      "version ([0-9]+) reached [0-9]+ member\\(s\\): stream checksum ([0-9a-f]+)";
  const std::string held_re =
      "holding version ([0-9]+): stream checksum ([0-9a-f]+) \\(verified\\)";
  uint64_t common = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        for (const auto& m : Matches(log("learner-0"), sent_re))
          sent[std::stoull(m[1].str())] = m[2].str();
        std::map<uint64_t, int> held;  // versions both rollouts verified, after the probes
        for (const char* r : {"rollout-0", "rollout-1"})
          for (const auto& m : Matches(log(r), held_re)) {
            uint64_t v = std::stoull(m[1].str());
            auto it = sent.find(v);
            if (v <= after || it == sent.end()) continue;
            EXPECT_EQ(m[2].str(), it->second) << r << " holds other bytes at version " << v;
            ++held[v];
          }
        for (const auto& [v, n] : held)
          if (n == 2) common = v;
        return common != 0;
      },
      180000))
      << "no version after " << after << " traced by the learner and both rollout actors";
  std::cout << "version " << common << ": rollout-0, rollout-1 and the learner agree on stream "
            << "checksum " << sent[common] << "\n";

  Cmd stop = RunCmd({Troupe(), "--runs-dir", runs, "stop", "--wait", "0"}, 30000);
  EXPECT_EQ(stop.code, 0) << stop.out;
  auto e = job.Wait(120000);
  ASSERT_TRUE(e.has_value()) << job.output();
  EXPECT_TRUE(e->exited && e->code == 0) << e->ToString() << job.output();
  ExpectAccounting(job.Summary());
  EXPECT_TRUE(ActorsAnywhere().empty()) << ActorsAnywhere()[0];
}

// Cutting a host's link: its actor is marked lost within the heartbeat
// timeout and replaced on another host; restoring the link brings back no
// duplicate actor and no batch is trained twice; the job completes with the
// accounting invariant intact.
TEST_F(MultinodeTest, PartitionedHostIsReplacedAndRestoringItDuplicatesNothing) {
  std::string runs = dir_ + "/private/partition-runs";
  const int hb_timeout_ms = 3000;
  std::vector<std::string> argv = {Troupe(), "--runs-dir", runs, "run",
                                   SourceDir() + "/configs/multinode_ssh.yaml"};
  std::vector<std::string> sets = QuickJob();
  sets.insert(sets.end(),
              {"cluster.hosts=" + SshHosts(), "cluster.ssh_config=" + dir_ + "/ssh/ssh_config",
               "rollout.hosts=[h1, h2]", "reward.hosts=[h3, h5]",
               "reward.restart_backoff_ms=200",
               "head.heartbeat_timeout_ms=" + std::to_string(hb_timeout_ms),
               // The cut-off actor must still be alive when the link comes back.
               "head.head_grace_ms=120000", "stop.max_steps=100000", "stop.max_seconds=60"});
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Job job(runs, argv);
  ASSERT_TRUE(job.WaitStarted()) << job.output();
  ControlResult st;
  ASSERT_TRUE(job.WaitReady({"learner-0", "reward-0", "rollout-0", "rollout-1"}, 120000, &st))
      << FormatStatusTable(st) << job.output();
  ASSERT_EQ(job.Find(st, "reward-0")->node, "h3");
  ASSERT_TRUE(job.WaitStep(2, 120000)) << job.output();
  auto before = ActorsIn("h3");
  ASSERT_EQ(before.size(), 1u);

  Cmd cut = RunCmd({Script(), "cut", dir_, "h3"});
  ASSERT_EQ(cut.code, 0) << cut.out;
  std::cout << "cut h3 at step " << job.Step() << "\n";
  // The head marks it lost by the heartbeat timeout and restarts it elsewhere.
  ASSERT_TRUE(Eventually(
      [&] {
        st = job.Status();
        auto* a = job.Find(st, "reward-0");
        return a && a->restarts >= 1 && a->state == "ready" && a->node == "h5";
      },
      120000))
      << FormatStatusTable(st) << Slurp(job.run().logs() + "/head.log");
  std::string head_log = Slurp(job.run().logs() + "/head.log");
  auto lost = Matches(head_log, "reward-0 lost: no heartbeat for ([0-9]+) ms");
  ASSERT_EQ(lost.size(), 1u) << head_log;
  int silent_ms = std::stoi(lost[0][1].str());
  EXPECT_GE(silent_ms, hb_timeout_ms);
  EXPECT_LT(silent_ms, hb_timeout_ms + 3000) << "lost later than the heartbeat timeout";
  // The cut-off incarnation is still running on h3: the interesting case.
  EXPECT_EQ(ActorsIn("h3").size(), 1u) << "the cut-off actor exited before the link came back";
  double step_at_restore = job.Step();

  Cmd restore = RunCmd({Script(), "restore", dir_, "h3"});
  ASSERT_EQ(restore.code, 0) << restore.out;
  // The old incarnation is told to shut down (or killed by the retried stop): gone.
  ASSERT_TRUE(Eventually([&] { return ActorsIn("h3").empty(); }, 60000))
      << ActorsIn("h3")[0] << "\n"
      << Slurp(job.run().logs() + "/head.log");
  // One actor per id, the reward actor on h5 only.
  st = job.Status();
  std::set<std::string> ids;
  for (auto& a : st.actors) EXPECT_TRUE(ids.insert(a.id).second) << "duplicate " << a.id;
  EXPECT_EQ(st.actors.size(), 4u) << FormatStatusTable(st);
  EXPECT_EQ(ActorsIn("h5").size(), 1u);
  // Training goes on after the link is back.
  EXPECT_TRUE(job.WaitStep(step_at_restore + 2, 120000)) << job.output();

  auto e = job.Wait(180000);
  ASSERT_TRUE(e.has_value()) << job.output();
  EXPECT_TRUE(e->exited && e->code == 0) << e->ToString() << job.output();
  auto summary = job.Summary();
  EXPECT_TRUE(summary.value("completed", false)) << summary.dump();
  ExpectAccounting(summary);
  // The learner saw any re-delivered batch as a duplicate (never trained twice).
  auto learner = job.FinalOf("learner-0");
  std::cout << "learner final: duplicates " << learner["duplicates"] << ", trained "
            << learner["trained"] << "\n";
  head_log = Slurp(job.run().logs() + "/head.log");
  EXPECT_EQ(Matches(head_log, "reward-0 registered \\(node h3").size(), 1u)
      << "the old incarnation registered again after the link came back\n"
      << head_log;
  EXPECT_TRUE(ActorsAnywhere().empty()) << ActorsAnywhere()[0];
}

// ------------------------------------------------------------------ slurm

// Inside an allocation (salloc): every actor is an srun step on its node;
// `troupe scale` adds a step and removes it again.
TEST_F(MultinodeTest, SlurmPlacesActorsAsStepsInsideAnAllocation) {
  std::string runs = dir_ + "/slurm-runs";
  std::vector<std::string> argv = {"salloc", "--nodes=5", "--job-name=troupe-test", Troupe(),
                                   "--runs-dir", runs, "run",
                                   SourceDir() + "/configs/multinode_slurm.yaml"};
  std::vector<std::string> sets = QuickJob();
  sets.insert(sets.end(), {"rollout.hosts=[h1, h2, h5]", "rollout.per_node=1", "reward.hosts=[h3]",
                           "learner.hosts=[h4]", "stop.max_steps=100000", "stop.max_seconds=240"});
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Job job(runs, argv, SlurmEnv());
  ASSERT_TRUE(job.WaitStarted()) << job.output();
  ControlResult st;
  ASSERT_TRUE(job.WaitReady({"learner-0", "reward-0", "rollout-0", "rollout-1"}, 120000, &st))
      << FormatStatusTable(st) << job.output();
  std::cout << FormatStatusTable(st);
  EXPECT_EQ(job.Find(st, "learner-0")->node, "h4");
  EXPECT_EQ(job.Find(st, "reward-0")->node, "h3");
  EXPECT_EQ((std::set<std::string>{job.Find(st, "rollout-0")->node,
                                   job.Find(st, "rollout-1")->node}),
            (std::set<std::string>{"h1", "h2"}));
  auto steps = [&] {
    return RunCmd({"squeue", "-h", "-s", "-o", "%j %N"}, 20000, SlurmEnv()).out;
  };
  std::string s1 = steps();
  for (const char* a : {"troupe:learner-0 h4", "troupe:reward-0 h3", "troupe:rollout-0",
                        "troupe:rollout-1"})
    EXPECT_NE(s1.find(a), std::string::npos) << a << " not in\n" << s1;
  ASSERT_TRUE(job.WaitStep(2, 120000)) << job.output();

  Cmd up = RunCmd({Troupe(), "--runs-dir", runs, "scale", "rollout=3"});
  ASSERT_EQ(up.code, 0) << up.out;
  ASSERT_TRUE(job.WaitReady({"rollout-2"}, 120000, &st)) << FormatStatusTable(st);
  EXPECT_EQ(job.Find(st, "rollout-2")->node, "h5");
  EXPECT_NE(steps().find("troupe:rollout-2 h5"), std::string::npos);
  Cmd down = RunCmd({Troupe(), "--runs-dir", runs, "scale", "rollout=2"});
  ASSERT_EQ(down.code, 0) << down.out;
  ASSERT_TRUE(Eventually([&] { return steps().find("troupe:rollout-2") == std::string::npos; },
                         60000))
      << steps();
  // The head forgets the actor once it has seen its srun client exit, which
  // can come a moment after the step left squeue.
  EXPECT_TRUE(Eventually([&] { return job.Find(job.Status(), "rollout-2") == nullptr; }, 30000))
      << FormatStatusTable(job.Status());

  Cmd stop = RunCmd({Troupe(), "--runs-dir", runs, "stop", "--wait", "0"}, 30000);
  EXPECT_EQ(stop.code, 0) << stop.out;
  auto e = job.Wait(120000);
  ASSERT_TRUE(e.has_value()) << job.output();
  EXPECT_TRUE(e->exited && e->code == 0) << e->ToString() << job.output();
  ExpectAccounting(job.Summary());
  EXPECT_TRUE(ActorsAnywhere().empty()) << ActorsAnywhere()[0];
}

// `troupe run --submit`: sbatch runs the head on the first node of a new
// allocation; the job completes there by itself.
TEST_F(MultinodeTest, SlurmSubmitRunsTheWholeJobWithSbatch) {
  std::string runs = dir_ + "/submit-runs";
  std::vector<std::string> argv = {Troupe(), "--runs-dir", runs, "run",
                                   SourceDir() + "/configs/multinode_slurm.yaml", "--submit"};
  std::vector<std::string> sets = QuickJob();
  sets.insert(sets.end(), {"stop.max_steps=10", "stop.max_seconds=240", "cluster.sbatch_options=[]"});
  for (auto& s : sets) argv.insert(argv.end(), {"--set", s});
  Cmd submit = RunCmd(argv, 60000, SlurmEnv());
  ASSERT_EQ(submit.code, 0) << submit.out;
  auto m = Matches(submit.out, "as job ([0-9]+) \\(3 nodes\\)");
  ASSERT_EQ(m.size(), 1u) << submit.out;
  std::string id = m[0][1].str();
  ASSERT_TRUE(Eventually(
      [&] {
        return RunCmd({"squeue", "-h", "-j", id, "-o", "%T"}, 20000, SlurmEnv()).out.find_first_not_of(
                   " \n") == std::string::npos;
      },
      300000))
      << "Slurm job " << id << " did not finish";
  auto run = ResolveRunDir(runs, "");
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  std::ifstream in(run->metrics());
  json summary;
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("kind", "") == "job_summary") summary = j;
  }
  EXPECT_TRUE(summary.value("completed", false))
      << summary.dump() << Slurp(run->logs() + "/head.log");
  ExpectAccounting(summary);
  // The head ran on a node of the allocation, not here.
  auto info = ReadHeadInfo(*run);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->host == "h1" || info->host == "h2" || info->host == "h3") << info->host;
  EXPECT_TRUE(ActorsAnywhere().empty()) << ActorsAnywhere()[0];
}

}  // namespace
}  // namespace troupe::launcher
