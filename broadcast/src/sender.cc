// WeightSender: membership, epochs, catch-up and the learner's side of every
// backend (sender.h). All socket and group work happens on the service thread.
#include "troupe/broadcast/sender.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "buffer_pool.h"
#include "gloo_group.h"
#include "protocol.h"
#include "reaper.h"
#include "shm_segment.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "zmq_util.h"
#ifdef TROUPE_BROADCAST_HAVE_NCCL
#include "nccl_group.h"
#endif

namespace troupe::broadcast {
namespace {

using proto::Kind;
using proto::PeerState;

spdlog::logger& Log() {
  return log::Get("broadcast");
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  return v == 0 ? 1 : v;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

class WeightSender::Impl {
 public:
  explicit Impl(const BroadcastConfig& config)
      : config_(config),
        timeout_(config.timeout_ms),
        incarnation_(RandomIncarnation()),
        node_(config.node.empty() ? HostName() : config.node) {}

  ~Impl() { Stop(); }

  Status Start();
  void Stop();

  Status Broadcast(uint64_t version, const NamedTensors& named, Deadline deadline);
  Status WaitForMembers(size_t count, Deadline deadline);

  const std::string& endpoint() const { return endpoint_; }
  uint64_t incarnation() const { return incarnation_; }

  BroadcastReport last_report() const {
    MutexLock l(mu_);
    return last_report_;
  }
  std::vector<MemberInfo> Members() const {
    MutexLock l(mu_);
    return members_snapshot_;
  }
  uint64_t epoch() const {
    MutexLock l(mu_);
    return epoch_snapshot_;
  }
  uint64_t version() const {
    MutexLock l(mu_);
    return version_snapshot_;
  }
  SenderStats stats() const {
    MutexLock l(mu_);
    return stats_snapshot_;
  }

 private:
  struct Job {
    uint64_t version = 0;
    NamedTensors named;
    Deadline deadline = Deadline::Never();
    bool done = false;
    Status status;
    BroadcastReport report;
  };

  enum class MemberState { kNew, kReady, kMember };

  struct Member {
    std::string id;
    uint64_t incarnation = 0;
    std::string node;
    std::string data_endpoint;
    MemberState state = MemberState::kNew;
    bool leaving = false;  // asked to leave: confirm with the next epoch
    bool gone = false;     // exited, unreachable or silent: drop at the next epoch
    Clock::time_point last_seen;
    Clock::time_point next_catch_up;  // backoff after a failed catch-up
    int catch_up_failures = 0;        // consecutive; dropped after kMaxCatchUpFailures
    uint64_t acked_version = 0;
    uint64_t accepted_epoch = 0;
    uint64_t ack_transfer = 0;  // last Ack received
    uint64_t ack_version = 0;
    bool ack_ok = false;
    std::string ack_reason;
  };

  // --- service thread
  void Run();
  void PollControl(int timeout_ms);
  void HandleFrame(const std::string& identity, const std::string& payload);
  bool SendTo(const std::string& id, const proto::Bytes& bytes);
  void MaybeKeepalive();
  void CheckTimeouts();
  void RunCatchUps();
  Status CatchUp(Member& m);
  Status Reform(Deadline deadline);
  Status FormBackendGroup(uint64_t epoch, const std::vector<std::string>& members,
                          const proto::GroupMsg& group, Deadline deadline);
  void RunJob(Job& job);
  Status PackCurrent(const Job& job, BroadcastReport* report);
  Status Transfer(Deadline deadline, BroadcastReport* report);
  Status WaitAcks(const std::vector<std::string>& ids, uint64_t version, uint64_t transfer,
                  Deadline deadline);
  // `preemptible`: give up (Cancelled) as soon as a Broadcast job is waiting (catch-ups).
  Status SendStream(const std::vector<std::string>& endpoints, const Layout& layout,
                    const uint8_t* data, const std::shared_ptr<void>& owner, Deadline deadline,
                    bool preemptible = false);
  Result<ZmqSocket*> DataSocket(const std::string& endpoint);
  void CloseUnusedDataSockets();
  void DropMember(const std::string& id, const char* why);
  void MarkDirty() {
    dirty_ = true;
    ++changes_;
  }
  Member* Find(const std::string& id) {
    auto it = members_.find(id);
    return it == members_.end() ? nullptr : &it->second;
  }
  void Publish();
  proto::Header header() const { return proto::Header{config_.actor_id, incarnation_}; }
  bool stopping() {
    MutexLock l(mu_);
    return stop_;
  }
  bool job_pending() {
    MutexLock l(mu_);
    return job_ != nullptr;
  }
  static constexpr int kMaxCatchUpFailures = 5;

  const BroadcastConfig config_;
  const std::chrono::milliseconds timeout_;
  const uint64_t incarnation_;
  const std::string node_;
  std::string endpoint_;

  // Shared with API callers.
  mutable Mutex mu_;
  CondVar cv_;
  std::shared_ptr<Job> job_ TROUPE_GUARDED_BY(mu_);
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  BroadcastReport last_report_ TROUPE_GUARDED_BY(mu_);
  std::vector<MemberInfo> members_snapshot_ TROUPE_GUARDED_BY(mu_);
  size_t group_size_snapshot_ TROUPE_GUARDED_BY(mu_) = 0;
  bool group_formed_snapshot_ TROUPE_GUARDED_BY(mu_) = false;
  uint64_t epoch_snapshot_ TROUPE_GUARDED_BY(mu_) = 0;
  uint64_t version_snapshot_ TROUPE_GUARDED_BY(mu_) = 0;
  SenderStats stats_snapshot_ TROUPE_GUARDED_BY(mu_);
  Mutex broadcast_mu_;  // serialises Broadcast callers
  int wake_fd_ = -1;    // eventfd: a job is waiting
  std::thread thread_;

  // Service-thread state.
  ZmqContext ctx_;
  ZmqSocket control_;
  std::map<std::string, ZmqSocket> data_sockets_;  // by receiver data endpoint
  std::unique_ptr<GlooStore> store_;
  std::shared_ptr<GlooGroup> gloo_;
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  std::shared_ptr<NcclGroup> nccl_;
  std::string nccl_id_;
#endif
  std::shared_ptr<ShmWriter> shm_;
  int shm_slot_ = 1;             // slot of the current version
  uint64_t shm_generation_ = 0;  // its generation
  std::map<std::string, Member> members_;
  std::vector<std::string> group_;  // members of the current epoch, rank = index + 1
  uint64_t epoch_ = 0;              // current (last formed) epoch
  uint64_t epoch_counter_ = 0;      // last epoch number handed out
  bool formed_ = true;              // group_ is formed for epoch_
  bool dirty_ = false;              // membership changed since epoch_
  uint64_t changes_ = 0;            // MarkDirty() calls (detects changes during a Reform)
  Clock::time_point next_reform_;   // backoff after a failed re-formation
  Clock::time_point last_keepalive_;
  BufferPool pool_{2};
  Layout current_;  // layout of the current version
  std::shared_ptr<void> current_owner_;
  uint8_t* current_data_ = nullptr;
  bool have_current_ = false;
  uint64_t catch_up_counter_ = 0;
  SenderStats stats_;
  Reaper reaper_;
};

// ----------------------------------------------------------------- lifecycle

Status WeightSender::Impl::Start() {
  TROUPE_ASSIGN_OR_RETURN(control_, ZmqSocket::Create(ctx_, ZMQ_ROUTER));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_ROUTER_MANDATORY, 1));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_ROUTER_HANDOVER, 1));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_SNDHWM, 10000));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_RCVHWM, 10000));
  TROUPE_ASSIGN_OR_RETURN(endpoint_, control_.Bind(config_.control_endpoint));
  if (config_.backend == Backend::kGloo) {
    auto store = GlooStore::Host(config_.store_host, config_.store_port, timeout_);
    if (!store.ok()) return store.status();
    store_ = std::move(store).value();
  }
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  if (config_.backend == Backend::kNccl && NcclGroup::VisibleDevices() <= config_.nccl_device)
    return Unavailable("nccl backend: CUDA device {} is not visible ({} devices)",
                       config_.nccl_device, NcclGroup::VisibleDevices());
#endif
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return IoError("eventfd: {}", std::strerror(errno));
  Log().info("weights sender {} on {} (backend {}, incarnation {:016x}{})", config_.actor_id,
             endpoint_, BackendName(config_.backend), incarnation_,
             store_ ? ", store " + store_->address() : std::string());
  Publish();
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void WeightSender::Impl::Stop() {
  {
    MutexLock l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

void WeightSender::Impl::Run() {
  last_keepalive_ = Clock::now();
  while (!stopping()) {
    std::shared_ptr<Job> job;
    {
      MutexLock l(mu_);
      job = job_;
    }
    PollControl(job ? 0 : static_cast<int>(std::min<int64_t>(config_.heartbeat_ms, 100)));
    MaybeKeepalive();
    CheckTimeouts();
    if (job) {
      RunJob(*job);
      {
        MutexLock l(mu_);
        job->done = true;
        last_report_ = job->report;
        job_.reset();
      }
      Publish();
      cv_.notify_all();
      continue;
    }
    RunCatchUps();
    if (dirty_ && Clock::now() >= next_reform_) {
      Status st = Reform(Deadline::In(timeout_ * 2 + Millis(1000)));
      if (!st.ok()) {
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "re-forming the group: {}",
                            st.ToString());
        next_reform_ = Clock::now() + Millis(config_.heartbeat_ms);
      }
    }
    Publish();
  }
  // Goodbye: receivers forget this learner at once instead of waiting for its silence.
  for (const auto& [id, m] : members_)
    SendTo(id, proto::EncodeHeartbeat(header(), {PeerState::kExited, current_.version}));
  reaper_.Add(std::move(gloo_));
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  reaper_.Add(std::move(nccl_));
#endif
  data_sockets_.clear();
  control_.Close();
}

// ----------------------------------------------------------------- control plane

void WeightSender::Impl::PollControl(int timeout_ms) {
  zmq_pollitem_t items[2] = {{control_.get(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, 2, timeout_ms) <= 0) return;
  if (items[1].revents & ZMQ_POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof(v));
  }
  // Drain everything waiting (bounded so a flood cannot starve the rest of the loop).
  for (int i = 0; i < 10000; ++i) {
    std::string identity, payload;
    bool more = false;
    auto got = control_.TryRecv(&identity, &more);
    if (!got.ok() || !*got) return;
    if (!more) continue;  // a frame without a body: ignore
    got = control_.TryRecv(&payload, &more);
    if (!got.ok() || !*got) return;
    if (more) {
      control_.DrainMore();
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                          "dropped a control message from '{}' with extra frames", identity);
      continue;
    }
    HandleFrame(identity, payload);
  }
}

void WeightSender::Impl::HandleFrame(const std::string& identity, const std::string& payload) {
  auto msg = proto::Decode(payload.data(), payload.size());
  if (!msg.ok()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "bad message from '{}': {}", identity,
                        msg.status().ToString());
    return;
  }
  if (msg->sender != identity) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                        "message from socket '{}' claims sender '{}': ignored", identity,
                        msg->sender);
    return;
  }
  const auto now = Clock::now();
  auto it = members_.find(identity);
  if (msg->kind == Kind::kRegister) {
    if (it != members_.end() && it->second.incarnation == msg->incarnation) {
      it->second.last_seen = now;  // a repeated Register: just confirm
      SendTo(identity, proto::EncodeHeartbeat(header(), {PeerState::kAlive, current_.version}));
      return;
    }
    if (it != members_.end()) DropMember(identity, "restarted (new incarnation)");
    if (msg->reg.data_endpoint.empty()) {
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                          "receiver '{}' registered without a data endpoint: ignored", identity);
      return;
    }
    Member m;
    m.id = identity;
    m.incarnation = msg->incarnation;
    m.node = msg->reg.node;
    m.data_endpoint = msg->reg.data_endpoint;
    m.state = have_current_ ? MemberState::kNew : MemberState::kReady;
    m.last_seen = now;
    members_[identity] = m;
    if (m.state == MemberState::kReady) MarkDirty();
    Log().info("receiver {} registered from {} ({}), holding version {}{}", identity, m.node,
               m.data_endpoint, msg->reg.version, have_current_ ? "; catching up" : "");
    SendTo(identity, proto::EncodeHeartbeat(header(), {PeerState::kAlive, current_.version}));
    return;
  }
  if (it == members_.end() || it->second.incarnation != msg->incarnation) {
    // Not (or no longer) a member: tell it to register again.
    if (msg->kind == Kind::kHeartbeat && msg->heartbeat.state != PeerState::kAlive) return;
    SendTo(identity, proto::EncodeHeartbeat(header(), {PeerState::kUnknown, current_.version}));
    return;
  }
  Member& m = it->second;
  m.last_seen = now;
  switch (msg->kind) {
    case Kind::kHeartbeat:
      if (msg->heartbeat.state == PeerState::kLeaving && !m.leaving) {
        m.leaving = true;
        MarkDirty();
        Log().info("receiver {} asks to leave", m.id);
      } else if (msg->heartbeat.state == PeerState::kExited && !m.gone) {
        m.gone = true;
        MarkDirty();
        Log().info("receiver {} exited", m.id);
      }
      break;
    case Kind::kGroup:
      m.accepted_epoch = std::max(m.accepted_epoch, msg->group.epoch);
      break;
    case Kind::kAck:
      m.ack_transfer = msg->ack.transfer;
      m.ack_version = msg->ack.version;
      m.ack_ok = msg->ack.ok;
      m.ack_reason = msg->ack.reason;
      break;
    default:
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "unexpected message kind from '{}'",
                          identity);
  }
}

bool WeightSender::Impl::SendTo(const std::string& id, const proto::Bytes& bytes) {
  Deadline d = Deadline::InMs(100);
  Status st = control_.Send(id.data(), id.size(), true, d);
  if (st.ok()) st = control_.Send(bytes, false, d);
  if (st.ok()) return true;
  auto it = members_.find(id);
  if (it != members_.end() && st.code() == Code::kUnavailable && !it->second.gone) {
    it->second.gone = true;
    MarkDirty();
    Log().info("receiver {} is unreachable ({}): dropping it at the next epoch", id, st.message());
  }
  return false;
}

void WeightSender::Impl::MaybeKeepalive() {
  auto now = Clock::now();
  if (now - last_keepalive_ < Millis(config_.heartbeat_ms)) return;
  last_keepalive_ = now;
  std::vector<std::string> ids;
  for (const auto& [id, m] : members_)
    if (!m.gone) ids.push_back(id);
  auto bytes = proto::EncodeHeartbeat(header(), {PeerState::kAlive, current_.version});
  for (const auto& id : ids) SendTo(id, bytes);
}

void WeightSender::Impl::CheckTimeouts() {
  auto now = Clock::now();
  for (auto& [id, m] : members_) {
    if (m.gone || now - m.last_seen < Millis(config_.member_timeout_ms)) continue;
    m.gone = true;
    MarkDirty();
    Log().warn("receiver {} silent for {} ms: dropping it at the next epoch", id,
               config_.member_timeout_ms);
  }
}

void WeightSender::Impl::DropMember(const std::string& id, const char* why) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  bool was_member = std::find(group_.begin(), group_.end(), id) != group_.end();
  Log().info("receiver {} dropped: {}", id, why);
  if (was_member) {
    ++stats_.members_dropped;
    MarkDirty();
  }
  members_.erase(it);
}

void WeightSender::Impl::Publish() {
  std::vector<MemberInfo> snap;
  for (const auto& [id, m] : members_) {
    if (m.gone) continue;
    MemberInfo info;
    info.id = id;
    info.node = m.node;
    info.state = m.state == MemberState::kNew     ? "catching-up"
                 : m.state == MemberState::kReady ? "ready"
                                                  : "member";
    info.version = m.acked_version;
    snap.push_back(std::move(info));
  }
  {
    MutexLock l(mu_);
    members_snapshot_ = std::move(snap);
    group_size_snapshot_ = group_.size();
    group_formed_snapshot_ = formed_ && !dirty_;
    epoch_snapshot_ = epoch_;
    version_snapshot_ = have_current_ ? current_.version : 0;
    stats_snapshot_ = stats_;
  }
  cv_.notify_all();
}

// ----------------------------------------------------------------- membership

void WeightSender::Impl::RunCatchUps() {
  auto now = Clock::now();
  for (auto& [id, m] : members_) {
    if (m.state != MemberState::kNew || m.gone || m.leaving || now < m.next_catch_up) continue;
    Status st = CatchUp(m);
    if (st.ok()) {
      m.state = MemberState::kReady;
      m.catch_up_failures = 0;
      MarkDirty();
      ++stats_.catch_ups;
    } else if (st.code() == Code::kCancelled) {
      // A broadcast arrived: it goes first; the newcomer is caught up with it afterwards.
    } else if (++m.catch_up_failures >= kMaxCatchUpFailures) {
      Log().error(
          "catch-up of {} failed {} times (last: {}); dropping it (is its data endpoint "
          "{} reachable from the learner?)",
          id, m.catch_up_failures, st.ToString(), m.data_endpoint);
      m.gone = true;
      MarkDirty();
    } else {
      // Exponential backoff: a newcomer we cannot reach must not stall the broadcasts.
      auto backoff = Millis(config_.heartbeat_ms) * (1 << m.catch_up_failures);
      Log().warn("catch-up of {} to version {} failed: {}; retrying in {} ms", id, current_.version,
                 st.ToString(), backoff.count());
      m.next_catch_up = Clock::now() + backoff;
    }
    return;  // one per loop turn: jobs and control messages go first
  }
}

Status WeightSender::Impl::CatchUp(Member& m) {
  if (!have_current_) return Status::Ok();
  Layout layout = current_;
  layout.transfer = kCatchUpBit | ++catch_up_counter_;
  proto::ManifestMsg manifest;
  manifest.layout = layout;
  auto t0 = Clock::now();
  if (!SendTo(m.id, proto::EncodeManifest(header(), manifest)))
    return Unavailable("cannot send the manifest to {}", m.id);
  TROUPE_RETURN_IF_ERROR(SendStream({m.data_endpoint}, layout, current_data_, current_owner_,
                                    Deadline::Never(),
                                    /*preemptible=*/true));
  TROUPE_RETURN_IF_ERROR(WaitAcks({m.id}, layout.version, layout.transfer, Deadline::In(timeout_)));
  m.acked_version = layout.version;
  Log().info("caught {} up to version {} ({:.1f} MB in {:.3f} s)", m.id, layout.version,
             layout.total_bytes / 1e6, Seconds(t0, Clock::now()));
  return Status::Ok();
}

// Forms the next epoch from the live members: announce, collect echoes, form the backend
// group. Members that do not echo in time are dropped and the round is repeated.
Status WeightSender::Impl::Reform(Deadline deadline) {
  while (true) {
    if (stopping()) return Cancelled("sender stopping");
    // Candidates: live members of the last group in their order (a chain keeps its shape),
    // then members whose catch-up finished (or who need none).
    std::vector<std::string> leavers, candidates;
    auto live = [](const Member& m) { return !m.gone && !m.leaving; };
    for (const auto& id : group_) {
      Member* m = Find(id);
      if (m != nullptr && live(*m) && m->state == MemberState::kMember) candidates.push_back(id);
    }
    for (const auto& [id, m] : members_) {
      if (m.leaving) leavers.push_back(id);
      if (!live(m) || m.state == MemberState::kNew) continue;
      if (std::find(candidates.begin(), candidates.end(), id) == candidates.end())
        candidates.push_back(id);
    }
    const uint64_t epoch = ++epoch_counter_;
    proto::GroupMsg g;
    g.epoch = epoch;
    g.backend = BackendName(config_.backend);
    g.members.push_back(config_.actor_id);
    g.endpoints.push_back("");
    for (const auto& id : candidates) {
      g.members.push_back(id);
      g.endpoints.push_back(members_[id].data_endpoint);
    }
    g.timeout_ms = static_cast<uint32_t>(config_.timeout_ms);
    switch (config_.backend) {
      case Backend::kGloo:
        g.store_address = store_->address();
        g.algorithm = GlooAlgorithmName(config_.gloo_algorithm);
        break;
      case Backend::kZmq:
        g.algorithm = ZmqTopologyName(config_.zmq_topology);
        break;
      case Backend::kShm:
        g.algorithm = "shm";
        break;
      case Backend::kNccl: {
        g.algorithm = "broadcast";
#ifdef TROUPE_BROADCAST_HAVE_NCCL
        if (!candidates.empty()) {
          TROUPE_ASSIGN_OR_RETURN(nccl_id_, NcclGroup::NewUniqueId());
          g.nccl_id = nccl_id_;
        }
#endif
        break;
      }
    }
    // The old group is finished either way.
    reaper_.Add(std::move(gloo_));
#ifdef TROUPE_BROADCAST_HAVE_NCCL
    reaper_.Add(std::move(nccl_));
#endif
    formed_ = false;
    auto bytes = proto::EncodeGroup(header(), g);
    for (const auto& id : candidates) SendTo(id, bytes);
    for (const auto& id : leavers) SendTo(id, bytes);  // not listed: confirms their leave
    for (const auto& id : leavers) DropMember(id, "left");
    std::vector<std::string> dead;
    for (auto& [id, m] : members_)
      if (m.gone) dead.push_back(id);
    for (const auto& id : dead) DropMember(id, "gone");
    // A candidate found unreachable while announcing: announce again without it.
    if (std::any_of(candidates.begin(), candidates.end(), [&](const std::string& id) {
          const Member* m = Find(id);
          return m == nullptr || m->gone;
        }))
      continue;
    const uint64_t changes_before = changes_;  // later changes need another epoch
    // Collect echoes. Members may still be busy with an aborted transfer for up to a timeout.
    Deadline echo = deadline.min(Deadline::In(timeout_ + Millis(1000)));
    auto missing = [&] {
      std::vector<std::string> out;
      for (const auto& id : candidates) {
        auto it = members_.find(id);
        if (it == members_.end() || it->second.gone || it->second.accepted_epoch < epoch)
          out.push_back(id);
      }
      return out;
    };
    while (!missing().empty() && !echo.expired() && !stopping()) PollControl(5);
    auto absent = missing();
    if (!absent.empty()) {
      for (const auto& id : absent) {
        auto it = members_.find(id);
        if (it != members_.end()) it->second.gone = true;
      }
      Log().warn("epoch {}: no answer from {}; re-forming without them", epoch, Join(absent));
      if (deadline.expired()) return Timeout("epoch {}: no answer from {}", epoch, Join(absent));
      continue;
    }
    Status st = FormBackendGroup(epoch, candidates, g, deadline);
    if (!st.ok()) {
      MarkDirty();
      return st.WithContext(fmt::format("forming epoch {}", epoch));
    }
    for (const auto& id : candidates) {
      Member* m = Find(id);
      if (m == nullptr || m->gone) {
        MarkDirty();
        return Unavailable("epoch {}: member {} went away while the group formed", epoch, id);
      }
    }
    group_ = candidates;
    for (const auto& id : group_) Find(id)->state = MemberState::kMember;
    epoch_ = epoch;
    formed_ = true;
    dirty_ = changes_ != changes_before;
    ++stats_.epochs;
    CloseUnusedDataSockets();
    Log().info("epoch {}: {} member(s) [{}]", epoch, group_.size(), Join(group_));
    return Status::Ok();
  }
}

Status WeightSender::Impl::FormBackendGroup(uint64_t epoch, const std::vector<std::string>& members,
                                            const proto::GroupMsg& group, Deadline deadline) {
  if (members.empty()) return Status::Ok();
  auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
  auto t = std::max(Millis(10), std::min(timeout_, budget));
  switch (config_.backend) {
    case Backend::kGloo: {
      auto g = GlooGroup::Form(*store_, epoch, 0, static_cast<int>(members.size() + 1),
                               config_.gloo_hostname, t);
      if (!g.ok()) return g.status();
      gloo_ = std::shared_ptr<GlooGroup>(std::move(g).value());
      return Status::Ok();
    }
    case Backend::kNccl: {
#ifdef TROUPE_BROADCAST_HAVE_NCCL
      auto g = NcclGroup::Form(group.nccl_id, 0, static_cast<int>(members.size() + 1),
                               config_.nccl_device, Deadline::In(t), [this] {
                                 PollControl(1);
                                 return stopping();
                               });
      if (!g.ok()) return g.status();
      nccl_ = std::shared_ptr<NcclGroup>(std::move(g).value());
      return Status::Ok();
#else
      return Unavailable("nccl backend not built");
#endif
    }
    case Backend::kZmq:
    case Backend::kShm:
      return Status::Ok();
  }
  return Status::Ok();
}

// ----------------------------------------------------------------- broadcast

void WeightSender::Impl::RunJob(Job& job) {
  const auto t0 = Clock::now();
  BroadcastReport& report = job.report;
  report.version = job.version;
  std::set<std::string> before(group_.begin(), group_.end());
  auto finish = [&](Status st) {
    std::set<std::string> after(group_.begin(), group_.end());
    for (const auto& id : before)
      if (!after.count(id)) report.dropped.push_back(id);
    report.epoch = epoch_;
    report.total_seconds = Seconds(t0, Clock::now());
    if (st.ok()) {
      ++stats_.broadcasts_ok;
    } else {
      ++stats_.broadcasts_failed;
    }
    job.status = std::move(st);
  };
  if (have_current_ && job.version <= current_.version)
    return finish(InvalidArgument("version {} is not above the previous broadcast {}", job.version,
                                  current_.version));
  Status packed = PackCurrent(job, &report);
  if (!packed.ok()) return finish(packed);
  Status last = Unavailable("no attempt was made before the deadline");
  for (int attempt = 1; attempt <= config_.max_attempts; ++attempt) {
    if (job.deadline.expired()) break;
    report.attempts = attempt;
    Status st = Status::Ok();
    if (dirty_ || !formed_) st = Reform(job.deadline);
    if (st.ok()) st = Transfer(job.deadline, &report);
    if (st.ok()) {
      report.members = group_;
      for (const auto& id : group_)
        if (Member* m = Find(id)) m->acked_version = job.version;
      return finish(Status::Ok());
    }
    ++stats_.attempts_failed;
    report.failures.push_back(
        fmt::format("attempt {} (epoch {}): {}", attempt, epoch_, st.ToString()));
    Log().warn("broadcast of version {} attempt {} failed: {}", job.version, attempt,
               st.ToString());
    last = st;
    MarkDirty();  // probe the members and re-form before anything else
    if (stopping()) break;
  }
  // Leave the group re-formed for the next call when time allows (members that are alive
  // and not in it get caught up with this version on their own).
  if (dirty_ && !job.deadline.expired()) {
    Status st = Reform(job.deadline);
    if (!st.ok()) Log().warn("re-forming after a failed broadcast: {}", st.ToString());
  }
  finish(last);
}

Status WeightSender::Impl::PackCurrent(const Job& job, BroadcastReport* report) {
  const auto t0 = Clock::now();
  TROUPE_ASSIGN_OR_RETURN(Layout layout, PlanLayout(job.named, config_.wire_dtype,
                                                    config_.bucket_bytes, config_.chunk_bytes));
  layout.version = job.version;
  uint8_t* dst = nullptr;
  std::shared_ptr<void> owner;
  if (config_.backend == Backend::kShm) {
    if (!shm_ || shm_->capacity() < layout.total_bytes) {
      auto w = ShmWriter::Create(config_.shm_prefix, layout.total_bytes);
      if (!w.ok()) return w.status();
      shm_ = std::move(w).value();
      shm_slot_ = 1;
    }
    int slot = shm_slot_ ^ 1;
    shm_->BeginWrite(slot);
    dst = shm_->slot_data(slot);
    owner = shm_;
    TROUPE_RETURN_IF_ERROR(PackTensors(job.named, layout, dst));
    if (config_.checksum) ComputeChecksums(&layout, dst);
    shm_generation_ = shm_->EndWrite(slot);
    shm_slot_ = slot;
  } else {
    // The previous version's buffer is reused in place unless something (a zero-copy send
    // still queued) holds it; the pool then hands out another one.
    current_owner_.reset();
    current_data_ = nullptr;
    have_current_ = false;
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, pool_.Get(layout.total_bytes));
    dst = buf->data();
    owner = buf;
    TROUPE_RETURN_IF_ERROR(PackTensors(job.named, layout, dst));
    if (config_.checksum) ComputeChecksums(&layout, dst);
  }
  current_ = std::move(layout);
  current_owner_ = std::move(owner);
  current_data_ = dst;
  have_current_ = true;
  report->payload_bytes = current_.total_bytes;
  report->pack_seconds = Seconds(t0, Clock::now());
  return Status::Ok();
}

Status WeightSender::Impl::Transfer(Deadline deadline, BroadcastReport* report) {
  const auto t0 = Clock::now();
  Layout layout = current_;
  layout.transfer = epoch_;
  if (group_.empty()) return Status::Ok();
  std::vector<std::string> endpoints;  // data endpoint per member, rank order
  for (const auto& id : group_) {
    Member* m = Find(id);
    if (m == nullptr || m->gone || m->state != MemberState::kMember)
      return Unavailable("member {} of epoch {} is gone", id, epoch_);
    m->ack_transfer = 0;
    m->ack_ok = false;
    endpoints.push_back(m->data_endpoint);
  }
  // Manifests (encoded once). With shm, receivers on another node get theirs over zmq (star).
  proto::ManifestMsg manifest;
  manifest.layout = std::move(layout);
  const proto::Bytes plain = proto::EncodeManifest(header(), manifest);
  proto::Bytes local;
  if (config_.backend == Backend::kShm) {
    manifest.shm_segment = shm_->name();
    manifest.shm_offset = shm_->slot_offset(shm_slot_);
    manifest.shm_generation = shm_generation_;
    local = proto::EncodeManifest(header(), manifest);
  }
  const Layout& sent = manifest.layout;
  std::vector<std::string> zmq_targets;
  for (const auto& id : group_) {
    const Member& m = *Find(id);
    bool shm_local = config_.backend == Backend::kShm && m.node == node_;
    if (config_.backend == Backend::kShm && !shm_local) zmq_targets.push_back(m.data_endpoint);
    if (!SendTo(id, shm_local ? local : plain))
      return Unavailable("cannot send the manifest of version {} to {}", sent.version, id);
  }
  Status st = Status::Ok();
  switch (config_.backend) {
    case Backend::kZmq: {
      if (config_.zmq_topology == ZmqTopology::kChain) endpoints.resize(1);
      st = SendStream(endpoints, sent, current_data_, current_owner_, deadline);
      break;
    }
    case Backend::kShm:
      if (!zmq_targets.empty())
        st = SendStream(zmq_targets, sent, current_data_, current_owner_, deadline);
      break;
    case Backend::kGloo:
      if (!gloo_) return Internal("gloo group of epoch {} is missing", epoch_);
      st = gloo_->Transfer(current_owner_, current_data_, sent, config_.gloo_algorithm, deadline,
                           nullptr);
      if (st.ok()) stats_.bytes_sent += sent.total_bytes;  // handed to gloo once
      break;
    case Backend::kNccl:
#ifdef TROUPE_BROADCAST_HAVE_NCCL
      if (!nccl_) return Internal("nccl communicator of epoch {} is missing", epoch_);
      st = nccl_->Transfer(current_data_, sent, deadline, [this] {
        PollControl(1);
        return stopping();
      });
      if (st.ok()) stats_.bytes_sent += sent.total_bytes;
#else
      st = Unavailable("nccl backend not built");
#endif
      break;
  }
  if (!st.ok()) return st;
  st = WaitAcks(group_, sent.version, sent.transfer, deadline);
  report->transfer_seconds = Seconds(t0, Clock::now());
  return st;
}

Status WeightSender::Impl::WaitAcks(const std::vector<std::string>& ids, uint64_t version,
                                    uint64_t transfer, Deadline deadline) {
  Deadline stall = deadline.min(Deadline::In(timeout_));
  size_t acked = 0;
  while (true) {
    std::vector<std::string> missing, rejected;
    size_t now_acked = 0;
    for (const auto& id : ids) {
      const Member* mp = Find(id);
      bool expected = mp != nullptr && !mp->gone &&
                      (mp->state == MemberState::kMember || (transfer & kCatchUpBit) != 0);
      if (!expected) {
        missing.push_back(id + " (gone)");
        continue;
      }
      const Member& m = *mp;
      if (m.ack_transfer == transfer && m.ack_version == version) {
        if (!m.ack_ok) {
          rejected.push_back(fmt::format("{}: {}", id, m.ack_reason));
        } else {
          ++now_acked;
        }
      } else {
        missing.push_back(id);
      }
    }
    if (!rejected.empty()) return Unavailable("version {} rejected by {}", version, Join(rejected));
    if (missing.empty()) return Status::Ok();
    std::vector<std::string> gone;
    for (const auto& s : missing)
      if (s.size() > 7 && s.compare(s.size() - 7, 7, " (gone)") == 0)
        gone.push_back(s.substr(0, s.size() - 7));
    if (!gone.empty())
      return Unavailable("version {}: {} went away during the transfer", version, Join(gone));
    if (now_acked > acked) {  // progress: a fresh stall window
      acked = now_acked;
      stall = deadline.min(Deadline::In(timeout_));
    }
    if (stall.expired())
      return Timeout("no acknowledgement of version {} from {} within {} ms", version,
                     Join(missing), std::chrono::duration_cast<Millis>(timeout_).count());
    if (stopping()) return Cancelled("sender stopping");
    MaybeKeepalive();  // a crashed member shows up as unreachable here, well before the stall
    PollControl(2);
  }
}

Result<ZmqSocket*> WeightSender::Impl::DataSocket(const std::string& endpoint) {
  auto it = data_sockets_.find(endpoint);
  if (it != data_sockets_.end()) return &it->second;
  TROUPE_ASSIGN_OR_RETURN(ZmqSocket s, ZmqSocket::Create(ctx_, ZMQ_PUSH));
  TROUPE_RETURN_IF_ERROR(s.SetInt(ZMQ_SNDHWM, config_.zmq_hwm_chunks));
  TROUPE_RETURN_IF_ERROR(s.SetInt(ZMQ_IMMEDIATE, 1));
  TROUPE_RETURN_IF_ERROR(s.Connect(endpoint));
  auto [pos, _] = data_sockets_.emplace(endpoint, std::move(s));
  return &pos->second;
}

void WeightSender::Impl::CloseUnusedDataSockets() {
  std::set<std::string> used;
  for (const auto& [id, m] : members_) used.insert(m.data_endpoint);
  for (auto it = data_sockets_.begin(); it != data_sockets_.end();)
    it = used.count(it->first) ? std::next(it) : data_sockets_.erase(it);
}

// Sends every chunk of the stream to each endpoint (one for a chain, each member's for a
// star or a catch-up): a header frame, then the payload frame straight from `data`.
Status WeightSender::Impl::SendStream(const std::vector<std::string>& endpoints,
                                      const Layout& layout, const uint8_t* data,
                                      const std::shared_ptr<void>& owner, Deadline deadline,
                                      bool preemptible) {
  std::vector<ZmqSocket*> sockets;
  for (const auto& ep : endpoints) {
    TROUPE_ASSIGN_OR_RETURN(ZmqSocket * s, DataSocket(ep));
    sockets.push_back(s);
  }
  const uint64_t chunks = std::max<uint64_t>(1, layout.num_chunks());
  for (uint64_t c = 0; c < chunks; ++c) {
    uint64_t begin = std::min(layout.total_bytes, c * layout.chunk_bytes);
    uint64_t end = std::min(layout.total_bytes, begin + layout.chunk_bytes);
    proto::ChunkMsg chunk;
    chunk.version = layout.version;
    chunk.transfer = layout.transfer;
    chunk.bucket = static_cast<uint32_t>(begin / layout.bucket_bytes);
    chunk.bucket_offset = begin % layout.bucket_bytes;
    chunk.last = c + 1 == chunks;
    auto head = proto::EncodeChunk(header(), chunk);
    for (size_t i = 0; i < sockets.size(); ++i) {
      Deadline step = deadline.min(Deadline::In(timeout_));
      Status st = sockets[i]->Send(head, true, step);
      if (st.ok()) st = sockets[i]->SendZeroCopy(data + begin, end - begin, owner, false, step);
      if (!st.ok())
        return st.WithContext(
            fmt::format("sending chunk {} of version {} to {}", c, layout.version, endpoints[i]));
      stats_.bytes_sent += end - begin;
    }
    if ((c & 15) == 15) {
      PollControl(0);  // keep heartbeats flowing during long transfers
      MaybeKeepalive();
      if (stopping()) return Cancelled("sender stopping");
      if (preemptible && job_pending()) return Cancelled("a broadcast is waiting");
    }
  }
  return Status::Ok();
}

// ----------------------------------------------------------------- API

Status WeightSender::Impl::Broadcast(uint64_t version, const NamedTensors& named,
                                     Deadline deadline) {
  MutexLock serial(broadcast_mu_);
  auto job = std::make_shared<Job>();
  job->version = version;
  job->named = named;  // tensor handles: the data is read on the service thread
  job->deadline = deadline;
  {
    MutexLock l(mu_);
    if (stop_) return Cancelled("weight sender is stopping");
    job_ = job;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  // The job is bounded by its deadline (each step by timeout_ms); allow that much slack.
  auto give_up = deadline.is_never() ? Clock::time_point::max()
                                     : deadline.at() + timeout_ * 2 + std::chrono::seconds(2);
  MutexLock l(mu_);
  while (!job->done) {
    auto until = std::min(give_up, Clock::now() + std::chrono::seconds(1));
    cv_.wait_until(l, until, [&]() TROUPE_REQUIRES(mu_) { return job->done; });
    if (!job->done && Clock::now() >= give_up)
      return Timeout("broadcast of version {} still running well past its deadline", version);
  }
  return job->status;
}

Status WeightSender::Impl::WaitForMembers(size_t count, Deadline deadline) {
  MutexLock l(mu_);
  auto ready = [&]() TROUPE_REQUIRES(mu_) {
    return group_formed_snapshot_ && group_size_snapshot_ >= count;
  };
  while (!ready()) {
    if (deadline.expired())
      return Timeout("{} receiver(s) in the group, waiting for {}", group_size_snapshot_, count);
    auto until = std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200));
    cv_.wait_until(l, until, ready);
  }
  return Status::Ok();
}

// ----------------------------------------------------------------- facade

WeightSender::WeightSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WeightSender::~WeightSender() = default;

Result<std::unique_ptr<WeightSender>> WeightSender::Create(const BroadcastConfig& config) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config);
  TROUPE_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<WeightSender>(new WeightSender(std::move(impl)));
}

const std::string& WeightSender::endpoint() const {
  return impl_->endpoint();
}
uint64_t WeightSender::incarnation() const {
  return impl_->incarnation();
}
Status WeightSender::Broadcast(uint64_t version, const NamedTensors& named, Deadline deadline) {
  return impl_->Broadcast(version, named, deadline);
}
BroadcastReport WeightSender::last_report() const {
  return impl_->last_report();
}
Status WeightSender::WaitForMembers(size_t count, Deadline deadline) {
  return impl_->WaitForMembers(count, deadline);
}
std::vector<MemberInfo> WeightSender::Members() const {
  return impl_->Members();
}
uint64_t WeightSender::epoch() const {
  return impl_->epoch();
}
uint64_t WeightSender::version() const {
  return impl_->version();
}
SenderStats WeightSender::stats() const {
  return impl_->stats();
}

}  // namespace troupe::broadcast
