// WeightReceiver: registration, group epochs, catch-up, delivery and
// acknowledgement (receiver.h). The bytes of group transfers arrive through the
// backend's ReceiverPath (data_path.h); every socket is a transport socket on
// the rollout actor's network.
#include "troupe/broadcast/receiver.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <thread>

#include "buffer_pool.h"
#include "chunk_stream.h"
#include "data_path.h"
#include "protocol.h"
#include "reaper.h"
#include "troupe/broadcast/layout.h"
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

}  // namespace

class WeightReceiver::Impl {
 public:
  Impl(const ReceiverConfig& config, transport::Network& network, WeightsSink sink,
       ReceiverHooks hooks)
      : config_(config),
        network_(network),
        id_(config.actor_id.empty() ? network.identity().actor_id : config.actor_id),
        sink_(std::move(sink)),
        hooks_(std::move(hooks)),
        incarnation_(transport::RandomIncarnation()),
        node_(config.node.empty() ? HostName() : config.node) {}
  ~Impl() { Stop(/*say_goodbye=*/true); }

  Status Start();
  void Stop(bool say_goodbye);

  const std::string& data_endpoint() const { return data_endpoint_; }
  uint64_t version() const {
    MutexLock l(mu_);
    return version_;
  }
  bool in_group() const {
    MutexLock l(mu_);
    return in_group_;
  }
  ReceiverStats stats() const {
    MutexLock l(mu_);
    return stats_;
  }
  Status refusal() const {
    MutexLock l(mu_);
    return refusal_;
  }
  Result<ReceivedWeights> Receive(Deadline deadline);
  Status WaitForVersion(uint64_t version, Deadline deadline);
  Status Leave(Deadline deadline);

 private:
  // --- receiver thread
  void Run();
  std::optional<proto::Message> NextControl(int timeout_ms);
  std::optional<proto::Message> ReadControl();
  void Handle(const proto::Message& msg);
  // `manifest_aborts`: a new manifest supersedes what we do (transfers; not group formation,
  // where the epoch's first manifest may arrive while our last connections settle).
  bool IsAbortive(const proto::Message& msg, bool manifest_aborts) const;
  bool CheckAbort(bool manifest_aborts = true);
  void Refuse(const std::string& sender, const std::string& why);
  void SendControl(const transport::OutMessage& msg);
  void SendRegister();
  void SendHeartbeat();
  void ResetGroup();
  void FormGroup(const proto::GroupMsg& g, int rank);
  void RunTransfer(const proto::ManifestMsg& manifest);
  Status ReceiveInto(const proto::ManifestMsg& manifest, bool catch_up);
  Status Deliver(const Layout& layout, const Landed& landed, bool catch_up);
  bool IsPeer(const std::string& sender) const;
  void Progress(uint64_t version, uint64_t received, uint64_t total) {
    if (hooks_.on_progress) hooks_.on_progress(version, received, total);
  }
  proto::Header header() const { return proto::Header{id_, incarnation_}; }
  std::chrono::milliseconds group_timeout() const {
    return std::chrono::milliseconds(group_.timeout_ms > 0 ? group_.timeout_ms : 10000);
  }
  bool stopping() {
    MutexLock l(mu_);
    return stop_;
  }
  template <typename F>
  void Update(F f) {
    {
      MutexLock l(mu_);
      f();
    }
    cv_.notify_all();
  }

  const ReceiverConfig config_;
  transport::Network& network_;
  const std::string id_;
  const WeightsSink sink_;
  const ReceiverHooks hooks_;
  const uint64_t incarnation_;
  const std::string node_;
  std::string data_endpoint_;

  // Shared with API callers.
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  bool leave_requested_ TROUPE_GUARDED_BY(mu_) = false;
  bool left_ TROUPE_GUARDED_BY(mu_) = false;
  uint64_t version_ TROUPE_GUARDED_BY(mu_) = 0;
  bool in_group_ TROUPE_GUARDED_BY(mu_) = false;
  ReceiverStats stats_ TROUPE_GUARDED_BY(mu_);
  Status refusal_ TROUPE_GUARDED_BY(mu_);  // why the learner refused us (ok: not refused)
  std::optional<ReceivedWeights> mailbox_ TROUPE_GUARDED_BY(mu_);
  uint64_t mailbox_seq_ TROUPE_GUARDED_BY(mu_) = 0;
  uint64_t returned_seq_ TROUPE_GUARDED_BY(mu_) = 0;
  std::thread thread_;

  // Receiver-thread state (sockets are created in Start, before the thread exists).
  BufferPool pool_{3};
  BufferPool cast_pool_{3};
  Reaper reaper_;
  std::unique_ptr<transport::Socket> control_;  // client of the learner's control socket
  std::unique_ptr<ChunkReceiver> chunks_;       // our data socket
  std::unique_ptr<transport::Poller> poller_;   // control_ (chunks wait for their transfer)
  std::unique_ptr<ReceiverPath> path_;          // the current group's backend
  Backend path_backend_ = Backend::kZmq;
  std::string learner_id_;  // actor id of the learner we follow (sender of its messages)
  uint64_t learner_inc_ = 0;
  bool welcomed_ = false;
  // The learner refused our Register (its adapters do not fit our engine): no registering or
  // heartbeats until it goes silent (then we ask again: it may have been restarted).
  bool refused_ = false;
  bool leave_sent_ = false;
  Clock::time_point last_heard_, last_register_, last_heartbeat_;
  uint64_t held_version_ = 0;   // version_ as seen by this thread
  uint64_t held_from_inc_ = 0;  // learner incarnation that sent it
  uint64_t last_traced_ = 0;    // last version whose stream checksum was logged
  uint64_t epoch_ = 0;
  bool group_ready_ = false;
  int rank_ = 0;
  proto::GroupMsg group_;
  std::deque<proto::Message> pending_;
};

// ----------------------------------------------------------------- lifecycle

Status WeightReceiver::Impl::Start() {
  TROUPE_ASSIGN_OR_RETURN(
      chunks_,
      ChunkReceiver::Bind(&network_, config_.data_endpoint, config_.zmq_hwm_chunks,
                          [this] { Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.refused; }); }));
  data_endpoint_ = chunks_->endpoint();
  TROUPE_ASSIGN_OR_RETURN(control_,
                          network_.Connect(transport::SocketKind::kClient, config_.learner_endpoint,
                                           ControlSocketOptions(UnguessableIdentity(id_))));
  poller_ = network_.NewPoller();
  poller_->Add(control_.get());
  Log().info("weights receiver {} (data {}) -> learner {}", id_, data_endpoint_,
             config_.learner_endpoint);
  thread_ = std::thread([this] {
    SetThreadName("weights-recv");
    Run();
  });
  return Status::Ok();
}

void WeightReceiver::Impl::Stop(bool say_goodbye) {
  {
    MutexLock l(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  poller_->Wake();
  thread_.join();
  if (say_goodbye && control_) {
    // Tell the learner at once, so no broadcast waits a timeout for us (linger flushes it).
    SendControl(proto::EncodeHeartbeat(header(), {PeerState::kExited, held_version_}));
  }
  path_.reset();  // a failed group goes to the reaper
  poller_.reset();
  chunks_.reset();
  control_.reset();
}

void WeightReceiver::Impl::Run() {
  const auto heartbeat = Millis(config_.heartbeat_ms);
  last_heard_ = Clock::now();
  while (!stopping()) {
    auto now = Clock::now();
    bool leaving;
    {
      MutexLock l(mu_);
      leaving = leave_requested_;
      if (left_) break;
    }
    if (leaving && !leave_sent_) {
      leave_sent_ = true;
      SendHeartbeat();
    }
    if (!welcomed_ && !refused_ && now - last_register_ >= heartbeat) SendRegister();
    if (!refused_ && now - last_heartbeat_ >= heartbeat) SendHeartbeat();
    auto msg = NextControl(static_cast<int>(std::min<int64_t>(config_.heartbeat_ms, 100)));
    if (msg) {
      Handle(*msg);
      continue;
    }
    // Nothing queued: only now is silence meaningful (a long transfer delays the queue).
    if (learner_inc_ != 0 && Clock::now() - last_heard_ > Millis(config_.learner_timeout_ms)) {
      Log().warn("learner silent for {} ms: registering again", config_.learner_timeout_ms);
      ResetGroup();
      learner_inc_ = 0;
      welcomed_ = false;
      refused_ = false;
      epoch_ = 0;
    }
  }
  ResetGroup();
}

// ----------------------------------------------------------------- control plane

void WeightReceiver::Impl::Refuse(const std::string& sender, const std::string& why) {
  Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.refused; });
  network_.counters().Reject(transport::RejectReason::kUnexpected);
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                      "weights control of {}: refused a message from '{}': {}", id_, sender, why);
}

std::optional<proto::Message> WeightReceiver::Impl::ReadControl() {
  while (true) {
    auto in = control_->Recv(Deadline::Now());
    if (!in.ok()) {
      if (transport::IsBadInput(in.status())) continue;  // counted and logged by the transport
      return std::nullopt;
    }
    auto msg = proto::Decode(in->message);
    if (!msg.ok()) {
      Refuse(std::string(in->message.sender()), msg.status().ToString());
      continue;
    }
    if (msg->kind != Kind::kHeartbeat && msg->kind != Kind::kGroup &&
        msg->kind != Kind::kManifest && msg->kind != Kind::kAck) {
      Refuse(msg->sender, fmt::format("a {} from the learner's socket", KindName(msg->kind)));
      continue;
    }
    return std::move(msg).value();
  }
}

bool WeightReceiver::Impl::IsPeer(const std::string& sender) const {
  return sender == learner_id_ ||
         std::find(group_.members.begin(), group_.members.end(), sender) != group_.members.end();
}

std::optional<proto::Message> WeightReceiver::Impl::NextControl(int timeout_ms) {
  if (!pending_.empty()) {
    auto m = std::move(pending_.front());
    pending_.pop_front();
    return m;
  }
  auto ready = poller_->Wait(Deadline::InMs(timeout_ms));
  (void)ready;
  // Chunks wait in the data socket for their transfer; this only lets its refused handshakes
  // (and strangers) be counted while no transfer reads it.
  chunks_->Idle([this](const std::string& s) { return IsPeer(s); });
  return ReadControl();
}

// A message that must end what we are doing (handled after it by the main loop).
bool WeightReceiver::Impl::IsAbortive(const proto::Message& m, bool manifest_aborts) const {
  if (learner_inc_ != 0 && m.incarnation != learner_inc_) return true;
  switch (m.kind) {
    case Kind::kGroup:
      return m.group.epoch > epoch_;
    case Kind::kManifest:
      return manifest_aborts;
    case Kind::kHeartbeat:
      return m.heartbeat.state != PeerState::kAlive;
    default:
      return false;
  }
}

// Reads control messages that arrived while we were busy: keepalives are consumed, the rest
// is kept for the main loop. True when the current work must be abandoned (newer epoch, new
// transfer, learner change, stop).
bool WeightReceiver::Impl::CheckAbort(bool manifest_aborts) {
  if (stopping()) return true;
  bool abort = std::any_of(pending_.begin(), pending_.end(),
                           [&](const proto::Message& m) { return IsAbortive(m, manifest_aborts); });
  while (auto m = ReadControl()) {
    if (m->incarnation == learner_inc_) last_heard_ = Clock::now();
    if (m->kind == Kind::kHeartbeat && !IsAbortive(*m, manifest_aborts)) continue;
    abort = abort || IsAbortive(*m, manifest_aborts);
    pending_.push_back(std::move(*m));
  }
  return abort || stopping();
}

void WeightReceiver::Impl::SendControl(const transport::OutMessage& msg) {
  // Bounded: while the learner is unreachable, registrations and heartbeats are repeated anyway
  // (and acks re-requested by the learner).
  control_->Send(msg, Deadline::InMs(50)).IgnoreError();
}

void WeightReceiver::Impl::SendRegister() {
  last_register_ = Clock::now();
  proto::RegisterMsg r;
  r.node = node_;
  r.pid = static_cast<int32_t>(::getpid());
  r.data_endpoint = data_endpoint_;
  r.version = held_version_;
  r.adapters = config_.adapters;
  SendControl(proto::EncodeRegister(header(), r));
}

void WeightReceiver::Impl::SendHeartbeat() {
  last_heartbeat_ = Clock::now();
  PeerState state = leave_sent_ ? PeerState::kLeaving : PeerState::kAlive;
  SendControl(proto::EncodeHeartbeat(header(), {state, held_version_}));
}

void WeightReceiver::Impl::Handle(const proto::Message& msg) {
  if (msg.incarnation != learner_inc_) {
    if (msg.kind == Kind::kHeartbeat && msg.heartbeat.state == PeerState::kExited)
      return;  // goodbye of a learner we no longer follow
    if (learner_inc_ != 0) {
      Log().info("learner changed (incarnation {:016x} -> {:016x}): re-syncing", learner_inc_,
                 msg.incarnation);
      Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.learner_changes; });
    }
    ResetGroup();
    epoch_ = 0;
    learner_inc_ = msg.incarnation;
    learner_id_ = msg.sender;
    welcomed_ = false;
    refused_ = false;
  }
  last_heard_ = Clock::now();
  switch (msg.kind) {
    case Kind::kAck:
      if (msg.ack.ok || msg.ack.version != 0 || msg.ack.transfer != 0) break;  // not a refusal
      if (refused_) break;  // the answer to a Register that was already on its way
      // The learner refused our Register: its adapters do not fit our engine.
      Log().error("weights receiver {}: learner {} refused it: {}", id_, msg.sender,
                  msg.ack.reason);
      ResetGroup();
      welcomed_ = false;
      refused_ = true;
      Update([&]() TROUPE_REQUIRES(mu_) {
        ++stats_.refusals;
        refusal_ = InvalidArgument("refused by learner {}: {}", msg.sender, msg.ack.reason);
      });
      break;
    case Kind::kHeartbeat:
      if (msg.heartbeat.state == PeerState::kAlive) {
        welcomed_ = true;
        if (refused_) {
          refused_ = false;
          Update([&]() TROUPE_REQUIRES(mu_) { refusal_ = Status::Ok(); });
        }
      } else if (msg.heartbeat.state == PeerState::kUnknown && !refused_) {
        if (welcomed_) Log().info("the learner does not know us (any more): registering");
        ResetGroup();
        welcomed_ = false;
        SendRegister();
      } else if (msg.heartbeat.state == PeerState::kExited) {
        Log().info("learner {} is going away; waiting for a learner to register with", msg.sender);
        ResetGroup();
        learner_inc_ = 0;
        epoch_ = 0;
        welcomed_ = false;
      }
      break;
    case Kind::kGroup: {
      const proto::GroupMsg& g = msg.group;
      if (g.epoch <= epoch_) break;  // stale
      welcomed_ = true;
      auto it = std::find(g.members.begin(), g.members.end(), id_);
      if (it == g.members.end()) {
        ResetGroup();
        epoch_ = g.epoch;
        if (leave_sent_) {
          Log().info("left the broadcast group (epoch {} formed without us)", g.epoch);
          Update([&]() TROUPE_REQUIRES(mu_) { left_ = true; });
        }
        break;
      }
      auto backend = ParseBackend(g.backend);
      if (!backend.ok() || !BackendCompiled(*backend)) {
        // Not echoing makes the learner drop us from this epoch instead of waiting on us.
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::err, 5000,
                            "epoch {}: backend '{}' is not available in this build; not joining",
                            g.epoch, g.backend);
        break;
      }
      SendControl(proto::EncodeGroup(header(), proto::GroupMsg{g.epoch}));  // echo: accepted
      FormGroup(g, static_cast<int>(it - g.members.begin()));
      break;
    }
    case Kind::kManifest:
      RunTransfer(msg.manifest);
      break;
    default:
      break;
  }
}

// ----------------------------------------------------------------- group

void WeightReceiver::Impl::ResetGroup() {
  if (path_) path_->Abort();
  group_ready_ = false;
  Update([&]() TROUPE_REQUIRES(mu_) { in_group_ = false; });
}

void WeightReceiver::Impl::FormGroup(const proto::GroupMsg& g, int rank) {
  ResetGroup();
  group_ = g;
  epoch_ = g.epoch;
  rank_ = rank;
  if (g.endpoints.size() != g.members.size() || rank <= 0) {
    Log().error("epoch {}: malformed group ({} members, {} endpoints, rank {})", g.epoch,
                g.members.size(), g.endpoints.size(), rank);
    return;
  }
  Backend backend = *ParseBackend(g.backend);  // checked by the caller
  Status st = Status::Ok();
  if (!path_ || path_backend_ != backend) {
    ReceiverContext ctx;
    ctx.config = &config_;
    ctx.network = &network_;
    ctx.header = header();
    ctx.chunks = chunks_.get();
    ctx.pool = &pool_;
    ctx.reaper = &reaper_;
    ctx.zero_copy = sink_ && config_.shm_zero_copy;
    path_.reset();
    auto p = NewReceiverPath(backend, ctx);
    if (p.ok()) {
      path_ = std::move(p).value();
      path_backend_ = backend;
    } else {
      st = p.status();
    }
  }
  if (st.ok())
    st = path_->Join(g, rank, Deadline::In(group_timeout()),
                     [this] { return CheckAbort(/*manifest_aborts=*/false); });
  if (!st.ok()) {
    Log().warn("epoch {}: could not join the {} group: {}", g.epoch, g.backend, st.ToString());
    ResetGroup();
    return;
  }
  group_ready_ = true;
  Update([&]() TROUPE_REQUIRES(mu_) {
    in_group_ = true;
    ++stats_.epochs;
  });
  Log().info("joined epoch {} as rank {} of {} ({} {})", g.epoch, rank, g.members.size(), g.backend,
             g.algorithm);
}

// ----------------------------------------------------------------- transfers

void WeightReceiver::Impl::RunTransfer(const proto::ManifestMsg& manifest) {
  const Layout& layout = manifest.layout;
  const bool catch_up = (layout.transfer & kCatchUpBit) != 0;
  Status st = Status::Ok();
  if (!catch_up && (layout.transfer != epoch_ || !group_ready_)) {
    st = ProtocolError("manifest of version {} for epoch {}, but this receiver is {} epoch {}",
                       layout.version, layout.transfer, group_ready_ ? "in" : "not ready for",
                       epoch_);
  } else if (!catch_up && held_from_inc_ == learner_inc_ && layout.version < held_version_) {
    st = ProtocolError("version {} is older than the version {} already held", layout.version,
                       held_version_);
  } else {
    st = layout.ValidateReceived(config_.max_bytes);
  }
  if (st.ok()) st = ReceiveInto(manifest, catch_up);
  if (st.code() == Code::kCancelled || st.code() == Code::kTimeout ||
      st.code() == Code::kUnavailable) {
    Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.aborted; });
    Log().warn("transfer of version {} abandoned: {}", layout.version, st.ToString());
    // A failed collective leaves the group unusable; wait for the next epoch.
    if (!catch_up && path_ && path_->BreaksOnFailure()) ResetGroup();
    if (st.code() == Code::kCancelled) return;  // superseded: nobody waits for this ack
  } else if (!st.ok()) {
    Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.rejected; });
    Log().warn("rejected version {}: {}", layout.version, st.ToString());
  }
  proto::AckMsg ack;
  ack.version = layout.version;
  ack.transfer = layout.transfer;
  ack.ok = st.ok();
  ack.reason = st.ok() ? "" : st.ToString();
  SendControl(proto::EncodeAck(header(), ack));
}

Status WeightReceiver::Impl::ReceiveInto(const proto::ManifestMsg& manifest, bool catch_up) {
  const Layout& layout = manifest.layout;
  auto progress = [&](uint64_t got, uint64_t total) { Progress(layout.version, got, total); };
  auto interrupt = [this] { return CheckAbort(); };
  Landed landed;
  if (catch_up) {
    // A newcomer's full catch-up always travels over the chunk stream, from the learner.
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, pool_.Get(layout.total_bytes));
    TROUPE_RETURN_IF_ERROR(chunks_->Receive(layout, learner_id_, buf->data(), nullptr,
                                            group_timeout(), interrupt, progress,
                                            &landed.bytes_received));
    landed.data = buf->data();
    landed.owner = buf;
  } else {
    if (!path_) return Unavailable("no group for epoch {}", epoch_);
    TROUPE_ASSIGN_OR_RETURN(landed, path_->Receive(manifest, interrupt, progress));
  }
  Update([&]() TROUPE_REQUIRES(mu_) { stats_.bytes_received += landed.bytes_received; });
  return Deliver(layout, landed, catch_up);
}

Status WeightReceiver::Impl::Deliver(const Layout& layout, const Landed& landed, bool catch_up) {
  if (config_.verify_checksums) TROUPE_RETURN_IF_ERROR(VerifyChecksums(layout, landed.data));
  if (held_from_inc_ == learner_inc_ && layout.version == held_version_ && !catch_up) {
    // The learner retried a broadcast (another member failed) that reached us the first time:
    // we took part again so the group could complete; the sink already has this version.
    return Status::Ok();
  }
  NamedTensors named;
  if (landed.views != nullptr) {
    named = *landed.views;
  } else {
    std::shared_ptr<FlatBuffer> cast;
    uint64_t cast_bytes = CastAreaBytes(layout);
    if (cast_bytes > 0) {
      TROUPE_ASSIGN_OR_RETURN(cast, cast_pool_.Get(cast_bytes));
    }
    TROUPE_ASSIGN_OR_RETURN(named, UnpackTensors(layout, landed.data, landed.owner,
                                                 cast ? cast->data() : nullptr, cast));
  }
  ReceivedWeights w;
  w.version = layout.version;
  w.transfer = layout.transfer;
  w.catch_up = catch_up;
  w.wire_dtype = layout.wire_dtype;
  w.learner_incarnation = learner_inc_;
  w.named = std::move(named);
  if (sink_) {
    Status st = Status::Ok();
    try {
      st = sink_(w);
    } catch (const std::exception& e) {
      st = Internal("weights sink threw: {}", e.what());
    }
    if (!st.ok()) return st.WithContext("weights sink");
  }
  if (landed.still_valid) TROUPE_RETURN_IF_ERROR(landed.still_valid());
  held_version_ = layout.version;
  held_from_inc_ = learner_inc_;
  Update([&]() TROUPE_REQUIRES(mu_) {
    version_ = layout.version;
    ++stats_.delivered;
    if (catch_up) ++stats_.catch_ups;
    if (!sink_) {
      mailbox_ = std::move(w);
      ++mailbox_seq_;
    }
  });
  if (config_.verify_checksums && !layout.checksums.empty() &&
      TraceChecksum(layout.version, &last_traced_)) {
    Log().info("holding version {}: stream checksum {:016x} (verified)", layout.version,
               StreamChecksum(layout));
  } else if (Log().should_log(spdlog::level::debug)) {
    Log().debug("holding version {} ({})", layout.version, catch_up ? "catch-up" : "broadcast");
  }
  return Status::Ok();
}

// ----------------------------------------------------------------- API

Result<ReceivedWeights> WeightReceiver::Impl::Receive(Deadline deadline) {
  if (sink_) return InvalidArgument("Receive() is not available when a sink was given");
  MutexLock l(mu_);
  while (mailbox_seq_ == returned_seq_) {
    if (!refusal_.ok()) return refusal_;
    if (deadline.expired())
      return Timeout("no new weights before the deadline (holding version {})", version_);
    auto until = std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200));
    cv_.wait_until(l, until, [&]() TROUPE_REQUIRES(mu_) { return mailbox_seq_ != returned_seq_; });
  }
  returned_seq_ = mailbox_seq_;
  ReceivedWeights out = std::move(*mailbox_);
  mailbox_.reset();
  return out;
}

Status WeightReceiver::Impl::WaitForVersion(uint64_t version, Deadline deadline) {
  MutexLock l(mu_);
  while (version_ < version) {
    if (!refusal_.ok()) return refusal_;
    if (deadline.expired()) return Timeout("holding version {}, waiting for {}", version_, version);
    auto until = std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200));
    cv_.wait_until(l, until, [&]() TROUPE_REQUIRES(mu_) {
      return version_ >= version || !refusal_.ok();
    });
  }
  return Status::Ok();
}

Status WeightReceiver::Impl::Leave(Deadline deadline) {
  {
    MutexLock l(mu_);
    leave_requested_ = true;
  }
  poller_->Wake();
  Status st = Status::Ok();
  {
    MutexLock l(mu_);
    while (!left_ && !stop_) {
      if (deadline.expired()) {
        st = Timeout("the learner did not confirm the leave before the deadline");
        break;
      }
      auto until = std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200));
      cv_.wait_until(l, until, [&]() TROUPE_REQUIRES(mu_) { return left_ || stop_; });
    }
  }
  Stop(/*say_goodbye=*/!st.ok());
  return st;
}

// ----------------------------------------------------------------- facade

WeightReceiver::WeightReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WeightReceiver::~WeightReceiver() = default;

Result<std::unique_ptr<WeightReceiver>> WeightReceiver::Create(const ReceiverConfig& config,
                                                               transport::Network& network,
                                                               WeightsSink sink,
                                                               ReceiverHooks hooks) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config, network, std::move(sink), std::move(hooks));
  TROUPE_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<WeightReceiver>(new WeightReceiver(std::move(impl)));
}

const std::string& WeightReceiver::data_endpoint() const {
  return impl_->data_endpoint();
}
uint64_t WeightReceiver::version() const {
  return impl_->version();
}
bool WeightReceiver::in_group() const {
  return impl_->in_group();
}
Result<ReceivedWeights> WeightReceiver::Receive(Deadline deadline) {
  return impl_->Receive(deadline);
}
Status WeightReceiver::WaitForVersion(uint64_t version, Deadline deadline) {
  return impl_->WaitForVersion(version, deadline);
}

Status WeightReceiver::refusal() const {
  return impl_->refusal();
}
Status WeightReceiver::Leave(Deadline deadline) {
  return impl_->Leave(deadline);
}
ReceiverStats WeightReceiver::stats() const {
  return impl_->stats();
}

}  // namespace troupe::broadcast
