#include "troupe/launcher/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace troupe::launcher {

namespace {

bool IsLoopback(const in_addr& a) {
  return (ntohl(a.s_addr) >> 24) == 127;
}

std::string Ip(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

Result<in_addr> ResolveIpv4(const std::string& name) {
  in_addr a{};
  if (::inet_pton(AF_INET, name.c_str(), &a) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) return NotFound("cannot resolve '{}': {}", name, ::gai_strerror(rc));
  a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

Result<std::string> InterfaceAddress(const std::string& iface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return IoError("getifaddrs: {}", std::strerror(errno));
  std::string found, names;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (names.find(std::string(" ") + i->ifa_name + ",") == std::string::npos)
      names += std::string(" ") + i->ifa_name + ",";
    if (iface == i->ifa_name && found.empty())
      found = Ip(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr);
  }
  ::freeifaddrs(list);
  if (found.empty()) {
    if (!names.empty()) names.pop_back();
    return InvalidArgument(
        "cluster.bind_interface '{}' has no IPv4 address here (interfaces with "
        "one:{})",
        iface, names);
  }
  return found;
}

// This machine's source address toward `to` (no packet is sent: a UDP connect only routes).
Result<std::string> RouteSource(const in_addr& to) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError("socket: {}", std::strerror(errno));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(9);
  dst.sin_addr = to;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable("no route to {}: {}", Ip(to), std::strerror(e));
  }
  sockaddr_in src{};
  socklen_t len = sizeof(src);
  int rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&src), &len);
  ::close(fd);
  if (rc != 0) return IoError("getsockname: {}", std::strerror(errno));
  return Ip(src.sin_addr);
}

}  // namespace

Result<std::string> ResolveIpv4Address(const std::string& host) {
  TROUPE_ASSIGN_OR_RETURN(in_addr a, ResolveIpv4(host));
  return Ip(a);
}

Result<std::string> ResolveAdvertiseAddress(const ClusterSpec& c,
                                            const std::vector<HostSpec>& hosts) {
  const bool remote = c.backend != "local";
  // The first host that is not this machine's loopback (remote actors must reach the head).
  const HostSpec* far = nullptr;
  in_addr far_addr{};
  if (remote) {
    for (const auto& h : hosts) {
      auto a = ResolveIpv4(h.address.empty() ? h.name : h.address);
      if (!a.ok()) continue;  // reported by the spawner when it uses the host
      if (!IsLoopback(*a)) {
        far = &h;
        far_addr = *a;
        break;
      }
    }
  }
  std::string addr, source;
  if (!c.advertise_address.empty()) {
    auto a = ResolveIpv4(c.advertise_address);
    if (!a.ok()) return a.status().WithContext("cluster.advertise_address");
    addr = Ip(*a);
    source = "cluster.advertise_address";
  } else if (!c.bind_interface.empty()) {
    TROUPE_ASSIGN_OR_RETURN(addr, InterfaceAddress(c.bind_interface));
    source = "the address of cluster.bind_interface " + c.bind_interface;
  } else if (far) {
    auto r = RouteSource(far_addr);
    if (!r.ok())
      return r.status().WithContext("finding the head's address toward host " + far->name +
                                    " (set cluster.bind_interface or cluster.advertise_address)");
    addr = *r;
    source = "the route to host " + far->name;
  } else {
    addr = "127.0.0.1";
    source = "the default";
  }
  in_addr a{};
  ::inet_pton(AF_INET, addr.c_str(), &a);
  if (a.s_addr == 0)
    return InvalidArgument(
        "the head cannot advertise the unspecified address {} ({}): actors "
        "need an address they can connect to",
        addr, source);
  if (far && IsLoopback(a))
    return InvalidArgument(
        "the head would advertise {} ({}), which host {} ({}) cannot reach; set "
        "cluster.bind_interface or a routable cluster.advertise_address",
        addr, source, far->name, Ip(far_addr));
  return addr;
}

}  // namespace troupe::launcher
