// Actor runtime: what every actor process does besides its role.
//
//   troupe-actor --role R --id ID --head tcp://...      (spawned by the head)
//        │
//   ActorRuntime ──Register/Heartbeat/LogRecord/Metrics──▶ head
//        ◀──────────Directory / Control / heartbeat reply──
//
// It connects to the head, registers the endpoints the role bound, heartbeats
// with the role's stats, ships every log line to the head (which writes
// logs/<actor>.log), keeps the latest directory (who is where), and turns
// head commands (stop, drain, checkpoint, shutdown), SIGTERM and a silent head
// into flags the role's loop polls. An actor whose head has been silent for
// `head_grace_ms` (registered, or registering: the head may die before it
// acknowledges) exits by itself: no orphans. If the role does not return
// within another max(head_grace_ms, 5 s) (e.g. blocked in a collective with
// peers that are gone), the runtime ends the process (exit code 3).
//
// Thread model: the runtime owns one thread that talks to the head. All
// public methods are thread-safe; callbacks (OnDirectory) run on the runtime
// thread and must be short. The destructor stops the thread, flushes pending
// log lines (bounded) and closes the socket.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/transport/socket.h"

namespace troupe::actors {

struct RuntimeOptions {
  std::string actor_id;                  // "rollout-1"
  std::string role;                      // "learner" | "rollout" | "reward" | "echo"
  std::string head_endpoint;             // the head's control endpoint
  uint32_t restarts = 0;                 // how often the supervisor restarted this actor id
  uint32_t heartbeat_interval_ms = 500;  // heartbeat period
  uint32_t head_grace_ms = 10000;        // exit when the head is silent this long
  uint32_t register_timeout_ms = 30000;  // Register() gives up after this
  size_t max_pending_logs =
      10000;                 // log lines buffered for the head; older ones are dropped (counted)
  bool forward_logs = true;  // ship log lines to the head
};

// One actor as listed in the directory.
struct PeerInfo {
  std::string id;
  std::string role;
  std::string node;
  int state = 0;  // wire::ActorState
  uint64_t policy_version = 0;
  std::map<std::string, std::string> endpoints;  // name -> address
};

struct DirectorySnapshot {
  uint64_t epoch = 0;
  std::vector<PeerInfo> actors;
  // Actors of `role` that are registered and not draining/exiting.
  std::vector<PeerInfo> Live(const std::string& role) const;
  const PeerInfo* Find(const std::string& id) const;
};

// Why the role should wind down (first reason wins).
enum class ExitReason { kNone, kStop, kDrain, kShutdown, kSignal, kHeadLost, kError };
const char* ExitReasonName(ExitReason r);

class ActorRuntime {
 public:
  // Borrows `network` (must outlive the runtime). Connects to the head; does
  // not register yet (the role binds its sockets first, then calls Register).
  static Result<std::unique_ptr<ActorRuntime>> Create(RuntimeOptions options,
                                                      transport::Network* network);
  ~ActorRuntime();

  // Endpoints this actor serves (name -> address), published at Register.
  void AddEndpoint(const std::string& name, const std::string& address);
  // Registers with the head and waits for its first answer (a directory).
  // Starts heartbeating. Blocks until registered or the deadline (kTimeout) /
  // the head refuses (kUnavailable).
  Status Register(Deadline deadline);

  // Latest directory (copy). `epoch` 0 until the first one arrives.
  DirectorySnapshot directory() const;
  // Waits until the directory epoch exceeds `seen_epoch` or the deadline; returns the epoch.
  uint64_t WaitDirectory(uint64_t seen_epoch, Deadline deadline) const;
  // Callback on every new directory, on the runtime thread.
  void OnDirectory(std::function<void(const DirectorySnapshot&)> callback);

  // Role stats sent with every heartbeat (and shown by `troupe status`).
  void SetStat(const std::string& name, double value);
  void SetStats(const std::map<std::string, double>& stats);
  void SetPolicyVersion(uint64_t version);
  // Sends a metrics record to the head's metrics sink. Non-blocking (queued).
  void SendMetrics(const std::string& kind, uint64_t step, uint64_t policy_version,
                   const std::map<std::string, double>& stats, const std::string& json = "");

  // Exit signalling. should_exit() is true once any reason is set.
  bool should_exit() const { return reason_.load() != ExitReason::kNone; }
  ExitReason exit_reason() const { return reason_.load(); }
  void RequestExit(ExitReason reason);
  // A head `checkpoint` command arrived since the last call (consumes it).
  bool TakeCheckpointRequest() { return checkpoint_requested_.exchange(false); }
  // Waits until should_exit() or the deadline; true if exiting.
  bool WaitExit(Deadline deadline) const;

  // Sends what is queued (logs, metrics) now; bounded by the deadline.
  void Flush(Deadline deadline);

  const RuntimeOptions& options() const { return options_; }
  uint64_t log_lines_dropped() const { return logs_dropped_.load(); }

  class LogSink;

 private:
  ActorRuntime(RuntimeOptions options, transport::Network* network);
  void Loop();
  void HandleHeadMessage(const transport::InMessage& m);
  void SendHeartbeat();
  void SendQueued();
  Status SendRegister();

  RuntimeOptions options_;
  transport::Network* network_;
  std::unique_ptr<transport::Socket> head_;
  std::unique_ptr<transport::Poller> poller_;  // the loop's: head_ and Wake() (set before it runs)
  std::shared_ptr<LogSink> sink_;

  mutable Mutex mu_;
  mutable CondVar cv_;
  DirectorySnapshot directory_ TROUPE_GUARDED_BY(mu_);
  std::function<void(const DirectorySnapshot&)> on_directory_ TROUPE_GUARDED_BY(mu_);
  std::map<std::string, double> stats_ TROUPE_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> endpoints_ TROUPE_GUARDED_BY(mu_);
  std::vector<transport::OutMessage> outbox_
      TROUPE_GUARDED_BY(mu_);  // metrics and logs for the head
  bool registered_ TROUPE_GUARDED_BY(mu_) = false;
  std::string refusal_ TROUPE_GUARDED_BY(mu_);

  std::atomic<uint64_t> policy_version_{0};
  std::atomic<ExitReason> reason_{ExitReason::kNone};
  std::atomic<bool> checkpoint_requested_{false};
  std::atomic<bool> stop_thread_{false};
  std::atomic<uint64_t> logs_dropped_{0};
  std::atomic<int64_t> last_head_ms_{0};
  std::atomic<bool> registering_{false};  // Register() has sent; the head's silence counts
  std::thread thread_;
};

}  // namespace troupe::actors
