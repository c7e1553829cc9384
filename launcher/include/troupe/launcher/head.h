// The head: the control plane of one job, living inside `troupe run`.
//
//            troupe run job.yaml  ──  Head
//   ┌─────────────┬──────────┴───┬──────────────┐
//   ▼             ▼              ▼              ▼
// registry    supervisor     log collector   control socket ◀── troupe status/scale/stop/logs
// (actors,    (spawn,        (logs/<actor>   (CLI requests)
//  directory)  restart,       .log)           metrics sink ◀── learner (metrics.jsonl)
//              scale, drain)
//
// The head is never on the data path. Actors connect to its control endpoint
// (a server socket), register, heartbeat, ship log lines and metrics; the head
// answers with the directory (who is where) and control commands. It marks an
// actor lost after `heartbeat_timeout_ms` of silence, kills its process group
// and restarts it per its role's policy (backoff doubling, max restarts). A
// message from an actor incarnation the head has replaced is answered with
// `shutdown`, so a partitioned actor that comes back never duplicates work.
//
// Thread-safety: Run() drives everything on the calling thread; RequestStop()
// may be called from any thread (e.g. a signal-watching thread).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/launcher/job_spec.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/spawner.h"
#include "troupe/launcher/telemetry.h"
#include "troupe/transport/socket.h"

namespace troupe::launcher {

// The environment `troupe run` gives every actor process (HeadOptions::actor_env):
// OMP_WAIT_POLICY=PASSIVE, since actors share cores and spin-waiting OpenMP threads would
// starve the others.
std::map<std::string, std::string> ActorEnvironment();

struct HeadOptions {
  std::string job_name;                      // shown in status and the summary
  RunDir run;                                // the run folder (must exist)
  HeadSpec spec;                             // heartbeat and grace periods
  std::map<std::string, RoleProcess> roles;  // "learner", "rollout", "reward" (and "echo" in tests)
  std::string bind_endpoint = "tcp://127.0.0.1:0";  // control socket (port 0: any free port)
  std::string actor_binary;                         // troupe-actor on every node
  std::vector<std::string> actor_args;           // extra args for every actor (e.g. --config PATH)
  std::map<std::string, std::string> actor_env;  // extra environment for every actor
  std::string actor_secrets;                     // delivered on every actor's stdin (CURVE keys)
  bool live_progress = false;  // redraw one progress line (a terminal); else print lines
  // Where progress, the accuracy curve and the summary are printed.
  std::function<void(const std::string&)> print = nullptr;
  // Role whose clean exit (code 0) means the job is complete. Empty: none.
  std::string completion_role = "learner";
  // Dashboard, Prometheus /metrics, TensorBoard files, rollouts.jsonl and
  // status.json (telemetry.h). Unset: none of them.
  std::optional<TelemetryOptions> telemetry;
};

// One actor as the head sees it (also what `troupe status` shows).
struct ActorStatus {
  std::string id, role, node, state;
  int pid = 0;
  uint64_t policy_version = 0;
  uint32_t restarts = 0;
  int64_t last_heartbeat_ns = 0;
  std::map<std::string, double> stats;
  std::map<std::string, std::string> endpoints;  // what it serves, by purpose ("data", "weights")
};

// What the head knows at the end of a job.
struct JobSummary {
  bool completed = false;                         // the completion role finished the job
  bool stopped = false;                           // `troupe stop` / Ctrl-C
  std::string failure;                            // non-empty when the job failed
  std::map<std::string, double> learner_summary;  // the learner's "summary" metrics
  std::map<std::string, double> accounting;       // generated and every term (accounting.h)
  std::vector<std::string> accounting_problems;   // checks that failed (empty: it holds)
};

class Head {
 public:
  // Binds the control socket on `network`; nothing is spawned yet.
  static Result<std::unique_ptr<Head>> Create(HeadOptions options,
                                              std::unique_ptr<transport::Network> network,
                                              std::unique_ptr<Spawner> spawner);
  ~Head();

  // The control endpoint actors and the CLI connect to.
  const std::string& endpoint() const;
  // The dashboard's URL ("" without one).
  std::string dashboard_url() const;

  // Spawns the initial actors and supervises until the job completes, is
  // stopped, or fails. Returns ok for completed/stopped jobs, the failure
  // otherwise. Blocks; every actor process has exited when it returns.
  Status Run();
  // Asks Run() to stop the job gracefully (learner checkpoints, everyone
  // exits). A second call kills what is left. Any thread, signal-safe enough
  // to call from a signal-watching thread.
  void RequestStop();

  JobSummary summary() const;
  std::vector<ActorStatus> actors() const;

  class Impl;

 private:
  explicit Head(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::launcher
