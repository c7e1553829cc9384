#include "troupe/launcher/job_spec.h"

namespace troupe::launcher {

void Describe(config::Binder& b, RoleProcess& c) {
  b.Field("count", &c.count, "number of actors of this role at start (`troupe scale` changes it)");
  b.Field("max_restarts", &c.max_restarts,
          "restarts per actor before it is given up (learner: the job fails)");
  b.Field("restart_backoff_ms", &c.restart_backoff_ms,
          "delay before the first restart; doubles per restart, capped at 30 s");
  b.Field("hosts", &c.hosts,
          "ssh/slurm: hosts (nodes) this role may use (empty: every host of the cluster)");
  b.Field("per_node", &c.per_node,
          "ssh/slurm: fill a host up to this many actors of the role before using the next "
          "(0: spread evenly over the allowed hosts)");
  b.Field("resources", &c.resources, "resource tags a host must offer for this role (e.g. gpu)");
}

void Describe(config::Binder& b, HeadSpec& c) {
  b.Field("heartbeat_interval_ms", &c.heartbeat_interval_ms,
          "how often actors heartbeat and the head answers");
  b.Field("heartbeat_timeout_ms", &c.heartbeat_timeout_ms,
          "an actor silent this long is marked lost and replaced");
  b.Field("head_grace_ms", &c.head_grace_ms,
          "an actor exits by itself when the head is silent this long");
  b.Field("stop_grace_ms", &c.stop_grace_ms,
          "`troupe stop`: time allowed for checkpoint and exit before SIGKILL");
  b.Field("register_timeout_ms", &c.register_timeout_ms,
          "a spawned actor must register within this time");
  if (b.mode() == config::Binder::Mode::kRead) {
    if (c.heartbeat_interval_ms == 0) b.Error("heartbeat_interval_ms", "must be > 0");
    if (c.heartbeat_timeout_ms < 2 * c.heartbeat_interval_ms)
      b.Error("heartbeat_timeout_ms", "must be at least twice heartbeat_interval_ms (" +
                                          std::to_string(c.heartbeat_interval_ms) + ")");
    if (c.head_grace_ms < 2 * c.heartbeat_interval_ms)
      b.Error("head_grace_ms", "must be at least twice heartbeat_interval_ms");
  }
}

void Describe(config::Binder& b, HostSpec& c) {
  b.Field("name", &c.name, "ssh destination (host name or address)");
  b.Field("address", &c.address, "address other nodes use to reach actors on it (default: name)");
  b.Field("user", &c.user, "ssh user (empty: current user)");
  b.Field("port", &c.port, "sshd port");
  b.Field("slots", &c.slots, "maximum actors placed on this host");
  b.Field("resources", &c.resources, "resource tags this host offers (e.g. gpu)");
}

void Describe(config::Binder& b, ClusterSpec& c) {
  b.Field("backend", &c.backend, "where actors run: local | ssh | slurm");
  b.Field("advertise_address", &c.advertise_address,
          "address published to actors (empty: 127.0.0.1 for local, else the host's address)");
  b.Field("bind_interface", &c.bind_interface,
          "take the advertise address from this interface (e.g. eth0)");
  b.Field("actor_binary", &c.actor_binary,
          "troupe-actor path on every host (empty: next to troupe)");
  b.Field("curve", &c.curve,
          "CURVE encryption of every socket: auto (on with more than one host) | on | off");
  b.Field("ssh_options", &c.ssh_options, "extra `ssh -o` options (BatchMode=yes is always set)");
  b.Field("identity_file", &c.identity_file, "ssh private key (empty: ssh's default)");
  b.Field("slurm_partition", &c.slurm_partition, "slurm backend: partition (empty: the default)");
  b.Field("srun_options", &c.srun_options, "slurm backend: extra srun arguments");
  b.Field("ssh_config", &c.ssh_config,
          "ssh backend: ssh client config file, passed with -F (empty: ~/.ssh/config)");
  b.Field("slurm_nodes", &c.slurm_nodes,
          "`troupe run --submit`: nodes to ask sbatch for (0: sum of the roles' nodes)");
  b.Field("sbatch_options", &c.sbatch_options, "`troupe run --submit`: extra sbatch arguments");
  // hosts: a list of mappings.
  b.List("hosts", &c.hosts,
         "ssh backend: the hosts (list of {name, address, user, port, slots, resources})");
  if (b.mode() == config::Binder::Mode::kRead) {
    if (c.backend != "local" && c.backend != "ssh" && c.backend != "slurm")
      b.Error("backend", "must be local, ssh or slurm, got '" + c.backend + "'");
    if (c.curve != "auto" && c.curve != "on" && c.curve != "off")
      b.Error("curve", "must be auto, on or off, got '" + c.curve + "'");
    if (c.backend == "ssh" && c.hosts.empty())
      b.Error("hosts", "the ssh backend needs at least one host");
  }
}

void Describe(config::Binder& b, DashboardSpec& c) {
  b.Field("enabled", &c.enabled, "serve the dashboard and Prometheus /metrics while the job runs");
  b.Field("bind", &c.bind,
          "address the dashboard listens on (a non-loopback address requires the printed token)");
  b.Field("port", &c.port, "TCP port of the dashboard (0: any free port)");
  b.Field("sample_ms", &c.sample_ms,
          "period of the head's job-wide `heartbeat` lines in metrics.jsonl (live curves)");
  if (b.mode() == config::Binder::Mode::kRead) {
    if (c.bind.empty()) b.Error("bind", "is empty (127.0.0.1 serves this machine only)");
    if (c.port > 65535) b.Error("port", "must be a TCP port (0-65535)");
    if (c.sample_ms < 100) b.Error("sample_ms", "must be at least 100");
  }
}

void Describe(config::Binder& b, TensorboardSpec& c) {
  b.Field("enabled", &c.enabled, "write TensorBoard event files to RUN/tb/");
  b.Field("texts_per_eval", &c.texts_per_eval,
          "transcripts written as TensorBoard text at each evaluation (0: none)");
  if (b.mode() == config::Binder::Mode::kRead && c.texts_per_eval > 64)
    b.Error("texts_per_eval", "must be at most 64");
}

void Describe(config::Binder& b, RolloutSampleSpec& c) {
  b.Field("per_update", &c.per_update,
          "sequences of each optimizer update sampled into RUN/rollouts.jsonl (0: none)");
  b.Field("tokens", &c.tokens, "also record token ids, loss mask and per-token policy versions");
  b.Field("max_text_chars", &c.max_text_chars,
          "prompt and response texts in rollouts.jsonl are cut to this many bytes");
  if (b.mode() == config::Binder::Mode::kRead) {
    if (c.per_update > 256) b.Error("per_update", "must be at most 256");
    if (c.max_text_chars < 16) b.Error("max_text_chars", "must be at least 16");
  }
}

bool CurveEnabled(const ClusterSpec& c) {
  return c.curve == "on" || (c.curve == "auto" && c.backend != "local");
}

}  // namespace troupe::launcher
