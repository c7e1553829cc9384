// Address resolution of the job schema (torch-free, part of troupe::job): the
// head's advertise address and numeric IPv4 addresses of host names. Used by
// the launcher and by actors (which bind to their host's address).
#pragma once

#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/launcher/job_spec.h"

namespace troupe::launcher {

// The IPv4 address `host` (a name or a numeric address) resolves to; NotFound
// naming the host when it does not. Blocks for name resolution.
Result<std::string> ResolveIpv4Address(const std::string& host);

// The address the head binds and publishes to actors: cluster.advertise_address;
// else the IPv4 address of cluster.bind_interface; else, for remote backends, this
// machine's address on the route to the first host; else 127.0.0.1. Refuses an
// unspecified address, and a loopback one while some host is not this machine,
// naming the host. Blocks only for name resolution of host names.
Result<std::string> ResolveAdvertiseAddress(const ClusterSpec& cluster,
                                            const std::vector<HostSpec>& hosts);

}  // namespace troupe::launcher
