// Shared machinery of the remote spawn backends (ssh, slurm). Private to launcher/.
//
//   Head ──Spawn(launch)──▶ RemoteSpawner ──Placer.Pick(role)──▶ host
//                              │
//                              └─▶ RemoteProcess: `<backend client> host  sh -c "echo
//                                  troupe-remote-pid $$; exec env K=V troupe-actor ..."`
//                                  (ssh / srun), secrets on the client's stdin
//
// The remote shell prints its pid before exec'ing the actor: that pid is the
// actor's process group on the host (sshd and slurmstepd start each command as
// a group leader), so Terminate/Kill signal the group there with a second,
// asynchronous client command (a "signal helper") that is retried while the
// host is unreachable. A client that ends without having printed the marker
// never started the actor (host refused, unreachable, node unavailable): the
// host is marked down and the actor is re-placed on another allowed host.
//
// Thread-safety: everything here runs on the head's thread (like every
// Spawner); no locking.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/launcher/spawner.h"

namespace troupe::launcher::remote {

// Single-quotes `s` for a POSIX shell.
std::string ShellQuote(const std::string& s);
// The command run on the host for `launch`: prints the pid marker, then execs
// the actor with `launch.env` and `--bind-host bind_host`.
std::string LaunchScript(const ActorLaunch& launch, const std::string& bind_host);
// Sends `signal` to process group `pgid` if its leader is still the actor
// `actor_id` of the head `head_endpoint` (a pid the host reused is left alone).
// Exit 0: signalled; 3: the actor is gone already.
std::string SignalScript(int pgid, int signal, const std::string& actor_id,
                         const std::string& head_endpoint);
// The pid in the first "troupe-remote-pid N" line of `text`, if any.
std::optional<int> FindRemotePid(const std::string& text);
// The last few non-empty lines of `text`, without marker lines, joined with "; "
// (the client's explanation of a failed launch), at most `max_chars`.
std::string LastLines(const std::string& text, size_t max_lines = 3, size_t max_chars = 400);
// The value of `--head` in an actor's arguments ("" if absent).
std::string ArgValue(const std::vector<std::string>& args, const std::string& flag);

// Runs `argv` (with `env` added) to completion and returns its stdout+stderr.
// Timeout past the deadline (the command is killed); Unavailable on a non-zero
// exit, with the command's last lines.
Result<std::string> RunCapture(const std::vector<std::string>& argv,
                               const std::map<std::string, std::string>& env, Deadline deadline);

// Where each role's actors may go and which hosts are full, down or suspect.
class Placer {
 public:
  // Validates that every host named by a role exists and that every role with
  // actors has at least one host offering its resources.
  static Result<Placer> Create(std::vector<HostSpec> hosts,
                               std::map<std::string, RoleProcess> roles);

  // A host for one more actor of `role`, never one in `avoid`. Prefers hosts
  // that are up and have no unconfirmed stops, then the fewest actors of the
  // role, then the fewest actors, then config order. Down hosts are used only
  // when nothing else is allowed. Errors list why each host was not eligible.
  Result<std::string> Pick(const std::string& role, const std::set<std::string>& avoid) const;

  const HostSpec* Find(const std::string& name) const;
  void Add(const std::string& host, const std::string& role);
  void Remove(const std::string& host, const std::string& role);
  // A launch on `host` failed before the actor started (refused, unreachable).
  void MarkDown(const std::string& host, const std::string& reason, uint32_t for_ms);
  // Something reached the host (a helper or a launch succeeded).
  void MarkUp(const std::string& host);
  // Stops sent to the host that are not confirmed yet (maybe unreachable).
  void AddPendingStop(const std::string& host, int delta);
  const std::vector<HostSpec>& hosts() const { return hosts_; }

 private:
  struct HostState {
    int actors = 0;
    std::map<std::string, int> per_role;
    Clock::time_point down_until{};
    std::string down_reason;
    int pending_stops = 0;
  };
  std::vector<HostSpec> hosts_;
  std::map<std::string, RoleProcess> roles_;
  std::map<std::string, HostState> state_;
};

// What differs between ssh and srun.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The client command that runs `script` (one shell command line) on `host`
  // with the client's stdin forwarded to it. `label` names the actor.
  virtual std::vector<std::string> CommandFor(const HostSpec& host, const std::string& script,
                                              const std::string& label) const = 0;
  // Extra environment for the client process itself.
  virtual std::map<std::string, std::string> ClientEnv() const { return {}; }
};

struct RemoteOptions {
  uint32_t host_down_ms = 30000;
  uint32_t remote_kill_ms = 30000;
  uint32_t command_timeout_ms = 15000;
};

class RemoteSpawner final : public Spawner {
 public:
  RemoteSpawner(std::unique_ptr<Backend> backend, Placer placer, RemoteOptions options);
  ~RemoteSpawner() override;
  Result<std::unique_ptr<ActorProcess>> Spawn(const ActorLaunch& launch) override;
  std::string name() const override;

  struct State;  // shared with the processes (placement, helpers)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace troupe::launcher::remote
