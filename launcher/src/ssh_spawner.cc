// The ssh spawn backend: OpenSSH in batch mode (keys only, never a password
// prompt). Placement, stopping and refusals are shared with the slurm backend
// (remote_spawner.h); this file only builds the ssh command lines.
#include <algorithm>
#include <cctype>

#include "remote_spawner.h"
#include "troupe/launcher/spawner.h"

namespace troupe::launcher {
namespace {

bool Mentions(const std::vector<std::string>& options, const std::string& key) {
  for (const auto& o : options) {
    if (o.size() <= key.size()) continue;
    bool same = std::equal(key.begin(), key.end(), o.begin(), [](char a, char b) {
      return std::tolower(static_cast<unsigned char>(a)) ==
             std::tolower(static_cast<unsigned char>(b));
    });
    char sep = o[key.size()];
    if (same && (sep == '=' || sep == ' ')) return true;
  }
  return false;
}

class SshBackend final : public remote::Backend {
 public:
  explicit SshBackend(ClusterSpec c) : c_(std::move(c)) {}
  std::string name() const override { return "ssh"; }

  std::vector<std::string> CommandFor(const HostSpec& host, const std::string& script,
                                      const std::string& label) const override {
    std::vector<std::string> a = {"ssh", "-T"};
    if (!c_.ssh_config.empty()) a.insert(a.end(), {"-F", c_.ssh_config});
    a.insert(a.end(), {"-o", "BatchMode=yes"});
    // Defaults a user's options or config file may override.
    if (c_.ssh_config.empty() && !Mentions(c_.ssh_options, "StrictHostKeyChecking"))
      a.insert(a.end(), {"-o", "StrictHostKeyChecking=accept-new"});
    if (!Mentions(c_.ssh_options, "ConnectTimeout"))
      a.insert(a.end(), {"-o", "ConnectTimeout=10"});
    for (const auto& o : c_.ssh_options) a.insert(a.end(), {"-o", o});
    if (!c_.identity_file.empty()) a.insert(a.end(), {"-i", c_.identity_file});
    if (host.port != 22) a.insert(a.end(), {"-p", std::to_string(host.port)});
    if (!host.user.empty()) a.insert(a.end(), {"-l", host.user});
    a.insert(a.end(), {"--", host.name, script});
    (void)label;
    return a;
  }

 private:
  ClusterSpec c_;
};

}  // namespace

Result<std::unique_ptr<Spawner>> NewSshSpawner(RemoteSpawnerOptions o) {
  if (o.cluster.hosts.empty()) return InvalidArgument("the ssh backend needs cluster.hosts");
  for (const auto& h : o.cluster.hosts) {
    if (h.port == 0 || h.port > 65535)
      return InvalidArgument("cluster.hosts: host '{}' has port {} (1..65535)", h.name, h.port);
  }
  TROUPE_ASSIGN_OR_RETURN(auto placer, remote::Placer::Create(o.cluster.hosts, o.roles));
  remote::RemoteOptions ro{o.host_down_ms, o.remote_kill_ms, o.command_timeout_ms};
  return std::unique_ptr<Spawner>(new remote::RemoteSpawner(
      std::make_unique<SshBackend>(o.cluster), std::move(placer), ro));
}

}  // namespace troupe::launcher
