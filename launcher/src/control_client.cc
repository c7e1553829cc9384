#include "troupe/launcher/control_client.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "troupe/core/text.h"
#include "troupe/launcher/spawner.h"
#include "troupe/transport/message.h"
#include "troupe/transport/wire_names.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::launcher {

Result<HeadInfo> ReadHeadInfo(const RunDir& run) {
  auto text = ReadFile(run.head_file());
  if (!text.ok()) return NotFound("run '{}' has no head.json: the job never started", run.path);
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("endpoint")) {
    return Malformed("'{}' is not a valid head file", run.head_file());
  }
  HeadInfo h;
  h.endpoint = j.value("endpoint", "");
  h.pid = j.value("pid", 0);
  h.job = j.value("job", "");
  h.host = j.value("host", "");
  h.dashboard = j.value("dashboard", "");
  return h;
}

Status WriteHeadInfo(const RunDir& run, const HeadInfo& info) {
  nlohmann::json j;
  j["endpoint"] = info.endpoint;
  j["pid"] = info.pid;
  j["job"] = info.job;
  j["host"] = info.host.empty() ? HostName() : info.host;
  if (!info.dashboard.empty()) j["dashboard"] = info.dashboard;
  return WriteFileAtomic(run.head_file(), j.dump(2) + "\n");
}

static Result<transport::CurveOptions> CliCurve(const RunDir& run) {
  transport::CurveOptions c;
  auto text = ReadFile(run.secrets() + "/curve.json");
  if (!text.ok()) return c;  // no CURVE for this job
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.value("curve", false)) return c;
  c.enabled = true;
  c.server.public_key = j.value("server_public", "");
  c.client.public_key = j.value("client_public", "");
  c.client.secret_key = j.value("client_secret", "");
  return c;
}

Result<ControlResult> SendControl(const RunDir& run, const std::string& kind, Deadline deadline,
                                  const std::string& role, uint32_t count) {
  TROUPE_ASSIGN_OR_RETURN(HeadInfo head, ReadHeadInfo(run));
  // The pid only says something on the head's own machine (`troupe run --submit`
  // runs the head on a compute node).
  const bool same_host = head.host.empty() || head.host == HostName();
  if (same_host && head.pid > 0 && ::kill(head.pid, 0) != 0 && errno == ESRCH) {
    return Unavailable("the job in '{}' is not running (its head, pid {}, has exited)", run.path,
                       head.pid);
  }
  std::random_device rd;
  std::string identity = fmt::format("cli-{}-{:x}", ::getpid(), rd());
  transport::ZmqNetworkOptions no;
  no.identity.actor_id = identity;
  TROUPE_ASSIGN_OR_RETURN(no.curve, CliCurve(run));
  TROUPE_ASSIGN_OR_RETURN(auto net, transport::NewZmqNetwork(no));
  transport::SocketOptions so;
  so.identity = identity;
  so.linger_ms = 0;
  TROUPE_ASSIGN_OR_RETURN(auto sock,
                          net->Connect(transport::SocketKind::kClient, head.endpoint, so));
  uint64_t request_id = (static_cast<uint64_t>(rd()) << 32) | rd();
  transport::OutMessage m;
  auto c = m.envelope().getBody().initControl();
  c.setRequestId(request_id);
  if (kind == "status") {
    c.getCommand().setStatus();
  } else if (kind == "stop") {
    c.getCommand().setStop();
  } else if (kind == "scale") {
    auto r = transport::RoleFromName(role);
    if (!r) return InvalidArgument("unknown role '{}'", role);
    auto s = c.getCommand().initScale();
    s.setRole(*r);
    s.setCount(count);
  } else {
    return InvalidArgument("unknown control command '{}'", kind);
  }
  Status sent = sock->Send(m, deadline);
  if (!sent.ok())
    return Unavailable("no head reachable at {} (is the job still running?)", head.endpoint);
  while (true) {
    auto in = sock->Recv(deadline);
    if (!in.ok()) {
      if (transport::IsBadInput(in.status())) continue;
      if (in.status().code() == Code::kTimeout) {
        return Unavailable("no answer from the head at {} (is the job still running?)",
                           head.endpoint);
      }
      return in.status();
    }
    if (in->message.kind() != transport::MessageKind::CONTROL_REPLY) continue;
    auto rep = in->message.envelope().getBody().getControlReply();
    if (rep.getRequestId() != request_id) continue;
    if (!rep.getOk()) return InvalidArgument("{}", std::string(rep.getError()));
    ControlResult out;
    out.message = rep.getMessage();
    for (auto a : rep.getActors()) {
      ActorStatus s;
      s.id = a.getActorId();
      s.role = transport::RoleName(a.getRole());
      s.node = a.getNode();
      s.pid = a.getPid();
      static const char* kStates[] = {"starting", "ready",  "busy",   "draining",
                                      "stopping", "exited", "failed", "lost"};
      auto st = static_cast<unsigned>(a.getState());
      s.state = st < 8 ? kStates[st] : "?";
      s.policy_version = a.getPolicyVersion();
      s.restarts = a.getRestarts();
      s.last_heartbeat_ns = a.getLastHeartbeatNs();
      for (auto kv : a.getStats()) s.stats[kv.getName()] = kv.getValue();
      for (auto ep : a.getEndpoints()) s.endpoints[ep.getName()] = ep.getAddress();
      out.actors.push_back(std::move(s));
    }
    for (auto p : rep.getProgress()) out.progress[p.getName()] = p.getValue();
    return out;
  }
}

static std::string Throughput(const ActorStatus& a) {
  for (const char* k : {"gen_tokens_per_s", "train_tokens_per_s", "scored_per_s", "echoed"}) {
    auto it = a.stats.find(k);
    if (it != a.stats.end()) {
      std::string unit =
          std::string(k) == "gen_tokens_per_s" || std::string(k) == "train_tokens_per_s" ? " tok/s"
          : std::string(k) == "scored_per_s"                                             ? " seq/s"
                                                                                         : " msgs";
      return fmt::format("{:.0f}{}", it->second, unit);
    }
  }
  return "-";
}

std::string FormatStatusTable(const ControlResult& r, bool with_stats) {
  std::string out = r.message + "\n";
  auto p = r.progress;
  if (p.count("step")) {
    out += fmt::format("step {:.0f}  reward {:.3f}  eval {:.3f}  lag {:.2f}\n", p["step"],
                       p["reward_mean"], p["eval_accuracy"], p["lag_mean"]);
  }
  out += fmt::format("{:<12} {:<8} {:<14} {:>7} {:<9} {:>7} {:>16} {:>8} {:>9}\n", "ACTOR", "ROLE",
                     "NODE", "PID", "STATE", "VERSION", "THROUGHPUT", "RESTARTS", "HEARTBEAT");
  int64_t now = WallTimeNs();
  for (const auto& a : r.actors) {
    std::string hb = a.last_heartbeat_ns
                         ? fmt::format("{:.1f}s ago", (now - a.last_heartbeat_ns) / 1e9)
                         : "never";
    out += fmt::format("{:<12} {:<8} {:<14} {:>7} {:<9} {:>7} {:>16} {:>8} {:>9}\n", a.id, a.role,
                       a.node.substr(0, 14), a.pid, a.state, a.policy_version, Throughput(a),
                       a.restarts, hb);
    if (with_stats && !a.stats.empty()) {
      std::string line = "    ";
      for (const auto& [k, v] : a.stats) {
        std::string item = fmt::format("{}={:g}  ", k, v);
        if (line.size() + item.size() > 110) {
          out += line + "\n";
          line = "    ";
        }
        line += item;
      }
      out += line + "\n";
    }
  }
  return out;
}

}  // namespace troupe::launcher
