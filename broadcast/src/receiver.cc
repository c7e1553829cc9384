// WeightReceiver: registration, group epochs, every backend's receiving side,
// relaying along a chain, delivery and acknowledgement (receiver.h).
#include "troupe/broadcast/receiver.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "buffer_pool.h"
#include "gloo_group.h"
#include "protocol.h"
#include "reaper.h"
#include "shm_segment.h"
#include "troupe/broadcast/layout.h"
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

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^ (static_cast<uint64_t>(::getpid()) << 16);
  return v == 0 ? 1 : v;
}

}  // namespace

class WeightReceiver::Impl {
 public:
  Impl(const ReceiverConfig& config, WeightsSink sink, ReceiverHooks hooks)
      : config_(config),
        sink_(std::move(sink)),
        hooks_(std::move(hooks)),
        incarnation_(RandomIncarnation()),
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
  Result<ReceivedWeights> Receive(Deadline deadline);
  Status WaitForVersion(uint64_t version, Deadline deadline);
  Status Leave(Deadline deadline);

 private:
  // --- receiver thread
  void Run();
  void Wake();
  std::optional<proto::Message> NextControl(int timeout_ms);
  std::optional<proto::Message> ReadControl();
  void Handle(const proto::Message& msg);
  bool IsAbortive(const proto::Message& msg) const;
  bool CheckAbort(int wait_ms);
  void SendControl(const proto::Bytes& bytes);
  void SendRegister();
  void SendHeartbeat();
  void ResetGroup();
  void FormGroup(const proto::GroupMsg& g, int rank);
  void RunTransfer(const proto::ManifestMsg& manifest);
  Status ReceiveInto(const proto::ManifestMsg& manifest, bool catch_up);
  Status ReceiveStream(const Layout& layout, const std::shared_ptr<FlatBuffer>& buf, bool relay);
  // `views`: ready-made tensors over `data` (shm zero copy), else unpacked here.
  Status Deliver(const Layout& layout, const uint8_t* data, std::shared_ptr<void> owner,
                 bool catch_up, const NamedTensors* views = nullptr);
  void Progress(uint64_t version, uint64_t received, uint64_t total) {
    if (hooks_.on_progress) hooks_.on_progress(version, received, total);
  }
  proto::Header header() const { return proto::Header{config_.actor_id, incarnation_}; }
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
  std::optional<ReceivedWeights> mailbox_ TROUPE_GUARDED_BY(mu_);
  uint64_t mailbox_seq_ TROUPE_GUARDED_BY(mu_) = 0;
  uint64_t returned_seq_ TROUPE_GUARDED_BY(mu_) = 0;
  int wake_fd_ = -1;
  std::thread thread_;

  // Receiver-thread state.
  ZmqContext ctx_;
  ZmqSocket control_;
  ZmqSocket data_;
  ZmqSocket next_;  // chain successor (zmq chain)
  uint64_t learner_inc_ = 0;
  bool welcomed_ = false;
  bool leave_sent_ = false;
  Clock::time_point last_heard_, last_register_, last_heartbeat_;
  uint64_t held_version_ = 0;   // version_ as seen by this thread
  uint64_t held_from_inc_ = 0;  // learner incarnation that sent it
  uint64_t epoch_ = 0;
  bool group_ready_ = false;
  int rank_ = 0;
  proto::GroupMsg group_;
  Backend backend_ = Backend::kZmq;
  std::unique_ptr<GlooStore> store_;
  std::shared_ptr<GlooGroup> gloo_;
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  std::shared_ptr<NcclGroup> nccl_;
#endif
  std::unique_ptr<ShmReader> shm_;
  struct ShmViews {
    Layout layout;
    NamedTensors named;
  };
  std::map<uint64_t, ShmViews> shm_views_;  // by slot offset; cleared before shm_ changes
  BufferPool pool_{3};
  BufferPool cast_pool_{3};
  std::deque<proto::Message> pending_;
  Reaper reaper_;
};

// ----------------------------------------------------------------- lifecycle

Status WeightReceiver::Impl::Start() {
  TROUPE_ASSIGN_OR_RETURN(data_, ZmqSocket::Create(ctx_, ZMQ_PULL));
  TROUPE_RETURN_IF_ERROR(data_.SetInt(ZMQ_RCVHWM, config_.zmq_hwm_chunks));
  TROUPE_ASSIGN_OR_RETURN(data_endpoint_, data_.Bind(config_.data_endpoint));
  TROUPE_ASSIGN_OR_RETURN(control_, ZmqSocket::Create(ctx_, ZMQ_DEALER));
  TROUPE_RETURN_IF_ERROR(control_.SetBytes(ZMQ_ROUTING_ID, config_.actor_id));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_IMMEDIATE, 1));  // drop, don't queue, when offline
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_RECONNECT_IVL, 50));
  TROUPE_RETURN_IF_ERROR(control_.SetInt(ZMQ_RECONNECT_IVL_MAX, 500));
  TROUPE_RETURN_IF_ERROR(control_.Connect(config_.learner_endpoint));
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return IoError("eventfd: {}", std::strerror(errno));
  Log().info("weights receiver {} (data {}) -> learner {}", config_.actor_id, data_endpoint_,
             config_.learner_endpoint);
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void WeightReceiver::Impl::Wake() {
  if (wake_fd_ < 0) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void WeightReceiver::Impl::Stop(bool say_goodbye) {
  {
    MutexLock l(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  Wake();
  thread_.join();
  if (say_goodbye && control_) {
    // Tell the learner at once, so no broadcast waits a timeout for us.
    control_.SetInt(ZMQ_LINGER, 200).IgnoreError();
    SendControl(proto::EncodeHeartbeat(header(), {PeerState::kExited, held_version_}));
  }
  next_.Close();
  data_.Close();
  control_.Close();
  reaper_.Add(std::move(gloo_));
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  reaper_.Add(std::move(nccl_));
#endif
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
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
    if (!welcomed_ && now - last_register_ >= heartbeat) SendRegister();
    if (now - last_heartbeat_ >= heartbeat) SendHeartbeat();
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
      epoch_ = 0;
    }
  }
  ResetGroup();
}

// ----------------------------------------------------------------- control plane

std::optional<proto::Message> WeightReceiver::Impl::ReadControl() {
  std::string frame;
  bool more = false;
  auto got = control_.TryRecv(&frame, &more);
  if (!got.ok() || !*got) return std::nullopt;
  if (more) control_.DrainMore();
  auto msg = proto::Decode(frame.data(), frame.size());
  if (!msg.ok()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "bad message from the learner: {}",
                        msg.status().ToString());
    return std::nullopt;
  }
  return std::move(msg).value();
}

std::optional<proto::Message> WeightReceiver::Impl::NextControl(int timeout_ms) {
  if (!pending_.empty()) {
    auto m = std::move(pending_.front());
    pending_.pop_front();
    return m;
  }
  zmq_pollitem_t items[2] = {{control_.get(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, 2, timeout_ms) <= 0) return std::nullopt;
  if (items[1].revents & ZMQ_POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof(v));
  }
  if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;
  return ReadControl();
}

// A message that must end the transfer in progress (handled after it by the main loop).
bool WeightReceiver::Impl::IsAbortive(const proto::Message& m) const {
  if (learner_inc_ != 0 && m.incarnation != learner_inc_) return true;
  switch (m.kind) {
    case Kind::kGroup:
      return m.group.epoch > epoch_;
    case Kind::kManifest:
      return true;
    case Kind::kHeartbeat:
      return m.heartbeat.state != PeerState::kAlive;
    default:
      return false;
  }
}

// Reads control messages that arrived during a transfer (waiting up to `wait_ms` for one):
// keepalives are consumed, everything else is kept for the main loop. True when the transfer
// must be abandoned (newer epoch, new transfer, learner change, stop).
bool WeightReceiver::Impl::CheckAbort(int wait_ms) {
  if (stopping()) return true;
  bool abort = std::any_of(pending_.begin(), pending_.end(),
                           [&](const proto::Message& m) { return IsAbortive(m); });
  if (wait_ms > 0 && !abort) control_.WaitReadable(wait_ms);
  while (auto m = ReadControl()) {
    if (m->incarnation == learner_inc_) last_heard_ = Clock::now();
    if (m->kind == Kind::kHeartbeat && !IsAbortive(*m)) continue;
    abort = abort || IsAbortive(*m);
    pending_.push_back(std::move(*m));
  }
  return abort || stopping();
}

void WeightReceiver::Impl::SendControl(const proto::Bytes& bytes) {
  // DEALER with ZMQ_IMMEDIATE: when the learner is not connected the message is dropped
  // (heartbeats and registrations are repeated; acks are re-requested by the learner).
  control_.Send(bytes, false, Deadline::InMs(50)).IgnoreError();
}

void WeightReceiver::Impl::SendRegister() {
  last_register_ = Clock::now();
  proto::RegisterMsg r;
  r.node = node_;
  r.pid = static_cast<int32_t>(::getpid());
  r.data_endpoint = data_endpoint_;
  r.version = held_version_;
  SendControl(proto::EncodeRegister(header(), r));
}

void WeightReceiver::Impl::SendHeartbeat() {
  last_heartbeat_ = Clock::now();
  PeerState state = leave_sent_ ? PeerState::kLeaving : PeerState::kAlive;
  SendControl(proto::EncodeHeartbeat(header(), {state, held_version_}));
}

void WeightReceiver::Impl::Handle(const proto::Message& msg) {
  if (msg.kind == Kind::kRegister || msg.kind == Kind::kAck || msg.kind == Kind::kChunk) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000,
                        "unexpected message kind from '{}' on the control socket", msg.sender);
    return;
  }
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
    welcomed_ = false;
  }
  last_heard_ = Clock::now();
  switch (msg.kind) {
    case Kind::kHeartbeat:
      if (msg.heartbeat.state == PeerState::kAlive) {
        welcomed_ = true;
      } else if (msg.heartbeat.state == PeerState::kUnknown) {
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
      auto it = std::find(g.members.begin(), g.members.end(), config_.actor_id);
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
  reaper_.Add(std::move(gloo_));
#ifdef TROUPE_BROADCAST_HAVE_NCCL
  reaper_.Add(std::move(nccl_));
#endif
  next_.Close();
  group_ready_ = false;
  Update([&]() TROUPE_REQUIRES(mu_) { in_group_ = false; });
}

void WeightReceiver::Impl::FormGroup(const proto::GroupMsg& g, int rank) {
  ResetGroup();
  group_ = g;
  epoch_ = g.epoch;
  rank_ = rank;
  auto backend = ParseBackend(g.backend);
  if (!backend.ok() || !BackendCompiled(*backend)) {
    Log().error("epoch {}: backend '{}' is not available in this build", g.epoch, g.backend);
    return;
  }
  backend_ = *backend;
  if (g.endpoints.size() != g.members.size() || rank <= 0) {
    Log().error("epoch {}: malformed group ({} members, {} endpoints, rank {})", g.epoch,
                g.members.size(), g.endpoints.size(), rank);
    return;
  }
  const int size = static_cast<int>(g.members.size());
  Status st = Status::Ok();
  switch (backend_) {
    case Backend::kGloo: {
      if (!store_ || store_->address() != g.store_address) {
        store_.reset();
        auto s = GlooStore::Connect(g.store_address, group_timeout());
        if (!s.ok()) {
          st = s.status();
          break;
        }
        store_ = std::move(s).value();
      }
      auto pg =
          GlooGroup::Form(*store_, g.epoch, rank, size, config_.gloo_hostname, group_timeout());
      if (!pg.ok()) {
        st = pg.status();
        break;
      }
      gloo_ = std::shared_ptr<GlooGroup>(std::move(pg).value());
      break;
    }
    case Backend::kNccl: {
#ifdef TROUPE_BROADCAST_HAVE_NCCL
      auto comm = NcclGroup::Form(g.nccl_id, rank, size, config_.nccl_device,
                                  Deadline::In(group_timeout()), [this] { return CheckAbort(1); });
      if (!comm.ok()) {
        st = comm.status();
        break;
      }
      nccl_ = std::shared_ptr<NcclGroup>(std::move(comm).value());
#endif
      break;
    }
    case Backend::kZmq:
      if (g.algorithm == "chain" && rank + 1 < size) {
        auto s = ZmqSocket::Create(ctx_, ZMQ_PUSH);
        if (!s.ok()) {
          st = s.status();
          break;
        }
        next_ = std::move(s).value();
        st = next_.SetInt(ZMQ_SNDHWM, config_.zmq_hwm_chunks);
        if (st.ok()) st = next_.SetInt(ZMQ_IMMEDIATE, 1);
        if (st.ok()) st = next_.Connect(g.endpoints[rank + 1]);
      }
      break;
    case Backend::kShm:
      break;
  }
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
  Log().info("joined epoch {} as rank {} of {} ({} {})", g.epoch, rank, size, g.backend,
             g.algorithm);
}

// ----------------------------------------------------------------- transfers

void WeightReceiver::Impl::RunTransfer(const proto::ManifestMsg& manifest) {
  const Layout& layout = manifest.layout;
  const bool catch_up = (layout.transfer & kCatchUpBit) != 0;
  auto reply = [&](const Status& st) {
    proto::AckMsg ack;
    ack.version = layout.version;
    ack.transfer = layout.transfer;
    ack.ok = st.ok();
    ack.reason = st.ok() ? "" : st.ToString();
    SendControl(proto::EncodeAck(header(), ack));
  };
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
    if (!catch_up && backend_ != Backend::kZmq && backend_ != Backend::kShm) {
      // A failed collective leaves the group unusable; wait for the next epoch.
      ResetGroup();
    }
    if (st.code() == Code::kCancelled) return;  // superseded: nobody waits for this ack
  } else if (!st.ok()) {
    Update([&]() TROUPE_REQUIRES(mu_) { ++stats_.rejected; });
    Log().warn("rejected version {}: {}", layout.version, st.ToString());
  }
  reply(st);
}

Status WeightReceiver::Impl::ReceiveInto(const proto::ManifestMsg& manifest, bool catch_up) {
  const Layout& layout = manifest.layout;
  if (!catch_up && backend_ == Backend::kShm && !manifest.shm_segment.empty()) {
    if (!shm_ || shm_->name() != manifest.shm_segment) {
      shm_views_.clear();  // they point into the old mapping
      shm_.reset();
      TROUPE_ASSIGN_OR_RETURN(shm_, ShmReader::Open(manifest.shm_segment));
    }
    TROUPE_ASSIGN_OR_RETURN(const uint8_t* src,
                            shm_->Slot(manifest.shm_offset, layout.total_bytes));
    auto torn = [&] { return shm_->Generation(manifest.shm_offset) != manifest.shm_generation; };
    if (torn())
      return Unavailable(
          "shm slot of version {} was rewritten before it was read (generation "
          "{} != {})",
          layout.version, shm_->Generation(manifest.shm_offset), manifest.shm_generation);
    bool zero_copy = sink_ && config_.shm_zero_copy;
    if (!zero_copy) {
      TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, pool_.Get(layout.total_bytes));
      uint8_t* dst = buf->data();
      std::memcpy(dst, src, layout.total_bytes);
      if (torn())
        return Unavailable("shm slot of version {} was rewritten while copied", layout.version);
      Progress(layout.version, layout.total_bytes, layout.total_bytes);
      return Deliver(layout, dst, buf, false);
    }
    Progress(layout.version, layout.total_bytes, layout.total_bytes);
    // Views over a slot stay valid as long as the mapping: build them once per slot and layout.
    const NamedTensors* views = nullptr;
    if (CastAreaBytes(layout) == 0) {
      ShmViews& v = shm_views_[manifest.shm_offset];
      if (!v.layout.SameTensors(layout) || v.named.size() != layout.slots.size()) {
        TROUPE_ASSIGN_OR_RETURN(v.named, UnpackTensors(layout, src, nullptr, nullptr, nullptr));
        v.layout = layout;
      }
      views = &v.named;
    }
    Status st = Deliver(layout, src, nullptr, false, views);
    if (st.ok() && torn())
      return Unavailable("shm slot of version {} was rewritten while the sink used it",
                         layout.version);
    return st;
  }
  TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<FlatBuffer> buf, pool_.Get(layout.total_bytes));
  uint8_t* dst = buf->data();
  Status st = Status::Ok();
  if (catch_up || backend_ == Backend::kZmq || backend_ == Backend::kShm) {
    bool relay = !catch_up && backend_ == Backend::kZmq && next_;
    st = ReceiveStream(layout, buf, relay);
  } else if (backend_ == Backend::kGloo) {
    if (!gloo_) return Unavailable("no gloo group for epoch {}", epoch_);
    auto algorithm =
        group_.algorithm == "broadcast" ? GlooAlgorithm::kBroadcast : GlooAlgorithm::kChain;
    st = gloo_->Transfer(buf, dst, layout, algorithm, Deadline::Never(),
                         [&](uint64_t got) { Progress(layout.version, got, layout.total_bytes); });
  } else {
#ifdef TROUPE_BROADCAST_HAVE_NCCL
    if (!nccl_) return Unavailable("no nccl communicator for epoch {}", epoch_);
    st = nccl_->Transfer(dst, layout, Deadline::In(group_timeout() * 10),
                         [this] { return CheckAbort(1); });
    if (st.ok()) Progress(layout.version, layout.total_bytes, layout.total_bytes);
#else
    st = Unavailable("nccl backend not built");
#endif
  }
  if (!st.ok()) return st;
  Update([&]() TROUPE_REQUIRES(mu_) { stats_.bytes_received += layout.total_bytes; });
  return Deliver(layout, dst, buf, catch_up);
}

// Receives the chunks of `layout` from the data socket, in order, into `buf`, forwarding
// each to the chain successor when `relay`. Chunks of other transfers are stale: dropped.
Status WeightReceiver::Impl::ReceiveStream(const Layout& layout,
                                           const std::shared_ptr<FlatBuffer>& buf, bool relay) {
  uint8_t* dst = buf->data();
  const auto stall_window = group_timeout();
  Deadline stall = Deadline::In(stall_window);
  uint64_t expected = 0;
  bool relay_ok = relay;
  std::string head;
  while (true) {
    if (CheckAbort(0)) return Cancelled("transfer of version {} superseded", layout.version);
    if (stall.expired())
      return Timeout("no data for version {} for {} ms ({} of {} bytes received)", layout.version,
                     stall_window.count(), expected, layout.total_bytes);
    auto ready = PollReadable({data_.get(), control_.get()}, 20);
    if (!ready[0]) continue;
    bool more = false;
    auto got = data_.TryRecv(&head, &more);
    if (!got.ok()) return got.status();
    if (!*got) continue;
    auto msg = proto::Decode(head.data(), head.size());
    bool ours = msg.ok() && msg->kind == Kind::kChunk && msg->chunk.version == layout.version &&
                msg->chunk.transfer == layout.transfer;
    if (!ours || !more) {
      if (more) data_.DrainMore();
      if (!msg.ok())
        TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 5000, "bad chunk header: {}",
                            msg.status().ToString());
      continue;  // stale chunk of an earlier transfer
    }
    uint64_t offset = 0;
    if (!msg->chunk.Absolute(layout.bucket_bytes, &offset) || offset != expected)
      return ProtocolError("chunk of version {} at offset {} (expected {})", layout.version, offset,
                           expected);
    int n = zmq_recv(data_.get(), dst + expected, layout.total_bytes - expected, ZMQ_DONTWAIT);
    if (n < 0) return ZmqError("receiving a weights chunk");
    if (static_cast<uint64_t>(n) > layout.total_bytes - expected)
      return Malformed("chunk at offset {} of {} bytes runs past the stream end {}", expected, n,
                       layout.total_bytes);
    int rcvmore = 0;
    size_t len = sizeof(rcvmore);
    zmq_getsockopt(data_.get(), ZMQ_RCVMORE, &rcvmore, &len);
    if (rcvmore) {
      data_.DrainMore();
      return ProtocolError("weights chunk with more than one payload frame");
    }
    if (relay_ok) {
      Deadline step = Deadline::In(stall_window);
      Status st = next_.Send(head, true, step);
      if (st.ok()) st = next_.SendZeroCopy(dst + expected, n, buf, false, step);
      if (!st.ok()) {
        relay_ok = false;  // keep receiving our own copy; the learner re-forms the chain
        Log().warn("relaying version {} to {} failed: {}", layout.version,
                   group_.endpoints[rank_ + 1], st.ToString());
      }
    }
    expected += static_cast<uint64_t>(n);
    stall = Deadline::In(stall_window);
    Progress(layout.version, expected, layout.total_bytes);
    if (msg->chunk.last) {
      if (expected != layout.total_bytes)
        return Malformed("last chunk of version {} after {} of {} bytes", layout.version, expected,
                         layout.total_bytes);
      return Status::Ok();
    }
  }
}

Status WeightReceiver::Impl::Deliver(const Layout& layout, const uint8_t* data,
                                     std::shared_ptr<void> owner, bool catch_up,
                                     const NamedTensors* views) {
  if (config_.verify_checksums) TROUPE_RETURN_IF_ERROR(VerifyChecksums(layout, data));
  if (held_from_inc_ == learner_inc_ && layout.version == held_version_ && !catch_up) {
    // The learner retried a broadcast (another member failed) that reached us the first time:
    // we took part again so the group could complete; the sink already has this version.
    return Status::Ok();
  }
  NamedTensors named;
  if (views != nullptr) {
    named = *views;
  } else {
    std::shared_ptr<FlatBuffer> cast;
    uint64_t cast_bytes = CastAreaBytes(layout);
    if (cast_bytes > 0) {
      TROUPE_ASSIGN_OR_RETURN(cast, cast_pool_.Get(cast_bytes));
    }
    TROUPE_ASSIGN_OR_RETURN(
        named, UnpackTensors(layout, data, std::move(owner), cast ? cast->data() : nullptr, cast));
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
  if (Log().should_log(spdlog::level::debug))
    Log().debug("holding version {} ({})", layout.version, catch_up ? "catch-up" : "broadcast");
  return Status::Ok();
}

// ----------------------------------------------------------------- API

Result<ReceivedWeights> WeightReceiver::Impl::Receive(Deadline deadline) {
  if (sink_) return InvalidArgument("Receive() is not available when a sink was given");
  MutexLock l(mu_);
  while (mailbox_seq_ == returned_seq_) {
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
    if (deadline.expired()) return Timeout("holding version {}, waiting for {}", version_, version);
    auto until = std::min(deadline.at(), Clock::now() + std::chrono::milliseconds(200));
    cv_.wait_until(l, until, [&]() TROUPE_REQUIRES(mu_) { return version_ >= version; });
  }
  return Status::Ok();
}

Status WeightReceiver::Impl::Leave(Deadline deadline) {
  {
    MutexLock l(mu_);
    leave_requested_ = true;
  }
  Wake();
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
                                                               WeightsSink sink,
                                                               ReceiverHooks hooks) {
  TROUPE_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(config, std::move(sink), std::move(hooks));
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
Status WeightReceiver::Leave(Deadline deadline) {
  return impl_->Leave(deadline);
}
ReceiverStats WeightReceiver::stats() const {
  return impl_->stats();
}

}  // namespace troupe::broadcast
