// Shared helpers of the end-to-end tests: a `troupe run` job in a private runs
// folder, what its run folder says (metrics.jsonl records), and the accounting
// check. Header-only; each e2e test binary includes it once.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../common/eventually.h"

#include "troupe/launcher/control_client.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher::e2e {

inline std::string BuildDir() {
  const char* b = std::getenv("TROUPE_BUILD_DIR");
  return b ? b : "build";
}
inline std::string SourceDir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  return s ? s : ".";
}

using troupe::testing::Eventually;

inline bool Alive(int pid) {
  return pid > 0 && ::kill(pid, 0) == 0;
}

// A fresh, empty folder under the test temp dir.
inline std::filesystem::path TestDir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::path(::testing::TempDir()) / ("e2e." + name + "." + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Settings every e2e job shares: short, bounded by updates (never by wall
// time), frequent checkpoints (so restarts resume recently), quick liveness and
// restarts; `more` is appended (later keys win).
inline std::vector<std::string> Short(int max_steps, std::vector<std::string> more = {}) {
  std::vector<std::string> s = {"stop.max_steps=" + std::to_string(max_steps),
                                "stop.target_accuracy=0",
                                "stop.max_seconds=0",
                                "eval.every_steps=10",
                                "checkpoint.every_steps=10",
                                "head.heartbeat_interval_ms=200",
                                "head.heartbeat_timeout_ms=4000",
                                "head.head_grace_ms=4000",
                                "rollout.restart_backoff_ms=100",
                                "reward.restart_backoff_ms=100",
                                "learner.restart_backoff_ms=100"};
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

// One `troupe run configs/<config>` (or an absolute config path) with --set overrides, in
// `dir`/runs. The destructor stops it and checks that no actor it saw outlived it.
class Job {
 public:
  Job(const std::string& config, const std::vector<std::string>& sets, std::filesystem::path dir)
      : dir_(std::move(dir)) {
    SpawnOptions o;
    o.argv = {BuildDir() + "/launcher/troupe", "--runs-dir", runs(), "run",
              config.rfind('/', 0) == 0 ? config : SourceDir() + "/configs/" + config};
    for (const auto& s : sets) {
      o.argv.push_back("--set");
      o.argv.push_back(s);
    }
    o.output_file = (dir_ / "troupe.out").string();
    o.term_grace_ms = 20000;
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) proc_ = std::make_unique<Subprocess>(std::move(p).value());
  }
  ~Job() {
    if (proc_) proc_->Stop();
    // Whatever a test killed the head for: no actor may survive it.
    for (int pid : pids_) {
      if (Alive(pid)) {
        ADD_FAILURE() << "actor pid " << pid << " survived the test";
        ::kill(pid, SIGKILL);
      }
    }
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_);
  }
  std::string runs() const { return (dir_ / "runs").string(); }
  Subprocess& proc() { return *proc_; }
  Result<RunDir> run() const { return ResolveRunDir(runs(), ""); }

  // Waits until the head answers and `pred(status)` holds; false at once if
  // `troupe run` has already ended (nothing more will happen).
  bool WaitStatus(const std::function<bool(const ControlResult&)>& pred, int timeout_ms) {
    bool ended = false;
    const bool ok = Eventually(
        [&] {
          if (proc_ && proc_->Poll()) return ended = true;
          auto r = run();
          if (!r.ok() || !std::filesystem::exists(r->head_file())) return false;
          auto st = SendControl(*r, "status", Deadline::InMs(2000));
          if (!st.ok()) return false;
          for (auto& a : st->actors)
            if (a.pid > 0) pids_.insert(a.pid);
          return pred(*st);
        },
        timeout_ms);
    return ok && !ended;
  }
  int PidOf(const std::string& id) {
    int pid = 0;
    WaitStatus(
        [&](const ControlResult& st) {
          for (auto& a : st.actors)
            if (a.id == id && a.state == "ready" && Alive(a.pid)) pid = a.pid;
          return pid > 0;
        },
        120000);
    return pid;
  }
  ExitInfo Wait(int timeout_ms) {
    if (!proc_) return {};
    auto e = proc_->Wait(Deadline::InMs(timeout_ms));
    EXPECT_TRUE(e.ok()) << "troupe run did not finish: " << e.status().ToString() << "\n"
                        << Output();
    return e.ok() ? *e : ExitInfo{};
  }
  std::string Output() const {
    auto t = ReadFile((dir_ / "troupe.out").string());
    return t.ok() ? *t : "";
  }
  std::vector<nlohmann::json> Metrics(const std::string& kind) const {
    std::vector<nlohmann::json> out;
    auto r = run();
    if (!r.ok()) return out;
    std::ifstream in(r->metrics());
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("kind", "") == kind) out.push_back(j);
    }
    return out;
  }
  // The "final" records of the actors whose id starts with `prefix`.
  std::vector<nlohmann::json> Finals(const std::string& prefix) const {
    std::vector<nlohmann::json> out;
    for (auto& j : Metrics("final"))
      if (j.value("actor", "").rfind(prefix, 0) == 0) out.push_back(j);
    return out;
  }
  std::set<int>& pids() { return pids_; }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<Subprocess> proc_;
  std::set<int> pids_;
};

// A helper process that prints "PORT N" once it listens (troupe-reward-server, the reference
// agent server): spawned with its output in `output_file`, waited for (bounded, 30 s), and
// killed by pid when it goes out of scope. port() is 0 if it never announced one.
class PortedServer {
 public:
  PortedServer(std::vector<std::string> argv, std::string output_file)
      : out_(std::move(output_file)) {
    SpawnOptions o;
    o.argv = std::move(argv);
    o.output_file = out_;
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return;
    proc_ = std::make_unique<Subprocess>(std::move(p).value());
    std::regex re("PORT ([0-9]+)");
    Eventually(
        [&] {
          auto t = ReadFile(out_);
          std::smatch m;
          if (t.ok() && std::regex_search(*t, m, re)) port_ = std::stoi(m[1]);
          return port_ > 0;
        },
        30000);
  }
  ~PortedServer() { Kill(); }
  PortedServer(const PortedServer&) = delete;
  PortedServer& operator=(const PortedServer&) = delete;
  int port() const { return port_; }
  void Kill() {
    if (proc_) {
      proc_->Signal(SIGKILL).IgnoreError();
      proc_->Wait(Deadline::InMs(10000)).status().IgnoreError();
      proc_.reset();
    }
  }
  void Signal(int sig) {
    if (proc_) proc_->Signal(sig).IgnoreError();
  }

 private:
  std::string out_;
  std::unique_ptr<Subprocess> proc_;
  int port_ = 0;
};

// One line of a run's batch ledger (<run>/batches.tsv, actors/src/batch_ledger.h):
// id, fate, sequences, unscored, source, stale. `columns` is how many the line had; a
// five-column line (written before the per-group lag gate) reads as stale 0.
struct LedgerRow {
  std::string line, id, fate, source;
  double sequences = 0, unscored = 0, stale = 0;
  int columns = 0;
};

// The ledger of the run folder `run`, line by line; nullopt when it has none.
inline std::optional<std::vector<LedgerRow>> ReadLedger(const std::filesystem::path& run) {
  std::ifstream in(run / "batches.tsv");
  if (!in) return std::nullopt;
  std::vector<LedgerRow> rows;
  for (std::string line; std::getline(in, line);) {
    LedgerRow r;
    r.line = line;
    std::istringstream ls(line);
    std::string field[6];
    while (r.columns < 6 && std::getline(ls, field[r.columns], '\t')) ++r.columns;
    r.id = field[0];
    r.fate = field[1];
    r.source = field[4];
    if (r.columns > 2) r.sequences = std::stod(field[2]);
    if (r.columns > 3) r.unscored = std::stod(field[3]);
    if (r.columns > 5) r.stale = std::stod(field[5]);
    rows.push_back(std::move(r));
  }
  return rows;
}

// DESIGN invariant 4 on the job_summary line: generated = trained + skipped
// + dropped_stale + dropped_invalid + dropped_unscored + in_flight +
// lost_with_actor + lost_with_learner, and no check of the head's failed.
inline void ExpectAccountingHolds(const Job& job) {
  auto js = job.Metrics("job_summary");
  ASSERT_EQ(js.size(), 1u) << job.Output();
  auto a = js[0]["accounting"];
  double rest = 0;
  for (const char* t : {"trained", "skipped", "dropped_stale", "dropped_invalid",
                        "dropped_unscored", "in_flight", "lost_with_actor", "lost_with_learner"})
    rest += a.value(t, 0.0);
  EXPECT_GT(a.value("generated", 0.0), 0);
  EXPECT_GT(a.value("trained", 0.0) + a.value("skipped", 0.0), 0);
  EXPECT_NEAR(a.value("generated", 0.0), rest, 0.5) << "accounting: " << a.dump() << "\n"
                                                    << job.Output();
  EXPECT_TRUE(js[0].value("accounting_holds", false))
      << "accounting problems: " << js[0]["accounting_problems"].dump() << "\n"
      << job.Output();
  // With checkpoint.ack = checkpoint (every e2e job) no decision is ever lost.
  EXPECT_EQ(a.value("lost_with_learner", 0.0), 0) << a.dump();
}

}  // namespace troupe::launcher::e2e
