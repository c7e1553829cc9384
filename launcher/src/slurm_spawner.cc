// The slurm spawn backend: one srun step per actor inside an allocation
// (salloc / sbatch / `troupe run --submit`). Placement, stopping and refusals
// are shared with the ssh backend (remote_spawner.h); this file builds the
// srun command lines and reads the allocation's nodes.
#include <cmath>
#include <set>
#include <sstream>

#include "remote_spawner.h"
#include "troupe/core/log.h"
#include "troupe/launcher/spawner.h"

namespace troupe::launcher {
namespace {

class SrunBackend final : public remote::Backend {
 public:
  SrunBackend(ClusterSpec c, std::string job_id) : c_(std::move(c)), job_(std::move(job_id)) {}
  std::string name() const override { return "srun"; }

  std::vector<std::string> CommandFor(const HostSpec& host, const std::string& script,
                                      const std::string& label) const override {
    // --overlap: actor steps share the allocation's CPUs instead of queueing for them.
    std::vector<std::string> a = {"srun",
                                  "--jobid=" + job_,
                                  "--nodes=1",
                                  "--ntasks=1",
                                  "--nodelist=" + host.name,
                                  "--overlap",
                                  "--mpi=none",
                                  "--job-name=troupe:" + label};
    a.insert(a.end(), c_.srun_options.begin(), c_.srun_options.end());
    a.insert(a.end(), {"sh", "-c", script});
    return a;
  }

 private:
  ClusterSpec c_;
  std::string job_;
};

// "Key=Value Key=Value ..." (one `scontrol -o show node` line); a value may contain spaces.
std::map<std::string, std::string> ParseScontrolLine(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream in(line);
  std::string tok, last;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) {
      if (!last.empty()) kv[last] += " " + tok;
      continue;
    }
    last = tok.substr(0, eq);
    kv[last] = tok.substr(eq + 1);
  }
  return kv;
}

// "gpu:a100:4(S:0-1),nic:1" -> {gpu, nic}; "fast,ib" -> {fast, ib}; "(null)" -> {}.
std::vector<std::string> Tags(const std::string& list, bool gres) {
  std::vector<std::string> out;
  if (list.empty() || list == "(null)") return out;
  std::istringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (gres) item = item.substr(0, item.find(':'));
    item = item.substr(0, item.find('('));
    if (!item.empty() && std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

}  // namespace

Result<std::vector<HostSpec>> SlurmAllocationHosts(const ClusterSpec& cluster,
                                                   const std::string& nodelist,
                                                   Deadline deadline) {
  if (nodelist.empty())
    return InvalidArgument("no Slurm node list: run inside an allocation (salloc/sbatch) or use "
                           "`troupe run --submit`");
  TROUPE_ASSIGN_OR_RETURN(std::string names_text,
                          remote::RunCapture({"scontrol", "show", "hostnames", nodelist}, {},
                                             deadline));
  std::vector<std::string> names;
  {
    std::istringstream in(names_text);
    std::string n;
    while (in >> n) names.push_back(n);
  }
  if (names.empty()) return InvalidArgument("Slurm node list '{}' names no node", nodelist);
  TROUPE_ASSIGN_OR_RETURN(std::string nodes_text,
                          remote::RunCapture({"scontrol", "-o", "show", "node", nodelist}, {},
                                             deadline));
  std::map<std::string, std::map<std::string, std::string>> info;
  {
    std::istringstream in(nodes_text);
    std::string line;
    while (std::getline(in, line)) {
      auto kv = ParseScontrolLine(line);
      if (kv.count("NodeName")) info[kv["NodeName"]] = kv;
    }
  }
  std::vector<HostSpec> out;
  for (const auto& name : names) {
    HostSpec h;
    h.name = name;
    auto it = info.find(name);
    if (it != info.end()) {
      h.address = it->second["NodeAddr"];
      h.resources = Tags(it->second["AvailableFeatures"], false);
      for (auto& g : Tags(it->second["Gres"], true))
        if (std::find(h.resources.begin(), h.resources.end(), g) == h.resources.end())
          h.resources.push_back(g);
    }
    for (const auto& c : cluster.hosts) {
      if (c.name != name) continue;
      if (!c.address.empty()) h.address = c.address;
      h.slots = c.slots;
      if (!c.resources.empty()) h.resources = c.resources;
      h.user = c.user;
    }
    if (h.address.empty()) h.address = name;
    out.push_back(std::move(h));
  }
  for (const auto& c : cluster.hosts) {
    if (std::find(names.begin(), names.end(), c.name) == names.end())
      log::Get("launcher").warn("cluster.hosts names '{}', which is not in the allocation ({})",
                                c.name, nodelist);
  }
  return out;
}

uint32_t SlurmNodesNeeded(const ClusterSpec& cluster,
                          const std::map<std::string, RoleProcess>& roles) {
  if (cluster.slurm_nodes > 0) return cluster.slurm_nodes;
  uint32_t n = 0;
  for (const auto& [role, r] : roles) {
    if (r.count == 0) continue;
    n += r.per_node == 0 ? 1 : (r.count + r.per_node - 1) / r.per_node;
  }
  return std::max<uint32_t>(n, 1);
}

Result<std::unique_ptr<Spawner>> NewSlurmSpawner(RemoteSpawnerOptions o) {
  if (o.slurm_job_id.empty())
    return InvalidArgument("the slurm backend runs inside an allocation: start `troupe run` under "
                           "salloc or sbatch (SLURM_JOB_ID), or submit it with `troupe run "
                           "--submit`");
  if (o.cluster.hosts.empty())
    return InvalidArgument("the slurm backend found no node in the allocation");
  TROUPE_ASSIGN_OR_RETURN(auto placer, remote::Placer::Create(o.cluster.hosts, o.roles));
  remote::RemoteOptions ro{o.host_down_ms, o.remote_kill_ms, o.command_timeout_ms};
  return std::unique_ptr<Spawner>(new remote::RemoteSpawner(
      std::make_unique<SrunBackend>(o.cluster, o.slurm_job_id), std::move(placer), ro));
}

}  // namespace troupe::launcher
