#include "remote_spawner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <sstream>
#include <thread>
#include <tuple>

#include "troupe/core/log.h"

namespace troupe::launcher {
namespace remote {
namespace {

spdlog::logger& Log() {
  return log::Get("launcher");
}

constexpr const char* kPidMarker = "troupe-remote-pid ";

// Up to `max` bytes of `path` from `offset` ("" if unreadable).
std::string ReadFrom(const std::string& path, int64_t offset, size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out(max, '\0');
  ssize_t n;
  do {
    n = ::pread(fd, out.data(), max, offset);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string LaunchScript(const ActorLaunch& l, const std::string& bind_host) {
  std::string s = "echo ";
  s += kPidMarker;
  s += "$$; exec env";
  for (const auto& [k, v] : l.env) s += " " + ShellQuote(k + "=" + v);
  s += " " + ShellQuote(l.binary);
  for (const auto& a : l.args) s += " " + ShellQuote(a);
  if (!bind_host.empty()) s += " --bind-host " + ShellQuote(bind_host);
  return s;
}

std::string SignalScript(int pgid, int signal, const std::string& actor_id,
                         const std::string& head_endpoint) {
  const std::string pid = std::to_string(pgid);
  // The group leader must still be this actor of this head: a pid the host
  // reused since is left alone. Exit 3: nothing to signal.
  return "c=$(tr '\\000' ' ' < /proc/" + pid +
         "/cmdline 2>/dev/null) || exit 3; case \" $c\" in *" +
         ShellQuote(" --id " + actor_id + " ") + "*) ;; *) exit 3 ;; esac; case \" $c\" in *" +
         ShellQuote(" --head " + head_endpoint + " ") + "*) ;; *) exit 3 ;; esac; kill -" +
         std::to_string(signal) + " -" + pid + " 2>/dev/null && exit 0; exit 3";
}

std::optional<int> FindRemotePid(const std::string& text) {
  size_t at = 0;
  while ((at = text.find(kPidMarker, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const char* p = text.c_str() + at + std::strlen(kPidMarker);
      char* end = nullptr;
      long v = std::strtol(p, &end, 10);
      if (end != p && v > 0 && v < (1L << 30) && (*end == '\n' || *end == '\r' || *end == '\0'))
        return static_cast<int>(v);
    }
    at += 1;
  }
  return std::nullopt;
}

std::string LastLines(const std::string& text, size_t max_lines, size_t max_chars) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line.rfind(kPidMarker, 0) == 0) continue;
    lines.push_back(line);
  }
  std::string out;
  size_t first = lines.size() > max_lines ? lines.size() - max_lines : 0;
  for (size_t i = first; i < lines.size(); ++i) out += (out.empty() ? "" : "; ") + lines[i];
  if (out.size() > max_chars) out = "..." + out.substr(out.size() - max_chars);
  return out;
}

std::string ArgValue(const std::vector<std::string>& args, const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) return args[i + 1];
  return "";
}

// ------------------------------------------------------------------ placement

Result<Placer> Placer::Create(std::vector<HostSpec> hosts,
                              std::map<std::string, RoleProcess> roles) {
  if (hosts.empty()) return InvalidArgument("cluster.hosts is empty: nowhere to place actors");
  Placer p;
  for (auto& h : hosts) {
    if (h.name.empty()) return InvalidArgument("cluster.hosts: a host has no name");
    if (h.address.empty()) h.address = h.name;
    if (h.slots == 0) return InvalidArgument("cluster.hosts: host '{}' has slots 0", h.name);
    if (p.state_.count(h.name))
      return InvalidArgument("cluster.hosts: host '{}' is listed twice", h.name);
    p.state_[h.name] = HostState{};
  }
  p.hosts_ = std::move(hosts);
  for (const auto& [role, spec] : roles) {
    for (const auto& name : spec.hosts) {
      if (!p.state_.count(name))
        return InvalidArgument("{}.hosts names '{}', which is not in cluster.hosts", role, name);
    }
    bool any = false;
    for (const auto& h : p.hosts_) {
      bool listed = spec.hosts.empty() ||
                    std::find(spec.hosts.begin(), spec.hosts.end(), h.name) != spec.hosts.end();
      bool offers = std::all_of(spec.resources.begin(), spec.resources.end(), [&](auto& r) {
        return std::find(h.resources.begin(), h.resources.end(), r) != h.resources.end();
      });
      any |= listed && offers;
    }
    if (!any && spec.count > 0) {
      std::string res;
      for (auto& r : spec.resources) res += (res.empty() ? "" : ", ") + r;
      return InvalidArgument("no host of cluster.hosts{} offers the resources [{}] of {}.resources",
                             spec.hosts.empty() ? "" : " in " + role + ".hosts", res, role);
    }
  }
  p.roles_ = std::move(roles);
  return p;
}

const HostSpec* Placer::Find(const std::string& name) const {
  for (const auto& h : hosts_)
    if (h.name == name) return &h;
  return nullptr;
}

Result<std::string> Placer::Pick(const std::string& role,
                                 const std::set<std::string>& avoid) const {
  RoleProcess spec;
  if (auto it = roles_.find(role); it != roles_.end()) spec = it->second;
  const auto now = Clock::now();
  std::vector<std::string> why;
  // (down or suspect, role order, total actors, config index) -> smallest wins.
  std::optional<std::tuple<int, int, int, size_t>> best;
  std::string best_name;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    const HostSpec& h = hosts_[i];
    const HostState& st = state_.at(h.name);
    const int mine = st.per_role.count(role) ? st.per_role.at(role) : 0;
    if (!spec.hosts.empty() &&
        std::find(spec.hosts.begin(), spec.hosts.end(), h.name) == spec.hosts.end())
      continue;  // not this role's host: not worth listing
    std::string missing;
    for (const auto& r : spec.resources)
      if (std::find(h.resources.begin(), h.resources.end(), r) == h.resources.end())
        missing += (missing.empty() ? "" : ",") + r;
    if (!missing.empty()) {
      why.push_back(h.name + ": lacks " + missing);
      continue;
    }
    if (avoid.count(h.name)) {
      why.push_back(h.name + ": failed just now" +
                    (st.down_reason.empty() ? "" : " (" + st.down_reason + ")"));
      continue;
    }
    if (st.actors >= static_cast<int>(h.slots)) {
      why.push_back(fmt::format("{}: full ({}/{} slots)", h.name, st.actors, h.slots));
      continue;
    }
    if (spec.per_node > 0 && mine >= static_cast<int>(spec.per_node)) {
      why.push_back(
          fmt::format("{}: has {} {} actors (per_node {})", h.name, mine, role, spec.per_node));
      continue;
    }
    const int health = st.down_until > now ? 2 : st.pending_stops > 0 ? 1 : 0;
    // per_node > 0 packs (most actors of the role first), else spreads (fewest first).
    const int order = spec.per_node > 0 ? -mine : mine;
    auto key = std::make_tuple(health, order, st.actors, i);
    if (!best || key < *best) {
      best = key;
      best_name = h.name;
    }
  }
  if (best) return best_name;
  std::string list;
  for (auto& w : why) list += (list.empty() ? "" : "; ") + w;
  return ResourceExhausted("no host can take another {} actor{}{}", role, list.empty() ? "" : ": ",
                           list.empty() ? std::string("(no host listed for the role)") : list);
}

void Placer::Add(const std::string& host, const std::string& role) {
  auto& st = state_[host];
  st.actors++;
  st.per_role[role]++;
}

void Placer::Remove(const std::string& host, const std::string& role) {
  auto& st = state_[host];
  st.actors = std::max(0, st.actors - 1);
  st.per_role[role] = std::max(0, st.per_role[role] - 1);
}

void Placer::MarkDown(const std::string& host, const std::string& reason, uint32_t for_ms) {
  auto& st = state_[host];
  st.down_until = Clock::now() + Millis(for_ms);
  st.down_reason = reason;
}

void Placer::MarkUp(const std::string& host) {
  auto& st = state_[host];
  st.down_until = {};
  st.down_reason.clear();
}

void Placer::AddPendingStop(const std::string& host, int delta) {
  auto& st = state_[host];
  st.pending_stops = std::max(0, st.pending_stops + delta);
}

// ------------------------------------------------------------------ shared state and helpers

struct RemoteSpawner::State {
  std::unique_ptr<Backend> backend;
  Placer placer;
  RemoteOptions options;

  // A signal sent to an actor's process group on its host, retried while the
  // host cannot be reached.
  struct Helper {
    HostSpec host;
    std::string actor;
    int signal = 0;
    std::vector<std::string> argv;
    std::string output_file;
    std::optional<Subprocess> proc;
    Clock::time_point started{}, next_try{}, give_up_at{};
    int attempts = 0;
  };
  std::list<Helper> helpers;

  State(std::unique_ptr<Backend> b, Placer p, RemoteOptions o)
      : backend(std::move(b)), placer(std::move(p)), options(o) {}

  ~State() {
    // Bounded: wait a little for helpers in flight, then give up on the rest
    // (the actors exit by themselves once the head is silent).
    auto deadline = Deadline::InMs(3000);
    while (!deadline.expired()) {
      Tick(/*retry=*/false);
      bool running = false;
      for (auto& h : helpers) running |= h.proc.has_value();
      if (!running) break;
      std::this_thread::sleep_for(
          Millis(20));  // child processes: nothing to wait on with a deadline
    }
    for (auto& h : helpers) {
      Log().warn(
          "could not confirm the stop of {} on {} ({} attempts); it exits by itself once "
          "the head is silent for head.head_grace_ms",
          h.actor, h.host.name, h.attempts);
      if (h.proc) h.proc->Signal(SIGKILL).IgnoreError();
    }
    helpers.clear();
  }

  void StartHelper(Helper& h) {
    SpawnOptions o;
    o.argv = h.argv;
    o.env = backend->ClientEnv();
    o.output_file = h.output_file;
    o.term_grace_ms = 500;
    h.attempts++;
    h.started = Clock::now();
    auto p = Subprocess::Spawn(o);
    if (p.ok()) {
      h.proc.emplace(std::move(p).value());
    } else {
      Log().warn("cannot run the stop command for {} on {}: {}", h.actor, h.host.name,
                 p.status().message());
      h.next_try = Clock::now() + Millis(1000);
    }
  }

  void Signal(const HostSpec& host, const std::string& actor, const std::string& head, int pgid,
              int signal, const std::string& output_file) {
    Helper h;
    h.host = host;
    h.actor = actor;
    h.signal = signal;
    h.output_file = output_file;
    h.argv = backend->CommandFor(host, SignalScript(pgid, signal, actor, head), actor + "-stop");
    h.give_up_at = Clock::now() + Millis(options.remote_kill_ms);
    placer.AddPendingStop(host.name, +1);
    helpers.push_back(std::move(h));
    StartHelper(helpers.back());
  }

  // Reaps finished helpers, retries failed ones, bounds slow ones. Cheap; called often.
  void Tick(bool retry = true) {
    const auto now = Clock::now();
    for (auto it = helpers.begin(); it != helpers.end();) {
      Helper& h = *it;
      if (h.proc) {
        auto e = h.proc->Poll();
        if (!e) {
          if (now - h.started > Millis(options.command_timeout_ms))
            h.proc->Signal(SIGKILL).IgnoreError();
          ++it;
          continue;
        }
        h.proc.reset();
        if (e->exited && (e->code == 0 || e->code == 3)) {
          Log().debug("stop of {} on {} confirmed ({})", h.actor, h.host.name,
                      e->code == 0 ? "signalled" : "already gone");
          placer.AddPendingStop(h.host.name, -1);
          placer.MarkUp(h.host.name);
          it = helpers.erase(it);
          continue;
        }
        if (now >= h.give_up_at) {
          Log().warn(
              "could not stop {} on {} within {} ms ({} attempts, last: {}); it exits by "
              "itself once the head is silent for head.head_grace_ms",
              h.actor, h.host.name, options.remote_kill_ms, h.attempts, e->ToString());
          placer.AddPendingStop(h.host.name, -1);
          it = helpers.erase(it);
          continue;
        }
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                            "cannot reach {} to stop {} ({}); retrying for up to {} ms",
                            h.host.name, h.actor, e->ToString(), options.remote_kill_ms);
        placer.MarkDown(h.host.name, "unreachable (a stop is pending)", options.host_down_ms);
        h.next_try = now + Millis(1000);
      } else if (retry && now >= h.next_try) {
        StartHelper(h);
      }
      ++it;
    }
  }
};

// ------------------------------------------------------------------ process

namespace {

class RemoteProcess final : public ActorProcess {
 public:
  RemoteProcess(std::shared_ptr<RemoteSpawner::State> state, ActorLaunch launch)
      : state_(std::move(state)), launch_(std::move(launch)) {
    head_ = ArgValue(launch_.args, "--head");
  }

  ~RemoteProcess() override {
    if (client_ && !final_) {
      if (!client_->Poll()) Kill();
      client_->Poll();
    }
    Unplace();
    // The client Subprocess (SIGKILLed above if it was running) is reaped by its destructor.
  }

  Status Start(const std::string& host_name) {
    const HostSpec* host = state_->placer.Find(host_name);
    if (!host) return NotFound("no host '{}' in cluster.hosts", host_name);
    host_ = *host;
    offset_ = FileSize(launch_.output_file);
    remote_pid_.reset();
    SpawnOptions o;
    o.argv =
        state_->backend->CommandFor(host_, LaunchScript(launch_, host_.address), launch_.actor_id);
    o.env = state_->backend->ClientEnv();
    o.output_file = launch_.output_file;
    o.stdin_data = launch_.secrets;
    o.term_grace_ms = 2000;
    auto p = Subprocess::Spawn(o);
    if (!p.ok())
      return p.status().WithContext(state_->backend->name() + " to " + host_.name + " for " +
                                    launch_.actor_id);
    client_.emplace(std::move(p).value());
    state_->placer.Add(host_.name, launch_.role);
    placed_ = true;
    return Status::Ok();
  }

  const std::string& node() const override { return host_.name; }
  int pid() const override { return client_ ? client_->pid() : 0; }

  std::optional<ExitInfo> Poll() override {
    state_->Tick();
    if (final_) return final_;
    if (!client_) return ExitInfo{true, 255, 0};
    auto e = client_->Poll();
    if (!e) {
      LearnPid();
      return std::nullopt;
    }
    std::string out = ReadFrom(launch_.output_file, offset_, 1 << 16);
    if (!remote_pid_) remote_pid_ = FindRemotePid(out);
    Unplace();
    if (!remote_pid_ && !killed_ && e->exited) {
      // The client gave up before the actor started: the host refused or is unreachable.
      std::string reason = LastLines(out);
      if (reason.empty()) reason = state_->backend->name() + " " + e->ToString();
      state_->placer.MarkDown(host_.name, reason, state_->options.host_down_ms);
      Log().error("{}: {} could not start it on {}: {}", launch_.actor_id, state_->backend->name(),
                  host_.name, reason);
      tried_.insert(host_.name);
      if (launch_.host.empty()) {
        auto next = state_->placer.Pick(launch_.role, tried_);
        if (next.ok()) {
          Log().warn("{}: placing it on {} instead of {}", launch_.actor_id, *next, host_.name);
          Status s = Start(*next);
          if (s.ok()) return std::nullopt;
          Log().error("{}: {}", launch_.actor_id, s.message());
        } else {
          Log().error("{}: no other host: {}", launch_.actor_id, next.status().message());
        }
      }
      final_ = *e;
      return final_;
    }
    if (remote_pid_ && !killed_ && state_->backend->name() == "ssh" && e->exited &&
        e->code == 255) {
      // The ssh session broke while the actor ran: it may live on. Make sure it does not.
      Log().warn("{}: ssh session to {} ended ({}); stopping the remote actor", launch_.actor_id,
                 host_.name, LastLines(out, 1));
      SignalRemote(SIGKILL);
    }
    final_ = *e;
    return final_;
  }

  void Terminate() override {
    if (final_ || !client_) return;
    LearnPid();
    if (remote_pid_) {
      SignalRemote(SIGTERM);
    } else {
      client_->Signal(SIGTERM).IgnoreError();
    }
  }

  void Kill() override {
    if (final_ || !client_) return;
    LearnPid();
    killed_ = true;
    client_->Signal(SIGKILL).IgnoreError();
    if (remote_pid_) SignalRemote(SIGKILL);
  }

 private:
  void LearnPid() {
    if (remote_pid_ || !client_) return;
    if (FileSize(launch_.output_file) <= offset_) return;
    remote_pid_ = FindRemotePid(ReadFrom(launch_.output_file, offset_, 1 << 16));
    if (remote_pid_) state_->placer.MarkUp(host_.name);
  }
  void SignalRemote(int sig) {
    state_->Signal(host_, launch_.actor_id, head_, *remote_pid_, sig, launch_.output_file);
  }
  void Unplace() {
    if (placed_) state_->placer.Remove(host_.name, launch_.role);
    placed_ = false;
  }

  std::shared_ptr<RemoteSpawner::State> state_;
  ActorLaunch launch_;
  std::string head_;
  HostSpec host_;
  std::optional<Subprocess> client_;
  int64_t offset_ = 0;
  std::optional<int> remote_pid_;
  std::optional<ExitInfo> final_;
  std::set<std::string> tried_;
  bool killed_ = false;
  bool placed_ = false;
};

}  // namespace

RemoteSpawner::RemoteSpawner(std::unique_ptr<Backend> backend, Placer placer, RemoteOptions options)
    : state_(std::make_shared<State>(std::move(backend), std::move(placer), options)) {}

RemoteSpawner::~RemoteSpawner() = default;

std::string RemoteSpawner::name() const {
  return state_->backend->name();
}

Result<std::unique_ptr<ActorProcess>> RemoteSpawner::Spawn(const ActorLaunch& launch) {
  state_->Tick();
  std::string host = launch.host;
  if (host.empty()) {
    auto pick = state_->placer.Pick(launch.role, {});
    if (!pick.ok()) return pick.status().WithContext("placing " + launch.actor_id);
    host = *pick;
  }
  auto p = std::make_unique<RemoteProcess>(state_, launch);
  TROUPE_RETURN_IF_ERROR(p->Start(host));
  Log().info("{}: starting on {} with {}", launch.actor_id, host, state_->backend->name());
  return std::unique_ptr<ActorProcess>(std::move(p));
}

// ------------------------------------------------------------------ commands

Result<std::string> RunCapture(const std::vector<std::string>& argv,
                               const std::map<std::string, std::string>& env, Deadline deadline) {
  char tmpl[] = "/tmp/troupe-cmd.XXXXXX";
  int fd = ::mkstemp(tmpl);
  if (fd < 0) return IoError("mkstemp: {}", std::strerror(errno));
  ::close(fd);
  std::string path = tmpl;
  SpawnOptions o;
  o.argv = argv;
  o.env = env;
  o.output_file = path;
  o.term_grace_ms = 500;
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) {
    ::unlink(path.c_str());
    return p.status();
  }
  auto e = p->Wait(deadline);
  std::string out = ReadFrom(path, 0, 1 << 22);
  ::unlink(path.c_str());
  std::string cmd = argv.empty() ? "" : argv[0];
  for (size_t i = 1; i < argv.size() && i < 4; ++i) cmd += " " + argv[i];
  if (!e.ok()) return Timeout("`{}` did not finish in time", cmd);
  if (!e->exited || e->code != 0)
    return Unavailable("`{}` failed ({}): {}", cmd, e->ToString(), LastLines(out));
  return out;
}

}  // namespace remote

}  // namespace troupe::launcher
