// WeightSender: membership, epochs, catch-up and acknowledgements (sender.h).
// The bytes move through the backend's SenderPath (data_path.h); every socket
// is a transport socket on the learner's network. All socket and group work
// happens on the service thread.
#include "troupe/broadcast/sender.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "buffer_pool.h"
#include "chunk_stream.h"
#include "data_path.h"
#include "protocol.h"
#include "reaper.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/core/thread_name.h"
#include "troupe/transport/socket.h"

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

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

class WeightSender::Impl {
 public:
  Impl(const BroadcastConfig& config, transport::Network& network)
      : config_(config),
        network_(network),
        id_(config.actor_id.empty() ? network.identity().actor_id : config.actor_id),
        timeout_(config.timeout_ms),
        incarnation_(transport::RandomIncarnation()),
        node_(config.node.empty() ? HostName() : config.node) {}

  ~Impl() { Stop(); }

  Status Start();
  void Stop();

  Status Broadcast(uint64_t version, const NamedTensors& named, Deadline deadline);
  Status SetBase(const NamedTensors& base);
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
    std::string route;  // its control connection's identity: replies go there, nowhere else
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
    struct Ack {
      bool ok = false;
      std::string reason;
    };
    // By (transfer, version): a late ack of an earlier transfer changes nothing.
    std::map<std::pair<uint64_t, uint64_t>, Ack> acks;
  };

  // --- service thread
  void Run();
  void PollControl(int timeout_ms);
  void Handle(const transport::Incoming& in);
  void HandleRegister(const transport::Incoming& in, const proto::Message& msg);
  void Refuse(const std::string& route, const std::string& sender, const std::string& why);
  bool SendTo(const std::string& id, const transport::OutMessage& msg);
  void MaybeKeepalive();
  void CheckTimeouts();
  void RunCatchUps();
  Status CatchUp(Member& m);
  Status Reform(Deadline deadline);
  void RunJob(Job& job);
  Status PackCurrent(const Job& job, BroadcastReport* report);
  // A newcomer's catch-up stream when the current version carries no base: the base and
  // the current tensors in one layout (the current layout's version, a fresh stream).
  Status PackCatchUp(Layout* layout, Stream* stream);
  Status Transfer(Deadline deadline, BroadcastReport* report);
  Status WaitAcks(const std::vector<std::string>& ids, uint64_t version, uint64_t transfer,
                  Deadline deadline);
  std::vector<PathMember> PathMembers(const std::vector<std::string>& ids);
  // Served while a path or a chunk stream blocks; `preemptible`: also true when a
  // Broadcast is waiting (catch-ups yield to it).
  Interrupt ServeWhileBlocked(bool preemptible = false);
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
  proto::Header header() const { return proto::Header{id_, incarnation_}; }
  transport::OutMessage Keepalive(PeerState state = PeerState::kAlive) const {
    return proto::EncodeHeartbeat(header(), {state, current_.version});
  }
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
  transport::Network& network_;
  const std::string id_;
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
  // SetBase: tensors sent once with the next broadcast (and with every catch-up).
  NamedTensors base_ TROUPE_GUARDED_BY(mu_);
  uint64_t base_generation_ TROUPE_GUARDED_BY(mu_) = 0;  // SetBase calls
  uint64_t base_delivered_ TROUPE_GUARDED_BY(mu_) = 0;   // generation the group holds
  Mutex broadcast_mu_;  // serialises Broadcast callers
  std::thread thread_;

  // Service-thread state (sockets are created in Start, before the thread exists).
  std::unique_ptr<transport::Socket> control_;
  std::unique_ptr<transport::Poller> poller_;  // control_; Wake() when a job or stop arrives
  BufferPool pool_{2};
  Reaper reaper_;
  std::unique_ptr<ChunkSender> chunks_;  // catch-ups, zmq, shm members on other nodes
  std::unique_ptr<SenderPath> path_;     // the backend
  std::map<std::string, Member> members_;
  std::vector<std::string> group_;  // members of the current epoch, rank = index + 1
  uint64_t epoch_ = 0;              // current (last formed) epoch
  uint64_t epoch_counter_ = 0;      // last epoch number handed out
  bool formed_ = true;              // group_ is formed for epoch_
  bool dirty_ = false;              // membership changed since epoch_
  uint64_t changes_ = 0;            // MarkDirty() calls (detects changes during a Reform)
  Clock::time_point next_reform_;   // backoff after a failed re-formation
  Clock::time_point last_keepalive_;
  Layout current_;         // layout of the current version
  Stream current_stream_;  // where it is packed
  bool have_current_ = false;
  // Without the base in the current version: the base newcomers need first, and a copy of
  // the current tensors (small: adapters) to pack both into one catch-up.
  NamedTensors catch_up_base_, current_named_;
  uint64_t catch_up_counter_ = 0;
  uint64_t last_traced_ = 0;  // last version whose stream checksum was logged
  SenderStats stats_;
};

// ----------------------------------------------------------------- lifecycle

Status WeightSender::Impl::Start() {
  TROUPE_ASSIGN_OR_RETURN(control_,
                          network_.Bind(transport::SocketKind::kServer, config_.control_endpoint,
                                        ControlSocketOptions()));
  endpoint_ = control_->endpoint();
  poller_ = network_.NewPoller();
  poller_->Add(control_.get());
  chunks_ = std::make_unique<ChunkSender>(&network_, header(), config_.zmq_hwm_chunks, timeout_);
  SenderContext ctx;
  ctx.config = &config_;
  ctx.network = &network_;
  ctx.header = header();
  ctx.node = node_;
  ctx.chunks = chunks_.get();
  ctx.pool = &pool_;
  ctx.reaper = &reaper_;
  TROUPE_ASSIGN_OR_RETURN(path_, NewSenderPath(config_.backend, ctx));
  Log().info("weights sender {} on {} (backend {}, incarnation {:016x})", id_, endpoint_,
             BackendName(config_.backend), incarnation_);
  Publish();
  thread_ = std::thread([this] {
    SetThreadName("weights-send");
    Run();
  });
  return Status::Ok();
}

void WeightSender::Impl::Stop() {
  {
    MutexLock l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (poller_) poller_->Wake();
  if (thread_.joinable()) thread_.join();
  // Sockets go before the network does (the caller owns it); the path first: it holds
  // rendezvous sockets, and failed groups go to the reaper.
  path_.reset();
  chunks_.reset();
  if (poller_ && control_) poller_->Remove(control_.get());
  poller_.reset();
  control_.reset();
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
  auto bye = Keepalive(PeerState::kExited);
  for (const auto& [id, m] : members_) SendTo(id, bye);
}

// ----------------------------------------------------------------- control plane

void WeightSender::Impl::PollControl(int timeout_ms) {
  auto ready = poller_->Wait(Deadline::InMs(timeout_ms));
  (void)ready;  // readable, woken (a job, a stop) or timed out: drain what is there either way
  // Bounded so a flood cannot starve the rest of the loop. The last Recv finds nothing, which
  // also lets the socket count refused handshakes.
  for (int i = 0; i < 10000; ++i) {
    auto in = control_->Recv(Deadline::Now());
    if (in.ok()) {
      Handle(*in);
    } else if (!transport::IsBadInput(in.status())) {
      return;  // nothing waiting (bad input was counted and logged by the transport)
    }
  }
}

void WeightSender::Impl::Refuse(const std::string& route, const std::string& sender,
                                const std::string& why) {
  ++stats_.refused;
  network_.counters().Reject(transport::RejectReason::kUnexpected);
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                      "weights control {}: refused a message from '{}' (sender '{}'): {}",
                      endpoint_, route, sender, why);
}

void WeightSender::Impl::Handle(const transport::Incoming& in) {
  auto msg = proto::Decode(in.message);
  if (!msg.ok()) return Refuse(in.peer, std::string(in.message.sender()), msg.status().ToString());
  // Receivers connect with "<actor id>/<random>": a message must come from its own connection.
  if (IdentityActor(in.peer) != msg->sender)
    return Refuse(in.peer, msg->sender, "its connection does not belong to that sender");
  if (msg->kind == Kind::kRegister) return HandleRegister(in, *msg);
  if (msg->kind != Kind::kHeartbeat && msg->kind != Kind::kGroup && msg->kind != Kind::kAck)
    return Refuse(in.peer, msg->sender,
                  fmt::format("a {} on the weights control socket", KindName(msg->kind)));
  Member* m = Find(msg->sender);
  if (m == nullptr || m->route != in.peer || m->incarnation != msg->incarnation) {
    // Not (or no longer) a member: tell that connection to register (again).
    if (msg->kind == Kind::kHeartbeat && msg->heartbeat.state != PeerState::kAlive) return;
    control_->SendTo(in.peer, Keepalive(PeerState::kUnknown), Deadline::InMs(100)).IgnoreError();
    return;
  }
  m->last_seen = Clock::now();
  switch (msg->kind) {
    case Kind::kHeartbeat:
      if (msg->heartbeat.state == PeerState::kLeaving && !m->leaving) {
        m->leaving = true;
        MarkDirty();
        Log().info("receiver {} asks to leave", m->id);
      } else if (msg->heartbeat.state == PeerState::kExited && !m->gone) {
        m->gone = true;
        MarkDirty();
        Log().info("receiver {} exited", m->id);
      }
      break;
    case Kind::kGroup:
      m->accepted_epoch = std::max(m->accepted_epoch, msg->group.epoch);
      break;
    case Kind::kAck:
      m->acks[{msg->ack.transfer, msg->ack.version}] = Member::Ack{msg->ack.ok, msg->ack.reason};
      while (m->acks.size() > 8) m->acks.erase(m->acks.begin());
      break;
    default:
      break;
  }
}

void WeightSender::Impl::HandleRegister(const transport::Incoming& in, const proto::Message& msg) {
  const std::string& id = msg.sender;
  auto alive = Keepalive();
  if (Member* m = Find(id)) {
    if (m->route == in.peer && m->incarnation == msg.incarnation) {
      m->last_seen = Clock::now();  // a repeated Register: just confirm
      SendTo(id, alive);
      return;
    }
    if (m->route != in.peer && !m->gone &&
        control_->SendTo(m->route, alive, Deadline::InMs(100)).ok()) {
      // Another connection claims the id of a member whose own connection is still there:
      // it cannot take its place (it may be an impostor, or the member's restart seen before
      // its old connection closed: then it is admitted on a later Register).
      ++stats_.takeovers_refused;
      return Refuse(in.peer, id, "that receiver id belongs to another live connection");
    }
    DropMember(id, m->route == in.peer ? "restarted (new incarnation)"
                                       : "replaced by a new connection (the old one is gone)");
  }
  if (msg.reg.data_endpoint.empty()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                        "receiver '{}' registered without a data endpoint: ignored", id);
    return;
  }
  // A receiver whose engine could not apply what this learner sends never joins (it would
  // fail the first transfer, or generate with the wrong adapters): refused here, by name.
  Status fits = CheckAdapterLayouts(config_.adapters, msg.reg.adapters, id);
  if (!fits.ok()) {
    ++stats_.receivers_refused;
    stats_.last_refusal = fits.message();
    Log().error("weights sender {} refused receiver {} at registration: {}", id_, id,
                fits.message());
    proto::AckMsg no;
    no.ok = false;
    no.reason = fits.message();
    control_->SendTo(in.peer, proto::EncodeAck(header(), no), Deadline::InMs(100)).IgnoreError();
    return;
  }
  Member m;
  m.id = id;
  m.route = in.peer;
  m.incarnation = msg.incarnation;
  m.node = msg.reg.node;
  m.data_endpoint = msg.reg.data_endpoint;
  m.state = have_current_ ? MemberState::kNew : MemberState::kReady;
  m.last_seen = Clock::now();
  members_[id] = m;
  if (m.state == MemberState::kReady) MarkDirty();
  Log().info("receiver {} registered from {} ({}), holding version {}{}", id, m.node,
             m.data_endpoint, msg.reg.version, have_current_ ? "; catching up" : "");
  SendTo(id, alive);
}

bool WeightSender::Impl::SendTo(const std::string& id, const transport::OutMessage& msg) {
  Member* m = Find(id);
  if (m == nullptr) return false;
  Status st = control_->SendTo(m->route, msg, Deadline::InMs(100));
  if (st.ok()) return true;
  if (st.code() == Code::kUnavailable && !m->gone) {
    m->gone = true;
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
  auto msg = Keepalive();
  for (const auto& id : ids) SendTo(id, msg);
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

Interrupt WeightSender::Impl::ServeWhileBlocked(bool preemptible) {
  return [this, preemptible] {
    PollControl(0);  // heartbeats and registrations keep flowing during long operations
    MaybeKeepalive();
    return stopping() || (preemptible && job_pending());
  };
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
  for (auto& [key, m] : members_) {
    if (m.state != MemberState::kNew || m.gone || m.leaving || now < m.next_catch_up) continue;
    const std::string id = key;  // serving the control socket meanwhile may erase the entry
    Status st = CatchUp(m);
    Member* after = Find(id);
    if (after == nullptr) return;
    if (st.ok()) {
      after->state = MemberState::kReady;
      after->catch_up_failures = 0;
      MarkDirty();
      ++stats_.catch_ups;
    } else if (st.code() == Code::kCancelled) {
      // A broadcast arrived: it goes first; the newcomer is caught up with it afterwards.
    } else if (++after->catch_up_failures >= kMaxCatchUpFailures) {
      Log().error(
          "catch-up of {} failed {} times (last: {}); dropping it (is its data endpoint "
          "{} reachable from the learner?)",
          id, after->catch_up_failures, st.ToString(), after->data_endpoint);
      after->gone = true;
      MarkDirty();
    } else {
      // Exponential backoff: a newcomer we cannot reach must not stall the broadcasts.
      auto backoff = Millis(config_.heartbeat_ms) * (1 << after->catch_up_failures);
      Log().warn("catch-up of {} to version {} failed: {}; retrying in {} ms", id, current_.version,
                 st.ToString(), backoff.count());
      after->next_catch_up = Clock::now() + backoff;
    }
    return;  // one per loop turn: jobs and control messages go first
  }
}

Status WeightSender::Impl::CatchUp(Member& member) {
  if (!have_current_) return Status::Ok();
  const std::string id = member.id, endpoint = member.data_endpoint;  // `member` may go away
  Layout layout = current_;
  Stream stream = current_stream_;
  if (!catch_up_base_.empty()) TROUPE_RETURN_IF_ERROR(PackCatchUp(&layout, &stream));
  layout.transfer = kCatchUpBit | ++catch_up_counter_;
  layout.token = transport::RandomIncarnation();
  proto::ManifestMsg manifest;
  manifest.layout = layout;
  auto t0 = Clock::now();
  if (!SendTo(id, proto::EncodeManifest(header(), manifest)))
    return Unavailable("cannot send the manifest to {}", id);
  TROUPE_RETURN_IF_ERROR(chunks_->Send({endpoint}, layout, stream.data, stream.owner,
                                       Deadline::Never(), ServeWhileBlocked(/*preemptible=*/true),
                                       &stats_.bytes_sent));
  TROUPE_RETURN_IF_ERROR(WaitAcks({id}, layout.version, layout.transfer, Deadline::In(timeout_)));
  if (Member* m = Find(id)) m->acked_version = layout.version;
  Log().info("caught {} up to version {} ({:.1f} MB in {:.3f} s)", id, layout.version,
             layout.total_bytes / 1e6, Seconds(t0, Clock::now()));
  return Status::Ok();
}

Status WeightSender::Impl::PackCatchUp(Layout* layout, Stream* stream) {
  NamedTensors all = catch_up_base_;
  all.insert(all.end(), current_named_.begin(), current_named_.end());
  TROUPE_ASSIGN_OR_RETURN(Layout full, PlanLayout(all, config_.wire_dtype, config_.bucket_bytes,
                                                  config_.chunk_bytes));
  full.version = current_.version;
  auto buffer = std::shared_ptr<uint8_t[]>(new (std::nothrow) uint8_t[full.total_bytes]);
  if (!buffer) return ResourceExhausted("catch-up: cannot allocate {} bytes", full.total_bytes);
  TROUPE_RETURN_IF_ERROR(PackTensors(all, full, buffer.get()));
  if (config_.checksum) ComputeChecksums(&full, buffer.get());
  stream->data = buffer.get();
  stream->owner = std::shared_ptr<void>(buffer, buffer.get());
  *layout = std::move(full);
  return Status::Ok();
}

std::vector<PathMember> WeightSender::Impl::PathMembers(const std::vector<std::string>& ids) {
  std::vector<PathMember> out;
  for (const auto& id : ids) {
    const Member* m = Find(id);
    out.push_back(m ? PathMember{id, m->node, m->data_endpoint} : PathMember{id, "", ""});
  }
  return out;
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
    g.members.push_back(id_);
    g.endpoints.push_back("");
    for (const auto& id : candidates) {
      g.members.push_back(id);
      g.endpoints.push_back(members_[id].data_endpoint);
    }
    g.timeout_ms = static_cast<uint32_t>(config_.timeout_ms);
    path_->Abort();  // the old group is finished either way
    formed_ = false;
    TROUPE_RETURN_IF_ERROR(path_->Announce(&g).WithContext(fmt::format("epoch {}", epoch)));
    auto announcement = proto::EncodeGroup(header(), g);
    for (const auto& id : candidates) SendTo(id, announcement);
    for (const auto& id : leavers) SendTo(id, announcement);  // not listed: confirms their leave
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
    Status st = path_->Form(g, PathMembers(candidates), deadline, ServeWhileBlocked());
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
    std::set<std::string> used;
    for (const auto& [id, m] : members_) used.insert(m.data_endpoint);
    chunks_->Retain(used);
    Log().info("epoch {}: {} member(s) [{}]", epoch, group_.size(), Join(group_));
    return Status::Ok();
  }
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
  // The base rides along until one broadcast delivered it to the whole group.
  uint64_t base_generation = 0;
  bool with_base = false;
  NamedTensors base;
  {
    MutexLock l(mu_);
    base = base_;
    base_generation = base_generation_;
    with_base = !base_.empty() && base_delivered_ != base_generation_;
  }
  if (with_base) {
    NamedTensors all = base;
    all.insert(all.end(), job.named.begin(), job.named.end());
    job.named = std::move(all);
  }
  Status packed = PackCurrent(job, &report);
  if (!packed.ok()) return finish(packed);
  catch_up_base_.clear();
  current_named_.clear();
  if (!with_base && !base.empty()) {
    catch_up_base_ = base;
    for (const auto& [name, t] : job.named) current_named_.emplace_back(name, t.clone());
  }
  Status last = Unavailable("no attempt was made before the deadline");
  for (int attempt = 1; attempt <= config_.max_attempts; ++attempt) {
    if (job.deadline.expired()) break;
    report.attempts = attempt;
    Status st = Status::Ok();
    if (dirty_ || !formed_) st = Reform(job.deadline);
    if (st.ok()) st = Transfer(job.deadline, &report);
    if (st.ok()) {
      if (with_base) {
        MutexLock l(mu_);
        base_delivered_ = base_generation;
      }
      report.members = group_;
      for (const auto& id : group_)
        if (Member* m = Find(id)) m->acked_version = job.version;
      if (!current_.checksums.empty() && TraceChecksum(job.version, &last_traced_))
        Log().info("version {} reached {} member(s): stream checksum {:016x}", job.version,
                   group_.size(), StreamChecksum(current_));
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
  // The previous version's memory is reused in place unless something (a zero-copy send still
  // queued) holds it; the backend then hands out other memory.
  current_stream_ = Stream{};
  have_current_ = false;
  TROUPE_ASSIGN_OR_RETURN(Stream stream, path_->Acquire(layout.total_bytes));
  TROUPE_RETURN_IF_ERROR(PackTensors(job.named, layout, stream.data));
  if (config_.checksum) ComputeChecksums(&layout, stream.data);
  path_->Packed();
  current_ = std::move(layout);
  current_stream_ = std::move(stream);
  have_current_ = true;
  report->payload_bytes = current_.total_bytes;
  report->pack_seconds = Seconds(t0, Clock::now());
  return Status::Ok();
}

Status WeightSender::Impl::Transfer(Deadline deadline, BroadcastReport* report) {
  const auto t0 = Clock::now();
  if (group_.empty()) return Status::Ok();
  for (const auto& id : group_) {
    Member* m = Find(id);
    if (m == nullptr || m->gone || m->state != MemberState::kMember)
      return Unavailable("member {} of epoch {} is gone", id, epoch_);
  }
  // Manifests: what the backend tells each member (shm: local members get the segment).
  // Members told the same thing share one encoded message.
  const std::vector<PathMember> members = PathMembers(group_);
  Layout sent = current_;
  sent.transfer = epoch_;
  sent.token = transport::RandomIncarnation();
  std::map<std::string, transport::OutMessage> encoded;
  for (const PathMember& pm : members) {
    proto::ManifestMsg manifest;
    manifest.layout = sent;
    path_->Describe(pm, &manifest);
    auto it = encoded.find(manifest.shm_segment);
    if (it == encoded.end())
      it = encoded.emplace(manifest.shm_segment, proto::EncodeManifest(header(), manifest)).first;
    if (!SendTo(pm.id, it->second))
      return Unavailable("cannot send the manifest of version {} to {}", current_.version, pm.id);
  }
  TROUPE_RETURN_IF_ERROR(path_->Send(sent, current_stream_, members, deadline, ServeWhileBlocked(),
                                     &stats_.bytes_sent));
  Status st = WaitAcks(group_, sent.version, sent.transfer, deadline);
  report->transfer_seconds = Seconds(t0, Clock::now());
  if (st.ok()) path_->Acknowledged();
  return st;
}

Status WeightSender::Impl::WaitAcks(const std::vector<std::string>& ids, uint64_t version,
                                    uint64_t transfer, Deadline deadline) {
  Deadline stall = deadline.min(Deadline::In(timeout_));
  size_t acked = 0;
  while (true) {
    std::vector<std::string> missing, gone, rejected;
    size_t now_acked = 0;
    for (const auto& id : ids) {
      const Member* m = Find(id);
      bool expected = m != nullptr && !m->gone &&
                      (m->state == MemberState::kMember || (transfer & kCatchUpBit) != 0);
      if (!expected) {
        gone.push_back(id);
      } else if (auto a = m->acks.find({transfer, version}); a != m->acks.end()) {
        if (a->second.ok) {
          ++now_acked;
        } else {
          rejected.push_back(fmt::format("{}: {}", id, a->second.reason));
        }
      } else {
        missing.push_back(id);
      }
    }
    if (!rejected.empty()) return Unavailable("version {} rejected by {}", version, Join(rejected));
    if (!gone.empty())
      return Unavailable("version {}: {} went away during the transfer", version, Join(gone));
    if (missing.empty()) return Status::Ok();
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
  poller_->Wake();
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

Status WeightSender::Impl::SetBase(const NamedTensors& base) {
  std::set<std::string> names;
  for (const auto& [name, t] : base) {
    if (name.empty() || !names.insert(name).second)
      return InvalidArgument("SetBase: empty or duplicate tensor name '{}'", name);
    if (!t.defined()) return InvalidArgument("SetBase: tensor '{}' is undefined", name);
  }
  MutexLock l(mu_);
  base_ = base;
  ++base_generation_;
  return Status::Ok();
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

Result<std::unique_ptr<WeightSender>> WeightSender::Create(const BroadcastConfig& config,
                                                           transport::Network& network) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config, network);
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
Status WeightSender::SetBase(const NamedTensors& base) {
  return impl_->SetBase(base);
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
