#include "troupe/launcher/head.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accounting.h"
#include "progress.h"
#include "troupe/core/exit_codes.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/transport/message.h"
#include "troupe/transport/wire_names.h"

namespace troupe::launcher {

using transport::OutMessage;
using wire::ActorState;

namespace {

spdlog::logger& Log() {
  return log::Get("launcher");
}

struct Record {
  std::string id;
  // The registered incarnation's routing id at the head's socket: actors
  // connect as "<id>#<incarnation hex>", so an old incarnation back from a
  // partition is a different peer from its replacement (never routed over it).
  std::string route;
  // Where head messages for this actor go: its registered route (its id before it registers).
  const std::string& peer() const { return route.empty() ? id : route; }
  std::string role;
  int index = 0;
  std::string node;
  int pid = 0;
  ActorState state = ActorState::STARTING;
  std::vector<std::pair<std::string, std::string>> endpoints;
  uint64_t policy_version = 0;
  uint32_t restarts = 0;
  uint64_t incarnation = 0;  // of the registered process (0: not registered)
  Clock::time_point spawned_at{};
  Clock::time_point last_heard{};
  int64_t last_heartbeat_ns = 0;
  std::map<std::string, double> stats;
  std::unique_ptr<ActorProcess> proc;
  bool expect_exit = false;     // drained / stopped / shut down on purpose
  bool remove_on_exit = false;  // scale-down: forget the record after exit
  std::optional<Clock::time_point> restart_at;
  bool given_up = false;
  std::unique_ptr<std::ofstream> log;          // logs/<id>.log
  std::string last_error;                      // its last error-level log line (exit reasons)
  std::map<std::string, double> final_report;  // the actor's "final" metrics
  // Last word (final report, else last stats) of incarnations that ended and
  // were restarted, with their source key
  // ("<id>/<incarnation hex>", the prefix of the batch ids they produced).
  std::vector<std::pair<std::string, std::map<std::string, double>>> dead_reports;

  bool alive() const { return proc != nullptr; }
  bool registered() const { return incarnation != 0; }
  // The registered incarnation's source key (see dead_reports).
  std::string source() const { return fmt::format("{}/{:x}", id, incarnation); }
};

}  // namespace

std::map<std::string, std::string> ActorEnvironment() {
  return {{"OMP_WAIT_POLICY", "PASSIVE"}};
}

class Head::Impl {
 public:
  Impl(HeadOptions o, std::unique_ptr<transport::Network> net, std::unique_ptr<Spawner> sp)
      : o_(std::move(o)),
        net_(std::move(net)),
        spawner_(std::move(sp)),
        progress_(o_.live_progress) {}

  ~Impl() {
    // Whatever is still running goes down with the head object.
    for (auto& [id, r] : actors_) {
      if (r.proc) r.proc->Kill();
    }
    actors_.clear();
    poller_.reset();
    control_.reset();
  }

  Status Init() {
    transport::SocketOptions so;
    so.linger_ms = 0;
    auto s = net_->Bind(transport::SocketKind::kServer, o_.bind_endpoint, so);
    if (!s.ok())
      return s.status().WithContext("head: cannot bind control socket " + o_.bind_endpoint);
    control_ = std::move(s).value();
    poller_ = net_->NewPoller();
    poller_->Add(control_.get());
    metrics_.open(o_.run.metrics(), std::ios::app);
    if (!metrics_) return IoError("head: cannot open '{}'", o_.run.metrics());
    if (o_.telemetry) {
      auto t = Telemetry::Create(o_.run, *o_.telemetry);
      if (!t.ok()) return t.status().WithContext("head");
      telemetry_ = std::move(t).value();
    }
    for (auto& [role, spec] : o_.roles) desired_[role] = spec.count;
    return Status::Ok();
  }

  const std::string& endpoint() const { return control_->endpoint(); }
  std::string dashboard_url() const { return telemetry_ ? telemetry_->dashboard_url() : ""; }

  void RequestStop() {
    int n = stop_requests_.fetch_add(1) + 1;
    if (n >= 1) poller_->Wake();
  }

  Status Run();
  JobSummary summary() const {
    MutexLock g(summary_mu_);
    return summary_;
  }
  std::vector<ActorStatus> Snapshot() const;

 private:
  // ---- spawning and supervision
  void SpawnNew(const std::string& role);
  void Launch(Record& r);
  void OnProcessExit(Record& r, const ExitInfo& e);
  void ScheduleRestart(Record& r, const std::string& why);
  void Reconcile();
  void Tick();
  void BeginShutdown(const std::string& why, bool stopped);
  // The head could not write `path` in the run folder: the job stops now
  // (nothing it records would survive), once.
  void WriteFailed(const std::string& path);
  bool write_failed_ = false;
  void ShutdownTick();

  // ---- messages
  void HandleMessages();
  void Handle(const transport::Incoming& in);
  void OnRegister(const std::string& peer, const transport::InMessage& m);
  void OnHeartbeat(const std::string& peer, const transport::InMessage& m);
  void OnLog(const transport::InMessage& m);
  void OnMetrics(const transport::InMessage& m);
  void OnControl(const std::string& peer, const transport::InMessage& m);
  void SendShutdown(const std::string& peer, const char* why, uint64_t incarnation);
  void SendControl(Record& r, int command);
  void SendTo(const std::string& peer, const OutMessage& m);
  void BroadcastDirectory();
  void FillActor(wire::ActorInfo::Builder b, const Record& r) const;
  void WriteSummary();

  Record* Find(const std::string& id) {
    auto it = actors_.find(id);
    return it == actors_.end() ? nullptr : &it->second;
  }
  // Actors of a role that count toward its desired size (a given-up actor
  // keeps its slot: replacing it under a new id would defeat max_restarts).
  size_t LiveCount(const std::string& role) const {
    size_t n = 0;
    for (auto& [id, r] : actors_)
      if (r.role == role && !r.remove_on_exit) ++n;
    return n;
  }
  void SetState(Record& r, ActorState s) {
    if (r.state != s) {
      r.state = s;
      directory_dirty_ = true;
    }
  }

  HeadOptions o_;
  std::unique_ptr<transport::Network> net_;
  std::unique_ptr<Spawner> spawner_;
  std::unique_ptr<transport::Socket> control_;
  std::unique_ptr<transport::Poller> poller_;
  std::map<std::string, Record> actors_;
  std::map<std::string, int> next_index_;
  std::map<std::string, uint32_t> desired_;
  uint64_t directory_epoch_ = 0;
  bool directory_dirty_ = false;
  Clock::time_point last_directory_{};
  std::atomic<int> stop_requests_{0};
  int stop_requests_seen_ = 0;
  bool shutting_down_ = false;
  Clock::time_point shutdown_phase_at_{};
  int shutdown_phase_ = 0;
  std::ofstream metrics_;
  Progress progress_;
  mutable Mutex summary_mu_;
  JobSummary summary_ TROUPE_GUARDED_BY(summary_mu_);
  bool finished_ = false;
  int stop_requests_seen_offset_ = 0;
  // Every incarnation of removed actors (scaled down): for the accounting.
  std::vector<IncarnationReport> retired_reports_;
  // An actor's incarnations: the dead ones and the current (or last) one.
  void CollectReports(const Record& r, std::vector<IncarnationReport>* out) const;
  // Dashboard, TensorBoard, rollouts.jsonl, status.json (null: none).
  std::unique_ptr<Telemetry> telemetry_;
  std::string JobState() const;
};

// ------------------------------------------------------------------ supervision

void Head::Impl::SpawnNew(const std::string& role) {
  int idx = next_index_[role]++;
  std::string id = role + "-" + std::to_string(idx);
  Record& r = actors_[id];
  r.id = id;
  r.role = role;
  r.index = idx;
  r.log = std::make_unique<std::ofstream>(o_.run.log_file(id), std::ios::app);
  Launch(r);
}

void Head::Impl::Launch(Record& r) {
  ActorLaunch l;
  l.actor_id = r.id;
  l.role = r.role;
  l.binary = o_.actor_binary;
  l.args = {"--role",   r.role,      "--id",      r.id,         "--head",
            endpoint(), "--run-dir", o_.run.path, "--restarts", std::to_string(r.restarts)};
  l.args.insert(l.args.end(), o_.actor_args.begin(), o_.actor_args.end());
  l.env = o_.actor_env;
  l.output_file = o_.run.logs() + "/" + r.id + ".out";
  l.secrets = o_.actor_secrets;
  // l.host stays empty: the spawner places the actor by its role's rules (hosts,
  // resources, per_node) and re-places it when a host refuses.
  r.incarnation = 0;
  r.expect_exit = false;
  r.restart_at.reset();
  r.spawned_at = Clock::now();
  r.last_heard = r.spawned_at;
  SetState(r, ActorState::STARTING);
  auto p = spawner_->Spawn(l);
  if (!p.ok()) {
    Log().error("cannot start {}: {}", r.id, p.status().message());
    if (r.log) *r.log << "[head] cannot start: " << p.status().message() << std::endl;
    ScheduleRestart(r, p.status().message());
    return;
  }
  r.proc = std::move(p).value();
  r.pid = r.proc->pid();
  r.node = r.proc->node();
  Log().info("started {} (pid {}, node {}{})", r.id, r.pid, r.node,
             r.restarts ? ", restart " + std::to_string(r.restarts) : "");
}

void Head::Impl::ScheduleRestart(Record& r, const std::string& why) {
  // Its last word: the final report if it sent one before it ended, else its
  // last stats. The next incarnation starts with neither.
  const auto& last = r.final_report.empty() ? r.stats : r.final_report;
  if (r.incarnation != 0 && !last.empty()) r.dead_reports.emplace_back(r.source(), last);
  r.stats.clear();
  r.final_report.clear();
  r.incarnation = 0;
  if (shutting_down_ || r.remove_on_exit) return;
  auto it = o_.roles.find(r.role);
  uint32_t max_restarts = it == o_.roles.end() ? 0 : it->second.max_restarts;
  uint32_t backoff = it == o_.roles.end() ? 500 : it->second.restart_backoff_ms;
  if (r.restarts >= max_restarts) {
    r.given_up = true;
    SetState(r, ActorState::FAILED);
    Log().error("{} failed ({}) and has used its {} restarts: giving up on it", r.id, why,
                max_restarts);
    if (r.role == o_.completion_role) {
      BeginShutdown(r.id + " failed: " + why, false);
      MutexLock g(summary_mu_);
      summary_.failure = r.id + " failed after " + std::to_string(r.restarts) + " restarts: " + why;
    }
    return;
  }
  double delay = std::min(30000.0, backoff * std::pow(2.0, r.restarts));
  r.restarts++;
  r.restart_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(delay));
  Log().warn("{} {}: restarting in {} ms (restart {}/{})", r.id, why, static_cast<int64_t>(delay),
             r.restarts, max_restarts);
}

void Head::Impl::OnProcessExit(Record& r, const ExitInfo& e) {
  r.proc.reset();
  r.pid = 0;
  directory_dirty_ = true;
  if (r.log) *r.log << "[head] process ended: " << e.ToString() << std::endl;
  if (r.expect_exit || shutting_down_) {
    SetState(r, e.exited && e.code == 0 ? ActorState::EXITED : ActorState::FAILED);
    Log().info("{} exited ({})", r.id, e.ToString());
    return;
  }
  if (e.exited && e.code == kExitFatal) {
    // The actor says restarting cannot help (its run folder cannot be
    // written: full disk, read-only or gone): the job stops now, with why.
    SetState(r, ActorState::FAILED);
    r.given_up = true;
    // The actor's last error line, without its time stamp and name prefix.
    std::string last = r.last_error;
    if (auto at = last.find("] "); at != std::string::npos) last = last.substr(at + 2);
    if (auto at = last.find(": "); at != std::string::npos && at < 16) last = last.substr(at + 2);
    const std::string why =
        r.id + " stopped" +
        (last.empty() ? std::string(" with a fatal error (exit 4)") : ": " + last);
    Log().error("{}; stopping the job", why);
    {
      MutexLock g(summary_mu_);
      summary_.failure = why;
    }
    BeginShutdown(why, false);
    return;
  }
  if (r.role == o_.completion_role && e.exited && e.code == 0) {
    SetState(r, ActorState::EXITED);
    Log().info("{} finished the job", r.id);
    {
      MutexLock g(summary_mu_);
      summary_.completed = true;
    }
    BeginShutdown("job complete", false);
    return;
  }
  SetState(r, ActorState::FAILED);
  ScheduleRestart(r, "exited unexpectedly (" + e.ToString() + ")");
}

void Head::Impl::Reconcile() {
  if (shutting_down_) return;
  for (auto& [role, want] : desired_) {
    size_t have = LiveCount(role);
    while (have < want) {
      SpawnNew(role);
      ++have;
    }
    if (have > want) {
      // Scale down: drain the newest actors first.
      std::vector<Record*> cands;
      for (auto& [id, r] : actors_)
        if (r.role == role && !r.remove_on_exit && !r.given_up) cands.push_back(&r);
      std::sort(cands.begin(), cands.end(),
                [](Record* a, Record* b) { return a->index > b->index; });
      for (size_t i = 0; i < have - want; ++i) {
        Record& r = *cands[i];
        r.remove_on_exit = true;
        r.expect_exit = true;
        r.restart_at.reset();
        if (r.alive()) {
          SetState(r, ActorState::DRAINING);
          SendControl(r, 4 /*drain*/);
          shutdown_phase_at_ = Clock::now();
          r.spawned_at = Clock::now();  // drain deadline starts now
          Log().info("draining {} (scale {}={})", r.id, role, want);
        }
      }
    }
  }
}

void Head::Impl::Tick() {
  auto now = Clock::now();
  const auto hb_timeout = std::chrono::milliseconds(o_.spec.heartbeat_timeout_ms);
  const auto reg_timeout = std::chrono::milliseconds(o_.spec.register_timeout_ms);
  const auto stop_grace = std::chrono::milliseconds(o_.spec.stop_grace_ms);
  std::vector<std::string> forget;
  for (auto& [id, r] : actors_) {
    if (r.proc) {
      if (auto e = r.proc->Poll()) {
        OnProcessExit(r, *e);
      } else if (r.registered() && !r.expect_exit && now - r.last_heard > hb_timeout) {
        Log().warn("{} lost: no heartbeat for {} ms; killing it", r.id,
                   std::chrono::duration_cast<Millis>(now - r.last_heard).count());
        r.proc->Kill();
        r.proc.reset();
        r.pid = 0;
        SetState(r, ActorState::LOST);
        ScheduleRestart(r, "lost (heartbeat timeout)");
      } else if (!r.registered() && !r.expect_exit && now - r.spawned_at > reg_timeout) {
        Log().warn("{} did not register within {} ms; killing it", r.id,
                   o_.spec.register_timeout_ms);
        r.proc->Kill();
        r.proc.reset();
        r.pid = 0;
        SetState(r, ActorState::FAILED);
        ScheduleRestart(r, "did not register");
      } else if (r.expect_exit && r.remove_on_exit && now - r.spawned_at > stop_grace) {
        Log().warn("{} did not finish draining within {} ms; killing it", r.id,
                   o_.spec.stop_grace_ms);
        r.proc->Kill();
      }
    } else if (r.restart_at && now >= *r.restart_at && !shutting_down_) {
      Launch(r);
    }
    if (!r.proc && r.remove_on_exit) forget.push_back(id);
  }
  for (auto& id : forget) {
    CollectReports(actors_[id], &retired_reports_);
    actors_.erase(id);
    directory_dirty_ = true;
  }
  Reconcile();
}

void Head::Impl::WriteFailed(const std::string& path) {
  if (write_failed_) return;
  write_failed_ = true;
  const std::string why = "cannot write " + path + ": " + std::strerror(errno) +
                          " (the run folder is full or not writable)";
  Log().error("{}; stopping the job", why);
  {
    MutexLock g(summary_mu_);
    if (summary_.failure.empty()) summary_.failure = why;
  }
  BeginShutdown(why, false);
}

void Head::Impl::BeginShutdown(const std::string& why, bool stopped) {
  if (shutting_down_) return;
  shutting_down_ = true;
  {
    MutexLock g(summary_mu_);
    summary_.stopped = stopped;
  }
  Log().info("shutting down: {}", why);
  // Phase 1: the learner checkpoints and exits (it is gone already when it finished the job).
  shutdown_phase_ = 1;
  shutdown_phase_at_ = Clock::now();
  for (auto& [id, r] : actors_) {
    r.restart_at.reset();
    if (r.role == "learner" && r.alive()) {
      r.expect_exit = true;
      SetState(r, ActorState::STOPPING);
      SendControl(r, 2 /*stop*/);
    }
  }
}

void Head::Impl::ShutdownTick() {
  auto now = Clock::now();
  const auto grace = std::chrono::milliseconds(o_.spec.stop_grace_ms);
  bool learner_alive = false;
  bool any_alive = false;
  for (auto& [id, r] : actors_) {
    if (r.proc) {
      if (auto e = r.proc->Poll()) OnProcessExit(r, *e);
    }
    if (r.proc) {
      any_alive = true;
      if (r.role == "learner") learner_alive = true;
    }
  }
  if (stop_requests_.load() >= 2 + stop_requests_seen_offset_) {
    // Second Ctrl-C / stop: no more waiting.
    for (auto& [id, r] : actors_)
      if (r.proc) r.proc->Kill();
  }
  if (shutdown_phase_ == 1 && (!learner_alive || now - shutdown_phase_at_ > grace)) {
    if (learner_alive) {
      Log().warn("learner did not stop within {} ms; killing it", o_.spec.stop_grace_ms);
      for (auto& [id, r] : actors_)
        if (r.proc && r.role == "learner") r.proc->Kill();
    }
    // Phase 2: everyone else drains (flushes acks, reports final counters) and exits.
    shutdown_phase_ = 2;
    shutdown_phase_at_ = now;
    for (auto& [id, r] : actors_) {
      if (r.proc && r.role != "learner") {
        r.expect_exit = true;
        SetState(r, ActorState::DRAINING);
        SendControl(r, 4 /*drain*/);
      }
    }
  } else if (shutdown_phase_ == 2 && any_alive && now - shutdown_phase_at_ > grace) {
    Log().warn("actors still running {} ms after drain; killing them", o_.spec.stop_grace_ms);
    for (auto& [id, r] : actors_)
      if (r.proc) r.proc->Kill();
    shutdown_phase_ = 3;
    shutdown_phase_at_ = now;
  } else if (shutdown_phase_ == 3 && any_alive && now - shutdown_phase_at_ > grace) {
    // Processes that ignore SIGKILL do not exist; this is a remote node we cannot reach.
    Log().error("some actors could not be confirmed dead; giving up on them");
    for (auto& [id, r] : actors_) r.proc.reset();
    any_alive = false;
  }
  if (shutdown_phase_ >= 2 && !any_alive) finished_ = true;
}

// ------------------------------------------------------------------ messages

// The actor id of a peer at the control socket ("<id>#<incarnation hex>"; a
// CLI client's id has no '#').
static std::string ActorIdOf(const std::string& peer) {
  return peer.substr(0, peer.find('#'));
}

void Head::Impl::SendTo(const std::string& peer, const OutMessage& m) {
  Status s = control_->SendTo(peer, m, Deadline::InMs(50));
  if (!s.ok()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::debug, 2000, "send to {} failed: {}", peer,
                        s.ToString());
  }
}

// `incarnation`: the process the shutdown is for. An actor back from a
// partition shares its id (the routing identity) with its replacement, so the
// message may reach either; the replacement ignores one meant for the other.
void Head::Impl::SendShutdown(const std::string& peer, const char* why, uint64_t incarnation) {
  OutMessage m;
  auto c = m.envelope().getBody().initControl();
  c.setRequestId(0);
  c.setTargetIncarnation(incarnation);
  c.getCommand().setShutdown();
  SendTo(peer, m);
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::info, 1000, "told {} to shut down: {}", peer, why);
}

void Head::Impl::SendControl(Record& r, int command) {
  if (!r.registered()) return;  // it will be told when it registers
  OutMessage m;
  auto c = m.envelope().getBody().initControl();
  c.setRequestId(0);
  c.setTargetIncarnation(r.incarnation);
  switch (command) {
    case 2:
      c.getCommand().setStop();
      break;
    case 4:
      c.getCommand().setDrain();
      break;
    case 5:
      c.getCommand().setCheckpoint();
      break;
    default:
      c.getCommand().setShutdown();
      break;
  }
  SendTo(r.peer(), m);
}

void Head::Impl::FillActor(wire::ActorInfo::Builder b, const Record& r) const {
  b.setActorId(r.id);
  b.setRole(transport::RoleFromName(r.role).value_or(wire::Role::UNKNOWN));
  b.setNode(r.node);
  b.setPid(r.pid);
  b.setState(r.state);
  auto eps = b.initEndpoints(static_cast<unsigned>(r.endpoints.size()));
  for (size_t i = 0; i < r.endpoints.size(); ++i) {
    eps[static_cast<unsigned>(i)].setName(r.endpoints[i].first);
    eps[static_cast<unsigned>(i)].setAddress(r.endpoints[i].second);
  }
  b.setPolicyVersion(r.policy_version);
  b.setRestarts(r.restarts);
  b.setLastHeartbeatNs(r.last_heartbeat_ns);
  auto st = b.initStats(static_cast<unsigned>(r.stats.size()));
  unsigned i = 0;
  for (auto& [k, v] : r.stats) {
    st[i].setName(k);
    st[i].setValue(v);
    ++i;
  }
}

void Head::Impl::BroadcastDirectory() {
  ++directory_epoch_;
  OutMessage m;
  auto d = m.envelope().getBody().initDirectory();
  d.setEpoch(directory_epoch_);
  std::vector<const Record*> listed;
  for (auto& [id, r] : actors_)
    if (r.registered() && r.alive()) listed.push_back(&r);
  auto list = d.initActors(static_cast<unsigned>(listed.size()));
  for (size_t i = 0; i < listed.size(); ++i) FillActor(list[static_cast<unsigned>(i)], *listed[i]);
  for (auto* r : listed) SendTo(r->peer(), m);
  directory_dirty_ = false;
  last_directory_ = Clock::now();
}

void Head::Impl::OnRegister(const std::string& peer, const transport::InMessage& m) {
  auto reg = m.envelope().getBody().getRegister();
  std::string id = reg.getActorId();
  Record* r = Find(id);
  if (!r || id != ActorIdOf(peer)) {
    SendShutdown(peer, "unknown actor (not started by this head)", m.incarnation());
    return;
  }
  if (r->registered() && r->incarnation != m.incarnation()) {
    // A replaced incarnation (e.g. back from a partition) must not run twice.
    if (r->alive() &&
        Clock::now() - r->last_heard < std::chrono::milliseconds(o_.spec.heartbeat_timeout_ms)) {
      SendShutdown(peer, "another incarnation of this actor is registered", m.incarnation());
      return;
    }
  }
  if (!r->alive() || r->expect_exit) {
    SendShutdown(peer, "actor is not expected to run", m.incarnation());
    return;
  }
  r->incarnation = m.incarnation();
  r->route = peer;
  r->node = reg.getNode();
  r->pid = reg.getPid();
  r->policy_version = reg.getPolicyVersion();
  r->endpoints.clear();
  for (auto e : reg.getEndpoints()) r->endpoints.emplace_back(e.getName(), e.getAddress());
  r->last_heard = Clock::now();
  r->last_heartbeat_ns = WallTimeNs();
  SetState(*r, ActorState::READY);
  directory_dirty_ = true;
  Log().info("{} registered (node {}, pid {}, {} endpoints)", id, r->node, r->pid,
             r->endpoints.size());
  if (r->remove_on_exit) SendControl(*r, 4);
  if (shutting_down_) SendControl(*r, r->role == "learner" ? 2 : 4);
}

void Head::Impl::OnHeartbeat(const std::string& peer, const transport::InMessage& m) {
  Record* r = Find(ActorIdOf(peer));
  if (!r || !r->alive()) {
    SendShutdown(peer, "unknown or replaced actor", m.incarnation());
    return;
  }
  if (!r->registered()) return;  // registration in flight; ignore
  if (r->incarnation != m.incarnation()) {
    SendShutdown(peer, "replaced incarnation", m.incarnation());
    return;
  }
  auto hb = m.envelope().getBody().getHeartbeat();
  r->last_heard = Clock::now();
  r->last_heartbeat_ns = WallTimeNs();
  r->policy_version = hb.getPolicyVersion();
  auto st = hb.getState();
  if (!r->expect_exit && (st == ActorState::READY || st == ActorState::BUSY)) SetState(*r, st);
  if (st == ActorState::DRAINING && r->state != ActorState::DRAINING) SetState(*r, st);
  r->stats.clear();
  for (auto s : hb.getStats()) r->stats[s.getName()] = s.getValue();
  // Answer, so the actor knows the head is alive.
  OutMessage reply;
  auto b = reply.envelope().getBody().initHeartbeat();
  b.setState(ActorState::READY);
  b.setPolicyVersion(directory_epoch_);
  SendTo(peer, reply);
}

void Head::Impl::OnLog(const transport::InMessage& m) {
  std::string sender(m.sender());
  Record* r = Find(sender);
  if (!r) return;
  if (!r->log) r->log = std::make_unique<std::ofstream>(o_.run.log_file(sender), std::ios::app);
  auto rec = m.envelope().getBody().getLogRecord();
  if (rec.getLevel() >= spdlog::level::err) r->last_error = rec.getText();
  *r->log << rec.getText().cStr() << '\n';
  r->log->flush();
  if (!*r->log) WriteFailed(o_.run.log_file(sender));
}

void Head::Impl::OnMetrics(const transport::InMessage& m) {
  auto mt = m.envelope().getBody().getMetrics();
  std::string sender(m.sender());
  if (Record* r = Find(sender); r && r->incarnation != m.incarnation()) {
    // A replaced incarnation (e.g. back from a partition): its numbers were
    // already accounted from its last heartbeat; a late report would count twice.
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::info, 2000,
                        "ignoring metrics from a replaced incarnation of {}", sender);
    return;
  }
  std::string kind = mt.getKind();
  if (kind == "rollouts") {
    // Sampled sequences go to rollouts.jsonl, not metrics.jsonl.
    if (telemetry_ && mt.hasJson())
      telemetry_->OnRollouts(sender, m.envelope().getSendTimeNs(), mt.getJson());
    return;
  }
  nlohmann::json j;
  j["time_ns"] = m.envelope().getSendTimeNs();
  j["actor"] = sender;
  j["kind"] = kind;
  j["step"] = mt.getStep();
  j["policy_version"] = mt.getPolicyVersion();
  std::map<std::string, double> stats;
  for (auto s : mt.getStats()) {
    stats[s.getName()] = s.getValue();
    std::string key = s.getName();
    // A figure named like a record key must not overwrite it: the trainer's own
    // "step" counts optimizer updates with the warm start's, the record's is the RL update.
    if (key == "step" || key == "kind" || key == "actor" || key == "time_ns" ||
        key == "policy_version")
      key = key == "step" ? "optimizer_step" : "stat_" + key;
    if (std::isfinite(s.getValue())) j[key] = s.getValue();
  }
  if (mt.hasJson() && mt.getJson().size() > 0) {
    auto extra = nlohmann::json::parse(std::string(mt.getJson()), nullptr, false);
    if (!extra.is_discarded()) j["extra"] = extra;
  }
  metrics_ << j.dump() << '\n';
  metrics_.flush();
  if (!metrics_) WriteFailed(o_.run.metrics());
  if (telemetry_) telemetry_->OnMetricsLine(j);
  if (kind == "final") {
    if (Record* r = Find(sender)) r->final_report = stats;
  } else if (kind == "summary") {
    MutexLock g(summary_mu_);
    summary_.learner_summary = stats;
  }
  progress_.OnMetrics(kind, mt.getStep(), stats);
  if (o_.print) {
    for (auto& line : progress_.TakeLines()) o_.print(line);
  }
}

void Head::Impl::OnControl(const std::string& peer, const transport::InMessage& m) {
  auto c = m.envelope().getBody().getControl();
  OutMessage out;
  auto rep = out.envelope().getBody().initControlReply();
  rep.setRequestId(c.getRequestId());
  rep.setRunDir(o_.run.path);
  rep.setOk(true);
  auto cmd = c.getCommand();
  switch (cmd.which()) {
    case wire::Control::Command::STATUS:
    case wire::Control::Command::RUN_INFO: {
      std::vector<const Record*> all;
      for (auto& [id, r] : actors_) all.push_back(&r);
      auto list = rep.initActors(static_cast<unsigned>(all.size()));
      for (size_t i = 0; i < all.size(); ++i) FillActor(list[static_cast<unsigned>(i)], *all[i]);
      auto prog = progress_.Stats();
      auto pl = rep.initProgress(static_cast<unsigned>(prog.size()));
      unsigned i = 0;
      for (auto& [k, v] : prog) {
        pl[i].setName(k);
        pl[i].setValue(v);
        ++i;
      }
      rep.setMessage(o_.job_name + (shutting_down_ ? " (stopping)" : " (running)"));
      break;
    }
    case wire::Control::Command::SCALE: {
      auto sc = cmd.getScale();
      std::string role = transport::RoleName(sc.getRole());
      if (role != "rollout" && role != "reward" && role != "echo") {
        rep.setOk(false);
        rep.setError("only rollout and reward actors can be scaled, not '" + role + "'");
      } else if (shutting_down_) {
        rep.setOk(false);
        rep.setError("the job is stopping");
      } else if (desired_.count(role) == 0) {
        rep.setOk(false);
        rep.setError("this job has no '" + role + "' role");
      } else if (sc.getCount() == 0 && role != "echo") {
        rep.setOk(false);
        rep.setError("a job needs at least one " + role + " actor");
      } else {
        uint32_t before = desired_[role];
        desired_[role] = sc.getCount();
        Reconcile();
        rep.setMessage("scaled " + role + " from " + std::to_string(before) + " to " +
                       std::to_string(sc.getCount()));
        Log().info("scale {}: {} -> {} (requested by {})", role, before, sc.getCount(), peer);
      }
      break;
    }
    case wire::Control::Command::STOP:
      BeginShutdown("stop requested by " + peer, true);
      rep.setMessage("stopping: the learner checkpoints, then every actor exits");
      break;
    default:
      rep.setOk(false);
      rep.setError("unsupported command for the head");
  }
  SendTo(peer, out);
}

void Head::Impl::Handle(const transport::Incoming& in) {
  const auto& m = in.message;
  switch (m.kind()) {
    case transport::MessageKind::REGISTER:
      OnRegister(in.peer, m);
      break;
    case transport::MessageKind::HEARTBEAT:
      OnHeartbeat(in.peer, m);
      break;
    case transport::MessageKind::LOG_RECORD:
      OnLog(m);
      break;
    case transport::MessageKind::METRICS:
      OnMetrics(m);
      break;
    case transport::MessageKind::CONTROL:
      OnControl(in.peer, m);
      break;
    case transport::MessageKind::CONTROL_REPLY:
      break;
    default:
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "ignoring {} message from {}",
                          transport::KindName(m.kind()), in.peer);
  }
}

void Head::Impl::HandleMessages() {
  for (int i = 0; i < 10000; ++i) {
    auto in = control_->Recv(Deadline::Now());
    if (!in.ok()) {
      if (transport::IsBadInput(in.status())) continue;  // counted and logged by the transport
      return;
    }
    Handle(*in);
  }
}

// ------------------------------------------------------------------ run loop

Status Head::Impl::Run() {
  Reconcile();
  auto last_progress = Clock::now();
  while (!finished_) {
    auto r = poller_->Wait(Deadline::InMs(50));
    (void)r;
    HandleMessages();
    int stops = stop_requests_.load();
    if (stops > stop_requests_seen_) {
      stop_requests_seen_ = stops;
      if (!shutting_down_) {
        stop_requests_seen_offset_ = stops - 1;
        BeginShutdown("interrupted", true);
      }
    }
    if (shutting_down_) {
      ShutdownTick();
    } else {
      Tick();
    }
    auto now = Clock::now();
    if (directory_dirty_ && now - last_directory_ > std::chrono::milliseconds(20))
      BroadcastDirectory();
    if (now - last_progress > std::chrono::milliseconds(500)) {
      last_progress = now;
      std::map<std::string, double> gen;
      double tok_s = 0;
      for (auto& [id, rec] : actors_) {
        auto it = rec.stats.find("gen_tokens_per_s");
        if (it != rec.stats.end() && rec.alive()) tok_s += it->second;
      }
      progress_.SetGenerationRate(tok_s);
      if (o_.print && o_.live_progress) o_.print(progress_.Line());
    }
    if (telemetry_ && telemetry_->Due()) {
      if (auto line = telemetry_->Tick(Snapshot(), progress_.Stats(), JobState())) {
        metrics_ << line->dump() << '\n';
        metrics_.flush();
        if (!metrics_) WriteFailed(o_.run.metrics());
        telemetry_->OnMetricsLine(*line);
      }
    }
  }
  // Drain what the actors said last (final reports).
  HandleMessages();
  WriteSummary();
  MutexLock g(summary_mu_);
  if (!summary_.failure.empty()) return Internal("{}", summary_.failure);
  return Status::Ok();
}

void Head::Impl::CollectReports(const Record& r, std::vector<IncarnationReport>* out) const {
  for (const auto& [source, d] : r.dead_reports)
    out->push_back({source, d, IncarnationReport::Kind::kDead, r.role});
  if (r.incarnation == 0) return;  // never registered, or its death is recorded above
  if (!r.final_report.empty())
    out->push_back({r.source(), r.final_report, IncarnationReport::Kind::kFinal, r.role});
  else if (!r.stats.empty())  // alive, or ended without its final report
    // A producer that ended without one may have sent more than its last
    // stats say; the learner's and reward actor's counters are cumulative.
    out->push_back({r.source(), r.stats,
                    r.alive() || !r.stats.count("generated") ? IncarnationReport::Kind::kFinal
                                                             : IncarnationReport::Kind::kDead,
                    r.role});
}

void Head::Impl::WriteSummary() {
  std::vector<IncarnationReport> reports = retired_reports_;
  for (const auto& [id, r] : actors_) CollectReports(r, &reports);
  const Accounting acc = SumAccounting(reports);
  MutexLock g(summary_mu_);
  summary_.accounting = acc.terms;
  summary_.accounting_problems = acc.problems;
  nlohmann::json j;
  j["kind"] = "job_summary";
  j["completed"] = summary_.completed;
  j["stopped"] = summary_.stopped;
  j["failure"] = summary_.failure;
  j["accounting"] = acc.terms;
  j["accounting_holds"] = acc.holds();
  j["accounting_problems"] = acc.problems;
  j["learner"] = summary_.learner_summary;
  metrics_ << j.dump() << '\n';
  metrics_.flush();
  // (The job is over: a summary that cannot be written is printed anyway.)
  if (!metrics_ && o_.print) o_.print("cannot write the job summary to " + o_.run.metrics());
  if (telemetry_) {
    telemetry_->OnMetricsLine(j);
    telemetry_->Finish(Snapshot(), progress_.Stats(),
                       !summary_.failure.empty() ? "failed"
                       : summary_.stopped        ? "stopped"
                                                 : "finished");
  }
  if (o_.print) {
    for (auto& line : progress_.SummaryLines(summary_.learner_summary, acc)) o_.print(line);
  }
}

std::string Head::Impl::JobState() const {
  return shutting_down_ ? "stopping" : "running";
}

std::vector<ActorStatus> Head::Impl::Snapshot() const {
  std::vector<ActorStatus> out;
  for (auto& [id, r] : actors_) {
    ActorStatus s;
    s.id = r.id;
    s.role = r.role;
    s.node = r.node;
    s.state = transport::StateName(r.state);
    s.pid = r.pid;
    s.policy_version = r.policy_version;
    s.restarts = r.restarts;
    s.last_heartbeat_ns = r.last_heartbeat_ns;
    s.stats = r.stats;
    for (const auto& [name, address] : r.endpoints) s.endpoints[name] = address;
    out.push_back(std::move(s));
  }
  return out;
}

// ------------------------------------------------------------------ facade

Head::Head(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Head::~Head() = default;

Result<std::unique_ptr<Head>> Head::Create(HeadOptions options,
                                           std::unique_ptr<transport::Network> network,
                                           std::unique_ptr<Spawner> spawner) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(network), std::move(spawner));
  TROUPE_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Head>(new Head(std::move(impl)));
}

const std::string& Head::endpoint() const {
  return impl_->endpoint();
}
std::string Head::dashboard_url() const {
  return impl_->dashboard_url();
}
Status Head::Run() {
  return impl_->Run();
}
void Head::RequestStop() {
  impl_->RequestStop();
}
JobSummary Head::summary() const {
  return impl_->summary();
}
std::vector<ActorStatus> Head::actors() const {
  return impl_->Snapshot();
}

}  // namespace troupe::launcher
