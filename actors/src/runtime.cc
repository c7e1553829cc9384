#include "troupe/actors/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <spdlog/sinks/base_sink.h>

#include "troupe/core/log.h"
#include "troupe/core/text.h"
#include "troupe/core/thread_name.h"
#include "troupe/transport/message.h"
#include "troupe/transport/wire_names.h"

namespace troupe::actors {

namespace {
spdlog::logger& Log() {
  return log::Get("actors");
}

int64_t NowMs() {
  return std::chrono::duration_cast<Millis>(Clock::now().time_since_epoch()).count();
}
}  // namespace

const char* ExitReasonName(ExitReason r) {
  switch (r) {
    case ExitReason::kNone:
      return "none";
    case ExitReason::kStop:
      return "stop";
    case ExitReason::kDrain:
      return "drain";
    case ExitReason::kShutdown:
      return "shutdown";
    case ExitReason::kSignal:
      return "signal";
    case ExitReason::kHeadLost:
      return "head lost";
    case ExitReason::kError:
      return "error";
  }
  return "?";
}

std::vector<PeerInfo> DirectorySnapshot::Live(const std::string& role) const {
  std::vector<PeerInfo> out;
  for (const auto& a : actors) {
    auto s = static_cast<wire::ActorState>(a.state);
    if (a.role == role && (s == wire::ActorState::READY || s == wire::ActorState::BUSY))
      out.push_back(a);
  }
  return out;
}

const PeerInfo* DirectorySnapshot::Find(const std::string& id) const {
  for (const auto& a : actors)
    if (a.id == id) return &a;
  return nullptr;
}

// Ships log lines to the head: formats each record and queues a LogRecord.
class ActorRuntime::LogSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LogSink(ActorRuntime* rt) : rt_(rt) {}
  void Detach() {
    std::lock_guard<std::mutex> g(mutex_);
    rt_ = nullptr;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!rt_) return;
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string text(buf.data(), buf.size());
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    transport::OutMessage m;
    auto r = m.envelope().getBody().initLogRecord();
    r.setTimeNs(
        std::chrono::duration_cast<std::chrono::nanoseconds>(msg.time.time_since_epoch()).count());
    r.setLevel(static_cast<uint8_t>(msg.level));
    r.setLogger(std::string(msg.logger_name.data(), msg.logger_name.size()));
    r.setText(text);
    bool first;
    {
      MutexLock l(rt_->mu_);
      if (rt_->outbox_.size() >= rt_->options_.max_pending_logs) {
        rt_->outbox_.erase(rt_->outbox_.begin());
        rt_->logs_dropped_.fetch_add(1);
      }
      first = rt_->outbox_.empty();
      rt_->outbox_.push_back(std::move(m));
    }
    if (first) rt_->poller_->Wake();  // the loop sends it now (later ones go with it)
  }
  void flush_() override {}

 private:
  ActorRuntime* rt_;
};

ActorRuntime::ActorRuntime(RuntimeOptions options, transport::Network* network)
    : options_(std::move(options)), network_(network) {}

Result<std::unique_ptr<ActorRuntime>> ActorRuntime::Create(RuntimeOptions options,
                                                           transport::Network* network) {
  if (options.actor_id.empty()) return InvalidArgument("actor runtime: empty actor id");
  if (options.head_endpoint.empty()) return InvalidArgument("actor runtime: no head endpoint");
  if (options.heartbeat_interval_ms == 0)
    return InvalidArgument("actor runtime: heartbeat_interval_ms must be > 0");
  std::unique_ptr<ActorRuntime> rt(new ActorRuntime(std::move(options), network));
  transport::SocketOptions so;
  // "<id>#<incarnation>": the head tells incarnations apart (one back from a
  // partition is never confused with its replacement).
  so.identity = fmt::format("{}#{:x}", rt->options_.actor_id, network->identity().incarnation);
  so.linger_ms = 500;
  so.heartbeat_ivl_ms = 0;  // liveness is ours (heartbeats), not ZMTP's
  auto sock = network->Connect(transport::SocketKind::kClient, rt->options_.head_endpoint, so);
  if (!sock.ok()) return sock.status().WithContext("connect to head " + rt->options_.head_endpoint);
  rt->head_ = std::move(sock).value();
  rt->poller_ = network->NewPoller();
  rt->poller_->Add(rt->head_.get());
  rt->last_head_ms_ = NowMs();
  if (rt->options_.forward_logs) {
    rt->sink_ = std::make_shared<LogSink>(rt.get());
    log::AddSink(rt->sink_);
  }
  rt->thread_ = std::thread([p = rt.get()] {
    SetThreadName("actor-runtime");
    p->Loop();
  });
  return rt;
}

ActorRuntime::~ActorRuntime() {
  if (sink_) {
    log::RemoveSink(sink_);
    sink_->Detach();
  }
  Flush(Deadline::InMs(1000));
  stop_thread_ = true;
  cv_.notify_all();
  poller_->Wake();
  if (thread_.joinable()) thread_.join();
  poller_.reset();
  head_.reset();
}

void ActorRuntime::AddEndpoint(const std::string& name, const std::string& address) {
  MutexLock l(mu_);
  endpoints_.emplace_back(name, address);
}

Status ActorRuntime::SendRegister() {
  transport::OutMessage m;
  auto r = m.envelope().getBody().initRegister();
  r.setActorId(options_.actor_id);
  r.setRole(transport::RoleFromName(options_.role).value_or(wire::Role::UNKNOWN));
  r.setNode(HostName());
  r.setPid(::getpid());
  r.setPolicyVersion(policy_version_.load());
  r.setRestarts(options_.restarts);
  {
    MutexLock l(mu_);
    auto eps = r.initEndpoints(static_cast<unsigned>(endpoints_.size()));
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      eps[static_cast<unsigned>(i)].setName(endpoints_[i].first);
      eps[static_cast<unsigned>(i)].setAddress(endpoints_[i].second);
    }
  }
  return head_->Send(m, Deadline::InMs(1000));
}

Status ActorRuntime::Register(Deadline deadline) {
  Deadline limit = deadline.min(Deadline::InMs(options_.register_timeout_ms));
  // From here on the head's silence counts (it may die before it acknowledges).
  if (!registering_.exchange(true)) last_head_ms_ = NowMs();
  // Re-send periodically: the head may not be listening yet.
  while (true) {
    Status s = SendRegister();
    if (!s.ok()) Log().debug("register send: {}", s.ToString());
    MutexLock l(mu_);
    bool done = cv_.wait_until(
        l, std::min(limit.at(), Clock::now() + std::chrono::milliseconds(1000)),
        [&]() TROUPE_REQUIRES(mu_) { return registered_ || !refusal_.empty() || should_exit(); });
    if (registered_) return Status::Ok();
    if (!refusal_.empty()) return Unavailable("the head refused registration: {}", refusal_);
    if (should_exit())
      return Cancelled("exit requested while registering ({})", ExitReasonName(exit_reason()));
    if (!done && limit.expired()) {
      return Timeout("no answer from the head at {} within {} ms", options_.head_endpoint,
                     std::chrono::duration_cast<Millis>(limit.at() - Clock::now()).count() + 0);
    }
  }
}

DirectorySnapshot ActorRuntime::directory() const {
  MutexLock l(mu_);
  return directory_;
}

uint64_t ActorRuntime::WaitDirectory(uint64_t seen_epoch, Deadline deadline) const {
  MutexLock l(mu_);
  cv_.wait_until(l, deadline.at(), [&]() TROUPE_REQUIRES(mu_) {
    return directory_.epoch > seen_epoch || should_exit();
  });
  return directory_.epoch;
}

void ActorRuntime::OnDirectory(std::function<void(const DirectorySnapshot&)> callback) {
  MutexLock l(mu_);
  on_directory_ = std::move(callback);
}

void ActorRuntime::SetStat(const std::string& name, double value) {
  MutexLock l(mu_);
  stats_[name] = value;
}

void ActorRuntime::SetStats(const std::map<std::string, double>& stats) {
  MutexLock l(mu_);
  for (auto& [k, v] : stats) stats_[k] = v;
}

void ActorRuntime::SetPolicyVersion(uint64_t version) {
  policy_version_ = version;
}

void ActorRuntime::SendMetrics(const std::string& kind, uint64_t step, uint64_t policy_version,
                               const std::map<std::string, double>& stats,
                               const std::string& json) {
  transport::OutMessage m;
  auto b = m.envelope().getBody().initMetrics();
  b.setStep(step);
  b.setPolicyVersion(policy_version);
  b.setKind(kind);
  auto list = b.initStats(static_cast<unsigned>(stats.size()));
  unsigned i = 0;
  for (auto& [k, v] : stats) {
    list[i].setName(k);
    list[i].setValue(v);
    ++i;
  }
  if (!json.empty()) b.setJson(json);
  bool first;
  {
    MutexLock l(mu_);
    first = outbox_.empty();
    outbox_.push_back(std::move(m));
  }
  cv_.notify_all();
  if (first) poller_->Wake();  // the loop sends it now (later ones go with it)
}

void ActorRuntime::RequestExit(ExitReason reason) {
  ExitReason none = ExitReason::kNone;
  if (reason_.compare_exchange_strong(none, reason)) {
    Log().info("exiting: {}", ExitReasonName(reason));
  }
  cv_.notify_all();
  poller_->Wake();  // the loop's heartbeat reports the new state at once
}

bool ActorRuntime::WaitExit(Deadline deadline) const {
  MutexLock l(mu_);
  return cv_.wait_until(l, deadline.at(), [&] { return should_exit(); });
}

void ActorRuntime::Flush(Deadline deadline) {
  while (!deadline.expired()) {
    {
      MutexLock l(mu_);
      if (outbox_.empty()) return;
    }
    SendQueued();
    {
      MutexLock l(mu_);
      if (outbox_.empty()) return;
    }
    std::this_thread::yield();
  }
}

void ActorRuntime::SendQueued() {
  std::vector<transport::OutMessage> batch;
  {
    MutexLock l(mu_);
    batch.swap(outbox_);
  }
  size_t sent = 0;
  for (; sent < batch.size(); ++sent) {
    Status s = head_->Send(batch[sent], Deadline::InMs(20));
    if (!s.ok()) break;  // head busy or gone: keep the rest (bounded below)
  }
  if (sent < batch.size()) {
    MutexLock l(mu_);
    outbox_.insert(outbox_.begin(),
                   std::make_move_iterator(batch.begin() + static_cast<long>(sent)),
                   std::make_move_iterator(batch.end()));
    while (outbox_.size() > options_.max_pending_logs) {
      outbox_.erase(outbox_.begin());
      logs_dropped_.fetch_add(1);
    }
  }
}

void ActorRuntime::SendHeartbeat() {
  transport::OutMessage m;
  auto hb = m.envelope().getBody().initHeartbeat();
  ExitReason r = reason_.load();
  hb.setState(r == ExitReason::kDrain  ? wire::ActorState::DRAINING
              : r == ExitReason::kNone ? wire::ActorState::READY
                                       : wire::ActorState::STOPPING);
  hb.setPolicyVersion(policy_version_.load());
  MutexLock l(mu_);
  stats_["log_lines_dropped"] = static_cast<double>(logs_dropped_.load());
  // What every socket of this process sent, received and refused (garbage,
  // oversized or wrong-schema messages, CURVE handshakes without the job's
  // keys): operators see rejected input in `troupe status --stats`. Reasons
  // that never happened are left out.
  for (const auto& [k, v] : network_->counters().ToStats()) {
    if (v == 0 && k.rfind("transport.rejected.", 0) == 0) continue;
    stats_[k] = static_cast<double>(v);
  }
  auto list = hb.initStats(static_cast<unsigned>(stats_.size()));
  unsigned i = 0;
  for (auto& [k, v] : stats_) {
    list[i].setName(k);
    list[i].setValue(v);
    ++i;
  }
  Status s = head_->Send(m, Deadline::InMs(50));
  (void)s;  // a lost heartbeat is harmless; silence is detected by the head
}

void ActorRuntime::HandleHeadMessage(const transport::InMessage& m) {
  last_head_ms_ = NowMs();
  switch (m.kind()) {
    case transport::MessageKind::DIRECTORY: {
      auto d = m.envelope().getBody().getDirectory();
      DirectorySnapshot snap;
      snap.epoch = d.getEpoch();
      for (auto a : d.getActors()) {
        PeerInfo p;
        p.id = a.getActorId();
        p.role = transport::RoleName(a.getRole());
        p.node = a.getNode();
        p.state = static_cast<int>(a.getState());
        p.policy_version = a.getPolicyVersion();
        for (auto e : a.getEndpoints()) p.endpoints[e.getName()] = e.getAddress();
        snap.actors.push_back(std::move(p));
      }
      std::function<void(const DirectorySnapshot&)> cb;
      {
        MutexLock l(mu_);
        if (snap.epoch <= directory_.epoch) return;
        directory_ = snap;
        if (snap.Find(options_.actor_id)) registered_ = true;
        cb = on_directory_;
      }
      cv_.notify_all();
      if (cb) cb(snap);
      return;
    }
    case transport::MessageKind::HEARTBEAT:
      return;  // the head is alive
    case transport::MessageKind::CONTROL: {
      auto ctl = m.envelope().getBody().getControl();
      if (ctl.getTargetIncarnation() != 0 &&
          ctl.getTargetIncarnation() != network_->identity().incarnation) {
        // Meant for another incarnation of this actor id (one back from a
        // partition shares our routing identity at the head): not for us.
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::info, 2000,
                            "ignoring a head command for another incarnation of {}",
                            options_.actor_id);
        return;
      }
      auto cmd = ctl.getCommand();
      switch (cmd.which()) {
        case wire::Control::Command::STOP:
          RequestExit(ExitReason::kStop);
          break;
        case wire::Control::Command::DRAIN:
          RequestExit(ExitReason::kDrain);
          break;
        case wire::Control::Command::CHECKPOINT:
          checkpoint_requested_ = true;
          break;
        case wire::Control::Command::SHUTDOWN: {
          bool was_registered;
          {
            MutexLock l(mu_);
            was_registered = registered_;
            if (!registered_) refusal_ = "told to shut down";
          }
          (void)was_registered;
          RequestExit(ExitReason::kShutdown);
          break;
        }
        default:
          break;
      }
      cv_.notify_all();
      return;
    }
    default:
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "unexpected {} from the head",
                          transport::KindName(m.kind()));
  }
}

// Sleeps until a head message, queued metrics or logs (Wake), an exit request, the next
// heartbeat, or at most kLoopIdleMs (the head-silence checks): no fixed fast tick, so an idle
// actor wakes a few times a second, not 50 (every wake-up of a small thread can preempt a
// busy engine or learner thread on 2 cores).
void ActorRuntime::Loop() {
  constexpr int64_t kLoopIdleMs = 250;
  auto next_hb = Clock::now();
  int64_t head_lost_ms = 0;  // when the head was declared lost (0: it is not)
  while (!stop_thread_.load()) {
    bool registered;
    {
      MutexLock l(mu_);
      registered = registered_;
    }
    auto wait_until = std::min(next_hb, Clock::now() + std::chrono::milliseconds(kLoopIdleMs));
    (void)poller_->Wait(Deadline(wait_until));
    for (int i = 0; i < 1000; ++i) {
      auto in = head_->Recv(Deadline::Now());
      if (!in.ok()) {
        if (transport::IsBadInput(in.status())) continue;
        break;
      }
      HandleHeadMessage(in->message);
    }
    if (registered && Clock::now() >= next_hb) {
      SendHeartbeat();
      next_hb = Clock::now() + std::chrono::milliseconds(options_.heartbeat_interval_ms);
    }
    SendQueued();
    // Registering implies the head's silence counts (registered implies registering).
    if (registering_.load() &&
        NowMs() - last_head_ms_.load() > static_cast<int64_t>(options_.head_grace_ms)) {
      if (!should_exit()) {
        Log().error("the head has been silent for {} ms (grace {} ms): exiting",
                    NowMs() - last_head_ms_.load(), options_.head_grace_ms);
      }
      RequestExit(ExitReason::kHeadLost);
      if (head_lost_ms == 0) head_lost_ms = NowMs();
    }
    // The backstop of "no orphans": a role stuck after the head is gone (e.g.
    // in a collective whose peers exited) does not keep the process alive.
    const int64_t hard_ms = std::max<int64_t>(options_.head_grace_ms, 5000);
    if (head_lost_ms != 0 && NowMs() - head_lost_ms > hard_ms) {
      Log().error("still running {} ms after losing the head: ending the process now",
                  NowMs() - head_lost_ms);
      log::Flush();
      std::_Exit(3);
    }
  }
}

}  // namespace troupe::actors
