// Spawn backends: how the head starts, signals and watches actor processes.
//
// A Spawner turns an ActorLaunch (which binary, which arguments, which
// secrets) into a running ActorProcess on some node. Backends: local
// (fork/exec in a new process group), ssh (OpenSSH, BatchMode) and slurm
// (srun steps inside an allocation). The head owns every ActorProcess; its
// destructor stops the process (group), so no actor outlives the head object.
//
// Thread-safety: a Spawner and its processes are used from the head's thread
// only.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {

// Everything needed to start one actor.
struct ActorLaunch {
  std::string actor_id;                    // "rollout-2"
  std::string role;                        // "rollout"
  std::string binary;                      // troupe-actor path on the target node
  std::vector<std::string> args;           // arguments after the binary
  std::map<std::string, std::string> env;  // environment additions
  std::string output_file;                 // where stdout/stderr go (on the head's node)
  std::string secrets;                     // written to the actor's stdin, never on a command line
  std::string host;                        // node to place on (ssh/slurm); empty = backend's choice
};

class ActorProcess {
 public:
  virtual ~ActorProcess() = default;
  // Node the process runs on (host name).
  virtual const std::string& node() const = 0;
  // Local pid of the process the head controls (ssh/srun client for remote ones).
  virtual int pid() const = 0;
  // Exit info once the process (or its remote counterpart) has ended. Non-blocking.
  virtual std::optional<ExitInfo> Poll() = 0;
  // Asks the actor to stop (SIGTERM to its process group). Non-blocking.
  virtual void Terminate() = 0;
  // Kills it at once (SIGKILL to its group, remote side included where possible). Non-blocking.
  virtual void Kill() = 0;
};

class Spawner {
 public:
  virtual ~Spawner() = default;
  // Starts one actor. Errors name the node and the cause.
  virtual Result<std::unique_ptr<ActorProcess>> Spawn(const ActorLaunch& launch) = 0;
  // "local", "ssh", "slurm".
  virtual std::string name() const = 0;
};

// fork/exec on this machine, each actor in its own process group.
std::unique_ptr<Spawner> NewLocalSpawner();

// This machine's host name.
std::string HostName();

}  // namespace troupe::launcher
