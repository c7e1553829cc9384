// ZeroMQ implementation of Network. See zmq_network.h for the thread model.
#include "troupe/transport/zmq_network.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/core/thread_name.h"

namespace troupe::transport {
namespace {

spdlog::logger& Log() {
  return log::Get("transport");
}

std::string ZmqError() {
  return zmq_strerror(zmq_errno());
}

// Frames of one received message; closes them when the last view dies.
struct ZmqFrames {
  std::vector<zmq_msg_t> msgs;
  ~ZmqFrames() {
    for (auto& m : msgs) zmq_msg_close(&m);
  }
};

// zmq_msg_init_data free function: drops one reference to the message state.
void ReleaseOutState(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

int PollMs(const Deadline& d, int64_t cap_ms) {
  if (d.is_never()) return static_cast<int>(cap_ms);
  auto rem = d.remaining();
  int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(rem).count();
  if (rem > std::chrono::milliseconds(ms)) ++ms;  // round up: never spin just short of it
  return static_cast<int>(std::min(ms, cap_ms));
}

void DrainEventFd(int fd) {
  uint64_t v;
  while (::read(fd, &v, sizeof v) == sizeof v) {
  }
}

void SignalEventFd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);
  (void)n;  // EAGAIN only if the counter is saturated: it is already readable
}

// "tcp://host:0" -> "tcp://host:*" (ZeroMQ's wildcard port).
std::string BindSpec(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) == 0 && endpoint.size() > 2 &&
      endpoint.compare(endpoint.size() - 2, 2, ":0") == 0) {
    return endpoint.substr(0, endpoint.size() - 1) + "*";
  }
  return endpoint;
}

Status CheckEndpoint(const std::string& endpoint) {
  static const char* kSchemes[] = {"tcp://", "ipc://", "inproc://"};
  bool ok = false;
  for (const char* s : kSchemes) ok = ok || endpoint.rfind(s, 0) == 0;
  if (!ok) {
    return InvalidArgument("endpoint '{}': expected tcp://host:port, ipc://path or inproc://name",
                           endpoint);
  }
  if (endpoint.rfind("ipc://", 0) == 0 && endpoint.size() - 6 > 107) {
    return InvalidArgument("endpoint '{}': ipc path is {} bytes, over the 107-byte socket limit",
                           endpoint, endpoint.size() - 6);
  }
  return Status::Ok();
}

class ZmqNetworkImpl;

// ---------------------------------------------------------------- socket

class ZmqSocket final : public Socket {
 public:
  ZmqSocket(ZmqNetworkImpl* net, SocketKind kind, SocketOptions options, void* sock,
            std::string endpoint);
  ~ZmqSocket() override;

  SocketKind kind() const override { return kind_; }
  const std::string& endpoint() const override { return endpoint_; }
  const NetworkIdentity& identity() const override;
  Status DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) override;
  Result<Incoming> Recv(Deadline deadline) override;
  Status Subscribe(std::string_view topic) override;
  Status ConnectAlso(const std::string& endpoint) override;

  // Poller support.
  bool Readable();
  int zmq_fd() const { return zmq_fd_; }
  int wake_fd() const { return wake_fd_; }
  std::atomic<int>& in_waiters() { return in_waiters_; }

  Status StartMonitor(const std::string& address);

 private:
  // After any operation on the socket: if a receiver waits and input is
  // visible, wake it (the operation may have consumed ZMQ_FD's edge).
  void NotifyIfReadableLocked() TROUPE_REQUIRES(mu_);
  bool TryRecvLocked(ZmqFrames* frames, bool* too_many) TROUPE_REQUIRES(mu_);
  void DrainMonitor();
  Result<Incoming> Decode(std::unique_ptr<ZmqFrames> frames, bool too_many);

  ZmqNetworkImpl* net_;
  const SocketKind kind_;
  const SocketOptions options_;
  const std::string endpoint_;
  Mutex mu_;
  void* sock_ TROUPE_GUARDED_BY(mu_);
  int zmq_fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<int> in_waiters_{0};
  void* monitor_ = nullptr;  // PAIR socket reading this socket's events (Recv thread only)
  Clock::time_point last_monitor_drain_{};
  std::shared_ptr<SegmentBufferPool> pool_ = std::make_shared<SegmentBufferPool>();
};

// ---------------------------------------------------------------- network

class ZmqNetworkImpl final : public Network {
 public:
  explicit ZmqNetworkImpl(const ZmqNetworkOptions& options) : options_(options) {
    identity_ = options.identity;
    if (identity_.incarnation == 0) identity_.incarnation = RandomIncarnation();
    ctx_ = zmq_ctx_new();
    TROUPE_CHECK_MSG(ctx_ != nullptr, "zmq_ctx_new failed: {}", ZmqError());
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, options.io_threads);
    // Unlimited sockets is not a thing; the default 1023 is enough for an actor.
  }

  ~ZmqNetworkImpl() override {
    StopZap();
    TROUPE_CHECK_MSG(live_sockets_.load() == 0,
                     "ZmqNetwork destroyed while {} of its sockets are alive",
                     live_sockets_.load());
    zmq_ctx_term(ctx_);
  }

  Status StartZap();

  Result<std::unique_ptr<Socket>> Bind(SocketKind kind, const std::string& endpoint,
                                       const SocketOptions& options) override {
    if (kind != SocketKind::kServer && kind != SocketKind::kPublisher) {
      return InvalidArgument("Bind: a {} socket connects; bind a server or publisher",
                             SocketKindName(kind));
    }
    return Make(kind, endpoint, options, /*bind=*/true);
  }
  Result<std::unique_ptr<Socket>> Connect(SocketKind kind, const std::string& endpoint,
                                          const SocketOptions& options) override {
    if (kind != SocketKind::kClient && kind != SocketKind::kSubscriber) {
      return InvalidArgument("Connect: a {} socket binds; connect a client or subscriber",
                             SocketKindName(kind));
    }
    return Make(kind, endpoint, options, /*bind=*/false);
  }
  std::unique_ptr<Poller> NewPoller() override;
  TransportCounters& counters() override { return counters_; }
  const NetworkIdentity& identity() const override { return identity_; }

  void* ctx() { return ctx_; }
  void SocketClosed() { live_sockets_.fetch_sub(1); }

 private:
  Result<std::unique_ptr<Socket>> Make(SocketKind kind, const std::string& endpoint,
                                       const SocketOptions& options, bool bind);
  Status Configure(void* s, SocketKind kind, const SocketOptions& o);
  void ZapLoop(void* rep, void* stop);
  void StopZap();

  ZmqNetworkOptions options_;
  NetworkIdentity identity_;
  void* ctx_ = nullptr;
  TransportCounters counters_;
  std::atomic<int> live_sockets_{0};
  std::atomic<int> monitor_seq_{0};
  std::thread zap_thread_;
  void* zap_stop_ = nullptr;  // PAIR, owned by the constructing thread until StopZap
};

Status SetInt(void* s, int opt, int v, const char* name) {
  if (zmq_setsockopt(s, opt, &v, sizeof v) != 0) {
    return Internal("zmq_setsockopt({}={}) failed: {}", name, v, ZmqError());
  }
  return Status::Ok();
}

Status ZmqNetworkImpl::Configure(void* s, SocketKind kind, const SocketOptions& o) {
  TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_SNDHWM, o.send_hwm, "ZMQ_SNDHWM"));
  TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_RCVHWM, o.recv_hwm, "ZMQ_RCVHWM"));
  TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_LINGER, o.linger_ms, "ZMQ_LINGER"));
  TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_RECONNECT_IVL, o.reconnect_ivl_ms, "ZMQ_RECONNECT_IVL"));
  TROUPE_RETURN_IF_ERROR(
      SetInt(s, ZMQ_RECONNECT_IVL_MAX, o.reconnect_ivl_max_ms, "ZMQ_RECONNECT_IVL_MAX"));
  if (o.heartbeat_ivl_ms > 0) {
    TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_HEARTBEAT_IVL, o.heartbeat_ivl_ms, "ZMQ_HEARTBEAT_IVL"));
    TROUPE_RETURN_IF_ERROR(
        SetInt(s, ZMQ_HEARTBEAT_TIMEOUT, o.heartbeat_timeout_ms, "ZMQ_HEARTBEAT_TIMEOUT"));
    TROUPE_RETURN_IF_ERROR(
        SetInt(s, ZMQ_HEARTBEAT_TTL, o.heartbeat_timeout_ms, "ZMQ_HEARTBEAT_TTL"));
  }
  if (o.hard_frame_limit_bytes > 0) {
    int64_t v = o.hard_frame_limit_bytes;
    if (zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &v, sizeof v) != 0) {
      return Internal("zmq_setsockopt(ZMQ_MAXMSGSIZE) failed: {}", ZmqError());
    }
  }
  switch (kind) {
    case SocketKind::kServer:
      TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY"));
      TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER"));
      break;
    case SocketKind::kClient:
      if (zmq_setsockopt(s, ZMQ_ROUTING_ID, o.identity.data(), o.identity.size()) != 0) {
        return Internal("zmq_setsockopt(ZMQ_ROUTING_ID) failed: {}", ZmqError());
      }
      break;
    case SocketKind::kSubscriber:
      for (const auto& t : o.topics) {
        if (zmq_setsockopt(s, ZMQ_SUBSCRIBE, t.data(), t.size()) != 0) {
          return Internal("zmq_setsockopt(ZMQ_SUBSCRIBE) failed: {}", ZmqError());
        }
      }
      break;
    case SocketKind::kPublisher:
      break;
  }
  const auto& curve = options_.curve;
  if (curve.enabled) {
    const bool server_side = kind == SocketKind::kServer || kind == SocketKind::kPublisher;
    if (server_side) {
      if (curve.server.secret_key.empty()) {
        return InvalidArgument("curve: binding a {} socket needs curve.server.secret_key",
                               SocketKindName(kind));
      }
      TROUPE_RETURN_IF_ERROR(SetInt(s, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER"));
      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, curve.server.secret_key.c_str(), 40);
      zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "troupe", 6);
    } else {
      if (curve.client.secret_key.empty()) {
        return InvalidArgument("curve: connecting a {} socket needs curve.client keys",
                               SocketKindName(kind));
      }
      zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, curve.server.public_key.c_str(), 40);
      zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, curve.client.public_key.c_str(), 40);
      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, curve.client.secret_key.c_str(), 40);
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Socket>> ZmqNetworkImpl::Make(SocketKind kind, const std::string& endpoint,
                                                     const SocketOptions& options, bool bind) {
  TROUPE_RETURN_IF_ERROR(options.Validate(kind));
  TROUPE_RETURN_IF_ERROR(CheckEndpoint(endpoint));
  int type = ZMQ_ROUTER;
  switch (kind) {
    case SocketKind::kServer:
      type = ZMQ_ROUTER;
      break;
    case SocketKind::kClient:
      type = ZMQ_DEALER;
      break;
    case SocketKind::kPublisher:
      type = ZMQ_PUB;
      break;
    case SocketKind::kSubscriber:
      type = ZMQ_SUB;
      break;
  }
  void* s = zmq_socket(ctx_, type);
  if (s == nullptr) return Unavailable("zmq_socket failed: {}", ZmqError());
  Status st = Configure(s, kind, options);
  std::string actual = endpoint;
  if (st.ok()) {
    if (bind) {
      if (zmq_bind(s, BindSpec(endpoint).c_str()) != 0) {
        st = Unavailable("bind {} failed: {}", endpoint, ZmqError());
      } else {
        char buf[512];
        size_t len = sizeof buf;
        if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len) == 0 && len > 1) {
          actual.assign(buf, len - 1);
        }
      }
    } else if (zmq_connect(s, endpoint.c_str()) != 0) {
      st = Unavailable("connect {} failed: {}", endpoint, ZmqError());
    }
  }
  if (!st.ok()) {
    zmq_close(s);
    return st;
  }
  live_sockets_.fetch_add(1);
  auto sock = std::make_unique<ZmqSocket>(this, kind, options, s, actual);
  if (bind) {
    Status mon = sock->StartMonitor(
        fmt::format("inproc://troupe-monitor-{}-{}", static_cast<void*>(this), monitor_seq_++));
    if (!mon.ok()) Log().warn("no handshake monitor on {}: {}", actual, mon.ToString());
  }
  if (Log().should_log(spdlog::level::debug)) {
    Log().debug("{} {} {}", SocketKindName(kind), bind ? "bound" : "connected to", actual);
  }
  return std::unique_ptr<Socket>(std::move(sock));
}

// ZAP handler: accepts CURVE clients whose public key is in the allowed list.
Status ZmqNetworkImpl::StartZap() {
  const auto& curve = options_.curve;
  if (!curve.enabled || curve.allowed_client_public_keys.empty()) return Status::Ok();
  void* rep = zmq_socket(ctx_, ZMQ_REP);
  if (zmq_bind(rep, "inproc://zeromq.zap.01") != 0) {
    std::string err = ZmqError();
    zmq_close(rep);
    return Unavailable("cannot start the ZAP handler: {}", err);
  }
  const std::string stop_addr =
      fmt::format("inproc://troupe-zap-stop-{}", static_cast<void*>(this));
  void* stop_rx = zmq_socket(ctx_, ZMQ_PAIR);
  zmq_bind(stop_rx, stop_addr.c_str());
  zap_stop_ = zmq_socket(ctx_, ZMQ_PAIR);
  zmq_connect(zap_stop_, stop_addr.c_str());
  zap_thread_ = std::thread([this, rep, stop_rx] {
    SetThreadName("zap-auth");
    ZapLoop(rep, stop_rx);
  });
  return Status::Ok();
}

void ZmqNetworkImpl::StopZap() {
  if (!zap_thread_.joinable()) return;
  zmq_send(zap_stop_, "", 0, 0);
  zap_thread_.join();
  zmq_close(zap_stop_);
  zap_stop_ = nullptr;
}

void ZmqNetworkImpl::ZapLoop(void* rep, void* stop) {
  std::set<std::string> allowed;
  for (const auto& k : options_.curve.allowed_client_public_keys) {
    auto raw = Z85Decode(k);
    if (raw.ok()) allowed.insert(*raw);
  }
  zmq_pollitem_t items[2] = {{rep, 0, ZMQ_POLLIN, 0}, {stop, 0, ZMQ_POLLIN, 0}};
  while (true) {
    if (zmq_poll(items, 2, -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) break;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::vector<std::string> parts;
    while (true) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, rep, 0) < 0) {
        zmq_msg_close(&m);
        break;
      }
      parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m);
      zmq_msg_close(&m);
      if (!more) break;
    }
    // version, request id, domain, address, routing id, mechanism, credentials...
    if (parts.size() < 6) continue;
    bool ok = false;
    std::string text = "malformed ZAP request";
    if (parts[5] == "CURVE" && parts.size() >= 7) {
      ok = allowed.count(parts[6]) > 0;
      text = ok ? "OK" : "client key not allowed";
    } else {
      text = "mechanism " + parts[5] + " not allowed";
    }
    if (!ok) {
      Bump(counters_.auth_denied);
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "refused a client from {}: {}",
                          parts[3], text);
    }
    const std::string code = ok ? "200" : "400";
    const std::string reply[] = {"1.0", parts[1], code, text, ok ? "troupe" : "", ""};
    for (int i = 0; i < 6; ++i) {
      zmq_send(rep, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
    }
  }
  zmq_close(rep);
  zmq_close(stop);
}

// ---------------------------------------------------------------- socket impl

ZmqSocket::ZmqSocket(ZmqNetworkImpl* net, SocketKind kind, SocketOptions options, void* sock,
                     std::string endpoint)
    : net_(net),
      kind_(kind),
      options_(std::move(options)),
      endpoint_(std::move(endpoint)),
      sock_(sock) {
  size_t len = sizeof zmq_fd_;
  TROUPE_CHECK_EQ(zmq_getsockopt(sock, ZMQ_FD, &zmq_fd_, &len), 0);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TROUPE_CHECK_MSG(wake_fd_ >= 0, "eventfd failed: {}", std::strerror(errno));
}

ZmqSocket::~ZmqSocket() {
  MutexLock l(mu_);
  if (monitor_ != nullptr) {
    zmq_socket_monitor(sock_, nullptr, 0);
    zmq_close(monitor_);
  }
  zmq_close(sock_);
  sock_ = nullptr;
  ::close(wake_fd_);
  net_->SocketClosed();
}

const NetworkIdentity& ZmqSocket::identity() const {
  return net_->identity();
}

Status ZmqSocket::StartMonitor(const std::string& address) {
  {
    MutexLock l(mu_);
    if (zmq_socket_monitor(sock_, address.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
      return Internal("zmq_socket_monitor failed: {}", ZmqError());
    }
  }
  monitor_ = zmq_socket(net_->ctx(), ZMQ_PAIR);
  if (zmq_connect(monitor_, address.c_str()) != 0) {
    zmq_close(monitor_);
    monitor_ = nullptr;
    return Internal("monitor connect failed: {}", ZmqError());
  }
  return Status::Ok();
}

void ZmqSocket::DrainMonitor() {
  if (monitor_ == nullptr) return;
  while (true) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, monitor_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return;
    }
    uint16_t event = 0;
    uint32_t value = 0;
    if (zmq_msg_size(&m) >= 6) {
      std::memcpy(&event, zmq_msg_data(&m), 2);
      std::memcpy(&value, static_cast<char*>(zmq_msg_data(&m)) + 2, 4);
    }
    const bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    if (more) {  // second frame: the endpoint
      zmq_msg_init(&m);
      (void)zmq_msg_recv(&m, monitor_, ZMQ_DONTWAIT);
      zmq_msg_close(&m);
    }
    if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) {
      Bump(net_->counters().handshake_failures);
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000,
                          "{}: refused a connection (handshake failed: event 0x{:x}, ZMTP/ZAP "
                          "code 0x{:x}; wrong or missing CURVE keys, or not a Troupe peer)",
                          endpoint_, event, value);
    }
  }
}

void ZmqSocket::NotifyIfReadableLocked() {
  if (in_waiters_.load(std::memory_order_acquire) == 0) return;
  int events = 0;
  size_t len = sizeof events;
  if (zmq_getsockopt(sock_, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN)) {
    SignalEventFd(wake_fd_);
  }
}

bool ZmqSocket::Readable() {
  MutexLock l(mu_);
  int events = 0;
  size_t len = sizeof events;
  return zmq_getsockopt(sock_, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN);
}

Status ZmqSocket::DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) {
  const bool routed = kind_ == SocketKind::kServer || kind_ == SocketKind::kPublisher;
  if (kind_ == SocketKind::kSubscriber) {
    return InvalidArgument("cannot send on a subscriber socket ({})", endpoint_);
  }
  if (kind_ == SocketKind::kServer && !args.addressed) {
    return InvalidArgument("Send on server socket {} needs a peer: use SendTo(peer, ...)",
                           endpoint_);
  }
  if (kind_ == SocketKind::kClient && args.addressed && !args.to.empty()) {
    return InvalidArgument("SendTo('{}') on client socket {}: a client only talks to its server",
                           args.to, endpoint_);
  }
  message.Seal(SealInfo{identity().actor_id, identity().incarnation});
  std::string header;
  EncodeHeader(message, args.ack_floor, &header);
  const auto segs = Segments(message);

  // Build every frame before taking the lock.
  std::vector<zmq_msg_t> frames(segs.size() + 1 + (routed ? 1 : 0));
  size_t f = 0;
  if (routed) {
    zmq_msg_init_size(&frames[f], args.to.size());
    if (!args.to.empty()) std::memcpy(zmq_msg_data(&frames[f]), args.to.data(), args.to.size());
    ++f;
  }
  zmq_msg_init_size(&frames[f], header.size());
  std::memcpy(zmq_msg_data(&frames[f]), header.data(), header.size());
  ++f;
  size_t bytes = 0;
  for (const auto& s : segs) {
    bytes += s.size;
    if (s.size < kZeroCopyMinBytes) {
      zmq_msg_init_size(&frames[f], s.size);
      std::memcpy(zmq_msg_data(&frames[f]), s.data, s.size);
    } else {
      auto* ref = new std::shared_ptr<const void>(message.state());
      zmq_msg_init_data(&frames[f], const_cast<void*>(s.data), s.size, ReleaseOutState, ref);
    }
    ++f;
  }
  auto close_from = [&](size_t i) {
    for (; i < frames.size(); ++i) zmq_msg_close(&frames[i]);
  };

  int slice_ms = 1;
  while (true) {
    {
      MutexLock l(mu_);
      if (sock_ == nullptr) {
        close_from(0);
        return Unavailable("socket {} is closed", endpoint_);
      }
      const int more0 = frames.size() > 1 ? ZMQ_SNDMORE : 0;
      if (zmq_msg_send(&frames[0], sock_, ZMQ_DONTWAIT | more0) >= 0) {
        for (size_t i = 1; i < frames.size(); ++i) {
          const int more = i + 1 < frames.size() ? ZMQ_SNDMORE : 0;
          if (zmq_msg_send(&frames[i], sock_, ZMQ_DONTWAIT | more) < 0) {
            // Cannot happen for ROUTER/DEALER/PUB once the first part went in.
            std::string err = ZmqError();
            close_from(i);
            Bump(net_->counters().send_failures);
            return Internal("send on {} failed mid-message: {}", endpoint_, err);
          }
        }
        NotifyIfReadableLocked();
        break;
      }
      const int err = zmq_errno();
      NotifyIfReadableLocked();
      if (err == EHOSTUNREACH) {
        close_from(0);
        Bump(net_->counters().send_failures);
        return Unavailable("{}: no connected peer '{}'", endpoint_, args.to);
      }
      if (err != EAGAIN && err != EINTR) {
        close_from(0);
        Bump(net_->counters().send_failures);
        return Internal("send on {} failed: {}", endpoint_, zmq_strerror(err));
      }
    }
    // The peer's queue is full: wait outside the lock in short slices.
    if (deadline.expired()) {
      close_from(0);
      Bump(net_->counters().send_failures);
      return Timeout(
          "send on {}{}{}: the peer's queue stayed full (send_hwm {}) until the deadline",
          endpoint_, args.to.empty() ? "" : " to ", args.to, options_.send_hwm);
    }
    pollfd p{zmq_fd_, POLLIN, 0};
    ::poll(&p, 1, PollMs(deadline, slice_ms));
    slice_ms = std::min(slice_ms * 2, 8);
  }
  Bump(net_->counters().messages_sent);
  Bump(net_->counters().bytes_sent, bytes);
  return Status::Ok();
}

bool ZmqSocket::TryRecvLocked(ZmqFrames* frames, bool* too_many) {
  const size_t cap = options_.limits.max_segments + 2;
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, sock_, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  frames->msgs.push_back(m);
  bool more = zmq_msg_more(&frames->msgs.back());
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, sock_, ZMQ_DONTWAIT) < 0) {  // parts arrive atomically
      zmq_msg_close(&part);
      break;
    }
    more = zmq_msg_more(&part);
    if (frames->msgs.size() < cap) {
      frames->msgs.push_back(part);
    } else {
      *too_many = true;
      zmq_msg_close(&part);
    }
  }
  return true;
}

Result<Incoming> ZmqSocket::Decode(std::unique_ptr<ZmqFrames> frames, bool too_many) {
  Incoming in;
  size_t first = 0;
  if (kind_ == SocketKind::kServer || kind_ == SocketKind::kSubscriber) {
    auto& id = frames->msgs[0];
    in.peer.assign(static_cast<const char*>(zmq_msg_data(&id)), zmq_msg_size(&id));
    first = 1;
  }
  Status err;
  if (too_many) {
    net_->counters().Reject(RejectReason::kTooManySegments);
    err = ResourceExhausted("message has more than {} frames (limits.max_segments = {})",
                            options_.limits.max_segments + 1, options_.limits.max_segments);
  } else {
    FrameSet fs;
    fs.frames.reserve(frames->msgs.size() - first);
    for (size_t i = first; i < frames->msgs.size(); ++i) {
      fs.frames.push_back({zmq_msg_data(&frames->msgs[i]), zmq_msg_size(&frames->msgs[i])});
    }
    fs.owner = std::shared_ptr<ZmqFrames>(std::move(frames));
    auto msg = DecodeMessage(std::move(fs), options_.limits, &net_->counters(), pool_);
    if (msg.ok()) {
      in.message = std::move(msg).value();
      return in;
    }
    err = msg.status();
  }
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "{}: rejected a message{}{}: {}", endpoint_,
                      in.peer.empty() ? "" : " from ", in.peer, err.ToString());
  return err.WithContext(
      fmt::format("{}{}{}", endpoint_, in.peer.empty() ? "" : " from ", in.peer));
}

Result<Incoming> ZmqSocket::Recv(Deadline deadline) {
  in_waiters_.fetch_add(1, std::memory_order_acq_rel);
  struct Guard {
    std::atomic<int>& w;
    ~Guard() { w.fetch_sub(1, std::memory_order_acq_rel); }
  } guard{in_waiters_};
  while (true) {
    auto frames = std::make_unique<ZmqFrames>();
    bool too_many = false;
    bool got;
    {
      MutexLock l(mu_);
      if (sock_ == nullptr) return Unavailable("socket {} is closed", endpoint_);
      got = TryRecvLocked(frames.get(), &too_many);
    }
    if (got) return Decode(std::move(frames), too_many);
    // Idle: count refused handshakes (at most every 20 ms: each check costs a
    // syscall inside ZeroMQ).
    const auto now = Clock::now();
    if (monitor_ != nullptr && now - last_monitor_drain_ >= std::chrono::milliseconds(20)) {
      last_monitor_drain_ = now;
      DrainMonitor();
    }
    if (deadline.expired()) {
      return Timeout("no message on {} before the deadline", endpoint_);
    }
    pollfd p[2] = {{zmq_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Cap the wait so monitor events are counted even on an idle socket.
    int rc = ::poll(p, 2, PollMs(deadline, monitor_ != nullptr ? 100 : 1000));
    if (rc > 0 && (p[1].revents & POLLIN)) DrainEventFd(wake_fd_);
  }
}

Status ZmqSocket::Subscribe(std::string_view topic) {
  if (kind_ != SocketKind::kSubscriber) {
    return InvalidArgument("Subscribe on a {} socket ({})", SocketKindName(kind_), endpoint_);
  }
  MutexLock l(mu_);
  if (zmq_setsockopt(sock_, ZMQ_SUBSCRIBE, topic.data(), topic.size()) != 0) {
    return Internal("subscribe failed: {}", ZmqError());
  }
  return Status::Ok();
}

Status ZmqSocket::ConnectAlso(const std::string& endpoint) {
  if (kind_ != SocketKind::kSubscriber) {
    return InvalidArgument("ConnectAlso on a {} socket ({})", SocketKindName(kind_), endpoint_);
  }
  TROUPE_RETURN_IF_ERROR(CheckEndpoint(endpoint));
  MutexLock l(mu_);
  if (zmq_connect(sock_, endpoint.c_str()) != 0) {
    return Unavailable("connect {} failed: {}", endpoint, ZmqError());
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- poller

class ZmqPoller final : public Poller {
 public:
  ZmqPoller() {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    TROUPE_CHECK_MSG(wake_fd_ >= 0, "eventfd failed: {}", std::strerror(errno));
  }
  ~ZmqPoller() override { ::close(wake_fd_); }

  void Add(Socket* socket) override {
    auto* z = dynamic_cast<ZmqSocket*>(socket);
    TROUPE_CHECK_MSG(z != nullptr, "ZmqPoller::Add: socket is not from a ZmqNetwork");
    if (std::find(sockets_.begin(), sockets_.end(), z) == sockets_.end()) sockets_.push_back(z);
  }
  void Remove(Socket* socket) override {
    sockets_.erase(std::remove(sockets_.begin(), sockets_.end(), socket), sockets_.end());
  }
  void Wake() override { SignalEventFd(wake_fd_); }

  Result<std::vector<Socket*>> Wait(Deadline deadline) override {
    for (auto* s : sockets_) s->in_waiters().fetch_add(1, std::memory_order_acq_rel);
    struct Guard {
      std::vector<ZmqSocket*>& s;
      ~Guard() {
        for (auto* x : s) x->in_waiters().fetch_sub(1, std::memory_order_acq_rel);
      }
    } guard{sockets_};
    std::vector<pollfd> fds;
    while (true) {
      std::vector<Socket*> ready;
      for (auto* s : sockets_) {
        if (s->Readable()) ready.push_back(s);
      }
      if (!ready.empty()) return ready;
      fds.clear();
      for (auto* s : sockets_) {
        fds.push_back({s->zmq_fd(), POLLIN, 0});
        fds.push_back({s->wake_fd(), POLLIN, 0});
      }
      fds.push_back({wake_fd_, POLLIN, 0});
      // Check the wake fd before giving up on the deadline: a Wake() that
      // happened before this call must still be reported.
      if (deadline.expired()) {
        pollfd w{wake_fd_, POLLIN, 0};
        if (::poll(&w, 1, 0) > 0) {
          DrainEventFd(wake_fd_);
          return std::vector<Socket*>{};
        }
        return Timeout("no message on {} socket(s) before the deadline", sockets_.size());
      }
      int rc = ::poll(fds.data(), fds.size(), PollMs(deadline, 1000));
      if (rc <= 0) continue;
      for (size_t i = 0; i + 1 < fds.size(); i += 2) {
        if (fds[i + 1].revents & POLLIN) DrainEventFd(fds[i + 1].fd);
      }
      if (fds.back().revents & POLLIN) {
        DrainEventFd(wake_fd_);
        return std::vector<Socket*>{};
      }
    }
  }

 private:
  std::vector<ZmqSocket*> sockets_;
  int wake_fd_ = -1;
};

std::unique_ptr<Poller> ZmqNetworkImpl::NewPoller() {
  return std::make_unique<ZmqPoller>();
}

}  // namespace

Status ZmqNetworkOptions::Validate() const {
  if (io_threads < 1 || io_threads > 64) {
    return InvalidArgument("io_threads = {}: must be in 1..64", io_threads);
  }
  if (identity.actor_id.empty()) return InvalidArgument("identity.actor_id is empty");
  return curve.Validate();
}

Result<std::unique_ptr<Network>> NewZmqNetwork(const ZmqNetworkOptions& options) {
  TROUPE_RETURN_IF_ERROR(options.Validate());
  auto net = std::make_unique<ZmqNetworkImpl>(options);
  TROUPE_RETURN_IF_ERROR(net->StartZap());
  return std::unique_ptr<Network>(std::move(net));
}

}  // namespace troupe::transport
