// Process-level parts of a job config: how many actors of each role, where
// they run, how they are supervised, how the head watches them. Torch-free.
// The full job config (launcher/include/troupe/launcher/job_config.h) embeds
// these next to the model, task, trainer and sampling sections.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/config_binder.h"

namespace troupe::launcher {

// Supervision and placement of one role's actors.
struct RoleProcess {
  uint32_t count = 1;  // number of actors of this role at start (`troupe scale` changes it)
  uint32_t max_restarts =
      3;  // restarts per actor id before it is given up (learner: the job fails)
  uint32_t restart_backoff_ms =
      500;  // delay before the first restart; doubles per restart, capped at 30 s
  std::vector<std::string>
      hosts;  // ssh/slurm: hosts (nodes) this role may use (empty: every host of the cluster)
  uint32_t per_node = 0;  // ssh/slurm: fill a host up to this many actors of the role before
                          // using the next (0: spread evenly over the allowed hosts)
  std::vector<std::string> resources;  // resource tags the host must offer (e.g. "gpu")
};
void Describe(config::Binder& b, RoleProcess& c);

// The head's liveness rules.
struct HeadSpec {
  uint32_t heartbeat_interval_ms = 500;  // how often actors heartbeat (and the head answers)
  uint32_t heartbeat_timeout_ms = 5000;  // an actor silent this long is marked lost and replaced
  uint32_t head_grace_ms = 10000;  // an actor exits by itself when the head is silent this long
  uint32_t stop_grace_ms = 15000;  // `troupe stop`: time for checkpoint + exit before SIGKILL
  uint32_t register_timeout_ms = 60000;  // a spawned actor must register within this time
};
void Describe(config::Binder& b, HeadSpec& c);

// What the head shows and records about a job besides metrics.jsonl
// (docs/operations.md, "Seeing a job").
struct DashboardSpec {
  bool enabled = true;             // serve the dashboard (and Prometheus /metrics) while the job runs
  std::string bind = "127.0.0.1";  // address it listens on; any non-loopback address needs the
                                   // token the head prints (RUN/secrets/dashboard.json)
  uint32_t port = 0;               // TCP port (0: any free port; the URL is printed at start)
  uint32_t sample_ms = 2000;       // period of the head's `heartbeat` lines in metrics.jsonl
                                   // (job-wide heartbeat figures: the dashboard's live curves)
};
void Describe(config::Binder& b, DashboardSpec& c);

// TensorBoard event files in RUN/tb/ (every metric, as scalars, histograms and texts).
struct TensorboardSpec {
  bool enabled = true;          // write RUN/tb/events.out.tfevents.*
  uint32_t texts_per_eval = 4;  // transcripts written as text at each evaluation (0: none)
};
void Describe(config::Binder& b, TensorboardSpec& c);

// A sample of every update's sequences in RUN/rollouts.jsonl (the dashboard's rollout viewer).
struct RolloutSampleSpec {
  uint32_t per_update = 4;         // sequences sampled per optimizer update (0: no rollouts.jsonl)
  bool tokens = true;              // also write token ids, loss mask and per-token versions
  uint32_t max_text_chars = 4000;  // prompt and response texts are cut to this many bytes
};
void Describe(config::Binder& b, RolloutSampleSpec& c);

// A remote host for the ssh backend.
struct HostSpec {
  std::string name;     // ssh destination (host name or address)
  std::string address;  // address other nodes use to reach actors on it (default: name)
  std::string user;     // ssh user (empty: current user)
  uint32_t port = 22;   // sshd port
  uint32_t slots = 8;   // max actors placed on this host
  std::vector<std::string> resources;  // resource tags it offers (e.g. "gpu")
};
void Describe(config::Binder& b, HostSpec& c);

// Where actors run and how they reach each other.
struct ClusterSpec {
  std::string backend = "local";  // local | ssh | slurm
  std::string advertise_address;  // address the head and actors publish (empty: 127.0.0.1 for
                                  // local, else the host's address)
  std::string bind_interface;  // network interface to take the advertise address from (e.g. "eth0")
  std::string actor_binary;    // troupe-actor path on every host (empty: next to the troupe binary)
  std::string curve = "auto";  // CURVE encryption: auto (on with more than one host) | on | off
  std::vector<HostSpec> hosts;           // ssh backend: the hosts
  std::vector<std::string> ssh_options;  // extra `ssh -o` options (BatchMode=yes is always set)
  std::string identity_file;             // ssh private key (empty: ssh's default)
  std::string slurm_partition;  // slurm backend: partition for sbatch/srun (empty: default)
  std::vector<std::string> srun_options;  // extra srun arguments
  std::string ssh_config;  // ssh client config file passed with -F (empty: ~/.ssh/config)
  uint32_t slurm_nodes = 0;  // `troupe run --submit`: nodes to ask sbatch for (0: from the roles)
  std::vector<std::string> sbatch_options;  // `troupe run --submit`: extra sbatch arguments
};
void Describe(config::Binder& b, ClusterSpec& c);
// True when the job's sockets use CURVE: `curve: on`, or `auto` with a remote backend.
bool CurveEnabled(const ClusterSpec& c);

}  // namespace troupe::launcher
