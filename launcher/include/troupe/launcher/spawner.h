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

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/launcher/address.h"
#include "troupe/launcher/job_spec.h"
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

// ---- Remote backends: ssh and slurm (docs/multinode.md).
//
// Placement: each actor goes to a host its role allows (RoleProcess.hosts, or
// every host; RoleProcess.resources must be offered by the host; at most
// RoleProcess.per_node actors of the role and HostSpec.slots actors in all per
// host), spreading a role over its hosts (fewest actors of the role first). A
// non-empty ActorLaunch.host pins the actor to that host. The actor is started
// with `--bind-host <HostSpec.address>`, so it binds and advertises its own
// host's address, and its environment is set on the remote command line (env
// K=V); secrets travel on the client's stdin, never on a command line.
//
// Stopping: the remote command reports its pid (its process group) before it
// execs the actor; Terminate/Kill signal that group on the host with a second
// client command, asynchronously, retried for remote_kill_ms while the host is
// unreachable (the actor also exits by itself once the head is silent for
// head.head_grace_ms). Kill also ends the local client at once.
//
// Refusals: a launch that ends before the actor started (ssh exit 255: refused,
// unreachable, bad key; srun: node unavailable) is logged with the client's own
// message, the host is avoided for host_down_ms, and the actor is re-placed on
// another allowed host; when none is left the process ends with the client's
// exit code and the head's restart policy takes over.
//
// Every call returns at once (clients and helpers run as child processes);
// the spawner's destructor waits at most a few seconds for pending stops.
struct RemoteSpawnerOptions {
  ClusterSpec cluster;  // backend settings and hosts (slurm: the allocation's nodes, see below)
  std::map<std::string, RoleProcess> roles;  // placement rules per role
  uint32_t host_down_ms =
      30000;  // a host that refused a launch is avoided this long (then retried)
  uint32_t remote_kill_ms =
      30000;  // keep retrying to signal a stopped actor on an unreachable host this long
  uint32_t command_timeout_ms = 15000;  // bound of one helper command (remote signal, scontrol)
  std::string slurm_job_id;  // slurm: the allocation the steps run in (the caller's SLURM_JOB_ID)
};

// ssh backend: `ssh -o BatchMode=yes [-F cluster.ssh_config] [-i identity] [-p port] [-l user]
// [-o option...] HOST '<launch script>'`. StrictHostKeyChecking=accept-new and
// ConnectTimeout=10 are added unless cluster.ssh_options or cluster.ssh_config set them.
// InvalidArgument for hosts/roles that do not fit together.
Result<std::unique_ptr<Spawner>> NewSshSpawner(RemoteSpawnerOptions options);

// slurm backend: one `srun --jobid=JOB --nodes=1 --ntasks=1 --nodelist=NODE --overlap` step
// per actor inside an existing allocation (options.slurm_job_id: run `troupe run` under
// salloc/sbatch, or use `troupe run --submit`). options.cluster.hosts must be the
// allocation's nodes (SlurmAllocationHosts). InvalidArgument without a job id.
Result<std::unique_ptr<Spawner>> NewSlurmSpawner(RemoteSpawnerOptions options);

// The nodes of an allocation (`nodelist` as in SLURM_JOB_NODELIST, expanded by
// `scontrol show hostnames`), each with its NodeAddr, and its features and GRES
// names as resource tags; an entry of cluster.hosts with the same name overrides
// address, slots and resources. Blocks up to `deadline` (runs scontrol).
Result<std::vector<HostSpec>> SlurmAllocationHosts(const ClusterSpec& cluster,
                                                   const std::string& nodelist, Deadline deadline);

// Nodes `troupe run --submit` asks sbatch for: cluster.slurm_nodes, else the sum
// over roles with actors of ceil(count / per_node) (per_node 0: one node).
uint32_t SlurmNodesNeeded(const ClusterSpec& cluster,
                          const std::map<std::string, RoleProcess>& roles);

}  // namespace troupe::launcher
