// MemoryNetwork: in-process sockets with ZeroMQ's semantics (memory_network.h).
//
// Lock order: fabric mutex, then a socket core's mutex, then a poller's
// mutex. Nobody waits on a condition variable while holding the fabric mutex.
#include "troupe/transport/memory_network.h"

#include <algorithm>
#include <deque>
#include <list>
#include <map>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"

namespace troupe::transport {
namespace detail {
namespace {

spdlog::logger& Log() {
  return log::Get("transport");
}

class MemPoller;

// What travels: the header frame plus references to the message's segments.
struct MemFrames {
  std::string header;
  std::shared_ptr<const void> state;  // keeps the segments alive
  std::vector<FrameRef> segments;
};

struct Item {
  std::string peer;  // client identity (to a server) or topic (to a subscriber)
  std::shared_ptr<const MemFrames> frames;
};

// The shared state of one socket (the fabric and peers hold it too).
struct Core {
  SocketKind kind;
  std::string endpoint;
  std::string actor_id;
  SocketOptions options;
  TransportCounters* counters = nullptr;

  Mutex mu;
  CondVar cv;  // inbox grew / space freed / died
  bool dead TROUPE_GUARDED_BY(mu) = false;
  std::deque<Item> inbox TROUPE_GUARDED_BY(mu);
  std::map<std::string, size_t> per_peer TROUPE_GUARDED_BY(mu);  // server: queued per client
  std::deque<Item> pending TROUPE_GUARDED_BY(mu);  // client: waiting for a server to bind
  std::vector<std::string> topics TROUPE_GUARDED_BY(mu);
  std::vector<MemPoller*> pollers TROUPE_GUARDED_BY(mu);

  void NotifyLocked() TROUPE_REQUIRES(mu);
  // Appends to the inbox, then wakes receivers and pollers.
  void PushLocked(Item item) TROUPE_REQUIRES(mu) {
    if (kind == SocketKind::kServer) ++per_peer[item.peer];
    inbox.push_back(std::move(item));
    NotifyLocked();
  }
};

class MemPoller final : public Poller {
 public:
  ~MemPoller() override {
    for (auto& c : cores_) {
      MutexLock l(c->mu);
      c->pollers.erase(std::remove(c->pollers.begin(), c->pollers.end(), this), c->pollers.end());
    }
  }
  void Add(Socket* socket) override;
  void Remove(Socket* socket) override;
  Result<std::vector<Socket*>> Wait(Deadline deadline) override;
  void Wake() override {
    MutexLock l(mu_);
    woken_ = true;
    cv_.notify_all();
  }
  void Signal() {
    MutexLock l(mu_);
    signaled_ = true;
    cv_.notify_all();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool signaled_ TROUPE_GUARDED_BY(mu_) = false;
  bool woken_ TROUPE_GUARDED_BY(mu_) = false;
  std::vector<Socket*> sockets_;
  std::vector<std::shared_ptr<Core>> cores_;
};

void Core::NotifyLocked() {
  cv.notify_all();
  for (auto* p : pollers) p->Signal();
}

std::string ResolvePort(const std::string& endpoint, int* next_port) {
  if (endpoint.size() > 2 && (endpoint.compare(endpoint.size() - 2, 2, ":0") == 0 ||
                              endpoint.compare(endpoint.size() - 2, 2, ":*") == 0)) {
    return endpoint.substr(0, endpoint.size() - 1) + std::to_string((*next_port)++);
  }
  return endpoint;
}

std::shared_ptr<const MemFrames> Frame(const OutMessage& m, uint64_t ack_floor,
                                       const NetworkIdentity& id, size_t* bytes) {
  m.Seal(SealInfo{id.actor_id, id.incarnation});
  auto f = std::make_shared<MemFrames>();
  EncodeHeader(m, ack_floor, &f->header);
  f->state = m.state();
  *bytes = 0;
  for (auto s : Segments(m)) {
    f->segments.push_back({s.data, s.size});
    *bytes += s.size;
  }
  return f;
}

}  // namespace

class MemoryFabricImpl : public std::enable_shared_from_this<MemoryFabricImpl> {
 public:
  Mutex mu;
  std::map<std::string, std::shared_ptr<Core>> bound TROUPE_GUARDED_BY(mu);
  // Clients and subscribers by the endpoint they connect to (oldest first).
  std::multimap<std::string, std::weak_ptr<Core>> connections TROUPE_GUARDED_BY(mu);
  std::list<std::weak_ptr<Core>> all TROUPE_GUARDED_BY(mu);
  int next_port TROUPE_GUARDED_BY(mu) = 20000;

  void Kill(const std::shared_ptr<Core>& c) TROUPE_REQUIRES(mu) {
    {
      MutexLock l(c->mu);
      c->dead = true;
      c->inbox.clear();
      c->pending.clear();
      c->per_peer.clear();
      c->NotifyLocked();
    }
    auto it = bound.find(c->endpoint);
    if (it != bound.end() && it->second == c) bound.erase(it);
  }

  // Remembers a new socket and forgets dead ones.
  void Track(const std::shared_ptr<Core>& c) TROUPE_REQUIRES(mu) {
    all.remove_if([](const std::weak_ptr<Core>& w) { return w.expired(); });
    for (auto it = connections.begin(); it != connections.end();) {
      it = it->second.expired() ? connections.erase(it) : std::next(it);
    }
    all.push_back(c);
  }

  size_t Live() {
    MutexLock l(mu);
    size_t n = 0;
    for (auto& w : all) {
      auto c = w.lock();
      if (!c) continue;
      MutexLock cl(c->mu);
      if (!c->dead) ++n;
    }
    return n;
  }
};

namespace {

class MemNetwork;

class MemSocket final : public Socket {
 public:
  MemSocket(MemNetwork* net, std::shared_ptr<MemoryFabricImpl> fabric, std::shared_ptr<Core> core)
      : net_(net), fabric_(std::move(fabric)), core_(std::move(core)) {}
  ~MemSocket() override {
    MutexLock l(fabric_->mu);
    fabric_->Kill(core_);
  }

  SocketKind kind() const override { return core_->kind; }
  const std::string& endpoint() const override { return core_->endpoint; }
  const NetworkIdentity& identity() const override;
  Status DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) override;
  Result<Incoming> Recv(Deadline deadline) override;
  Status Subscribe(std::string_view topic) override {
    if (core_->kind != SocketKind::kSubscriber) {
      return InvalidArgument("Subscribe on a {} socket ({})", SocketKindName(core_->kind),
                             core_->endpoint);
    }
    MutexLock l(core_->mu);
    core_->topics.emplace_back(topic);
    return Status::Ok();
  }
  Status ConnectAlso(const std::string& endpoint) override {
    if (core_->kind != SocketKind::kSubscriber) {
      return InvalidArgument("ConnectAlso on a {} socket ({})", SocketKindName(core_->kind),
                             core_->endpoint);
    }
    MutexLock l(fabric_->mu);
    fabric_->connections.emplace(endpoint, core_);
    return Status::Ok();
  }

  const std::shared_ptr<Core>& core() { return core_; }
  bool HasInput() {
    MutexLock l(core_->mu);
    return !core_->inbox.empty();
  }

 private:
  Status SendClient(const SendArgs& args, std::shared_ptr<const MemFrames> frames,
                    Deadline deadline);
  Status SendServer(const SendArgs& args, std::shared_ptr<const MemFrames> frames,
                    Deadline deadline);
  Status Publish(const SendArgs& args, std::shared_ptr<const MemFrames> frames);
  Status DeadError() const {
    return Unavailable("socket {} is gone (its actor crashed or it was unbound)", core_->endpoint);
  }

  MemNetwork* net_;
  std::shared_ptr<MemoryFabricImpl> fabric_;
  std::shared_ptr<Core> core_;
};

class MemNetwork final : public Network {
 public:
  MemNetwork(std::shared_ptr<MemoryFabricImpl> fabric, NetworkIdentity id)
      : fabric_(std::move(fabric)), id_(std::move(id)) {
    if (id_.incarnation == 0) id_.incarnation = RandomIncarnation();
  }

  Result<std::unique_ptr<Socket>> Bind(SocketKind kind, const std::string& endpoint,
                                       const SocketOptions& options) override {
    if (kind != SocketKind::kServer && kind != SocketKind::kPublisher) {
      return InvalidArgument("Bind: a {} socket connects; bind a server or publisher",
                             SocketKindName(kind));
    }
    TROUPE_RETURN_IF_ERROR(options.Validate(kind));
    auto core = NewCore(kind, options);
    MutexLock l(fabric_->mu);
    core->endpoint = ResolvePort(endpoint, &fabric_->next_port);
    if (fabric_->bound.count(core->endpoint)) {
      return Unavailable("bind {} failed: address already in use", core->endpoint);
    }
    fabric_->bound[core->endpoint] = core;
    fabric_->Track(core);
    if (kind == SocketKind::kServer) {
      // Messages clients queued while nobody was bound here arrive now.
      auto range = fabric_->connections.equal_range(core->endpoint);
      MutexLock sl(core->mu);
      for (auto it = range.first; it != range.second; ++it) {
        auto client = it->second.lock();
        if (!client) continue;
        MutexLock cl(client->mu);
        while (!client->pending.empty()) {
          core->PushLocked(std::move(client->pending.front()));
          client->pending.pop_front();
        }
        client->cv.notify_all();
      }
    }
    return std::unique_ptr<Socket>(std::make_unique<MemSocket>(this, fabric_, core));
  }

  Result<std::unique_ptr<Socket>> Connect(SocketKind kind, const std::string& endpoint,
                                          const SocketOptions& options) override {
    if (kind != SocketKind::kClient && kind != SocketKind::kSubscriber) {
      return InvalidArgument("Connect: a {} socket binds; connect a client or subscriber",
                             SocketKindName(kind));
    }
    TROUPE_RETURN_IF_ERROR(options.Validate(kind));
    auto core = NewCore(kind, options);
    core->endpoint = endpoint;
    {
      MutexLock cl(core->mu);
      core->topics = options.topics;
    }
    MutexLock l(fabric_->mu);
    fabric_->connections.emplace(endpoint, core);
    fabric_->Track(core);
    return std::unique_ptr<Socket>(std::make_unique<MemSocket>(this, fabric_, core));
  }

  std::unique_ptr<Poller> NewPoller() override { return std::make_unique<MemPoller>(); }
  TransportCounters& counters() override { return counters_; }
  const NetworkIdentity& identity() const override { return id_; }

 private:
  std::shared_ptr<Core> NewCore(SocketKind kind, const SocketOptions& options) {
    auto c = std::make_shared<Core>();
    c->kind = kind;
    c->actor_id = id_.actor_id;
    c->options = options;
    c->counters = &counters_;
    return c;
  }

  std::shared_ptr<MemoryFabricImpl> fabric_;
  NetworkIdentity id_;
  TransportCounters counters_;
};

const NetworkIdentity& MemSocket::identity() const {
  return net_->identity();
}

Status MemSocket::DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) {
  const SocketKind kind = core_->kind;
  if (kind == SocketKind::kSubscriber) {
    return InvalidArgument("cannot send on a subscriber socket ({})", core_->endpoint);
  }
  if (kind == SocketKind::kServer && !args.addressed) {
    return InvalidArgument("Send on server socket {} needs a peer: use SendTo(peer, ...)",
                           core_->endpoint);
  }
  if (kind == SocketKind::kClient && args.addressed && !args.to.empty()) {
    return InvalidArgument("SendTo('{}') on client socket {}: a client only talks to its server",
                           args.to, core_->endpoint);
  }
  size_t bytes = 0;
  auto frames = Frame(message, args.ack_floor, identity(), &bytes);
  Status st;
  switch (kind) {
    case SocketKind::kClient:
      st = SendClient(args, std::move(frames), deadline);
      break;
    case SocketKind::kServer:
      st = SendServer(args, std::move(frames), deadline);
      break;
    default:
      st = Publish(args, std::move(frames));
      break;
  }
  auto& c = *core_->counters;
  if (st.ok()) {
    Bump(c.messages_sent);
    Bump(c.bytes_sent, bytes);
  } else {
    Bump(c.send_failures);
  }
  return st;
}

Status MemSocket::SendClient(const SendArgs&, std::shared_ptr<const MemFrames> frames,
                             Deadline deadline) {
  const size_t hwm = static_cast<size_t>(core_->options.send_hwm);
  const std::string& me = core_->options.identity;
  while (true) {
    std::shared_ptr<Core> server;
    {
      MutexLock l(fabric_->mu);
      {
        MutexLock cl(core_->mu);
        if (core_->dead) return DeadError();
      }
      auto it = fabric_->bound.find(core_->endpoint);
      if (it != fabric_->bound.end() && it->second->kind == SocketKind::kServer) {
        server = it->second;
      } else {
        // Nobody bound: queue in the client, as ZeroMQ does before connecting.
        MutexLock cl(core_->mu);
        if (core_->pending.size() < hwm) {
          core_->pending.push_back(Item{me, frames});
          return Status::Ok();
        }
      }
    }
    if (server) {
      MutexLock sl(server->mu);
      auto space = [&]() TROUPE_REQUIRES(server->mu) {
        return server->dead || server->per_peer[me] < hwm;
      };
      if (!server->cv.wait_until(sl, deadline.at(), space)) {
        return Timeout("send on {}: the peer's queue stayed full (send_hwm {}) until the deadline",
                       core_->endpoint, hwm);
      }
      if (!server->dead) {
        server->PushLocked(Item{me, frames});
        return Status::Ok();
      }
      continue;  // the server died meanwhile: queue for the next one
    }
    MutexLock cl(core_->mu);
    auto space = [&]() TROUPE_REQUIRES(core_->mu) {
      return core_->dead || core_->pending.size() < hwm;
    };
    if (!core_->cv.wait_until(cl, deadline.at(), space)) {
      return Timeout("send on {}: the peer's queue stayed full (send_hwm {}) until the deadline",
                     core_->endpoint, hwm);
    }
  }
}

Status MemSocket::SendServer(const SendArgs& args, std::shared_ptr<const MemFrames> frames,
                             Deadline deadline) {
  std::shared_ptr<Core> client;
  {
    MutexLock l(fabric_->mu);
    {
      MutexLock cl(core_->mu);
      if (core_->dead) return DeadError();
    }
    // The newest live client with that identity (ROUTER_HANDOVER).
    auto range = fabric_->connections.equal_range(core_->endpoint);
    for (auto it = range.first; it != range.second; ++it) {
      auto c = it->second.lock();
      if (!c || c->kind != SocketKind::kClient || c->options.identity != args.to) continue;
      MutexLock cl(c->mu);
      if (!c->dead) client = c;
    }
  }
  if (!client) return Unavailable("{}: no connected peer '{}'", core_->endpoint, args.to);
  const size_t hwm = static_cast<size_t>(client->options.recv_hwm);
  MutexLock cl(client->mu);
  auto space = [&]() TROUPE_REQUIRES(client->mu) {
    return client->dead || client->inbox.size() < hwm;
  };
  if (!client->cv.wait_until(cl, deadline.at(), space)) {
    return Timeout(
        "send on {} to {}: the peer's queue stayed full (recv_hwm {}) until the deadline",
        core_->endpoint, args.to, hwm);
  }
  if (client->dead) return Unavailable("{}: peer '{}' is gone", core_->endpoint, args.to);
  client->PushLocked(Item{"", std::move(frames)});
  return Status::Ok();
}

Status MemSocket::Publish(const SendArgs& args, std::shared_ptr<const MemFrames> frames) {
  MutexLock l(fabric_->mu);
  auto range = fabric_->connections.equal_range(core_->endpoint);
  for (auto it = range.first; it != range.second; ++it) {
    auto s = it->second.lock();
    if (!s || s->kind != SocketKind::kSubscriber) continue;
    MutexLock sl(s->mu);
    if (s->dead) continue;
    bool match = false;
    for (const auto& t : s->topics) match = match || args.to.substr(0, t.size()) == t;
    if (!match) continue;
    if (s->inbox.size() >= static_cast<size_t>(s->options.recv_hwm)) {
      Bump(core_->counters->publisher_dropped);  // hints may be lost, but never silently
      continue;
    }
    s->PushLocked(Item{std::string(args.to), frames});
  }
  return Status::Ok();
}

Result<Incoming> MemSocket::Recv(Deadline deadline) {
  Item item;
  {
    MutexLock l(core_->mu);
    auto ready = [&]() TROUPE_REQUIRES(core_->mu) { return core_->dead || !core_->inbox.empty(); };
    if (!core_->cv.wait_until(l, deadline.at(), ready)) {
      return Timeout("no message on {} before the deadline", core_->endpoint);
    }
    if (core_->dead) return DeadError();
    item = std::move(core_->inbox.front());
    core_->inbox.pop_front();
    if (core_->kind == SocketKind::kServer) {
      auto it = core_->per_peer.find(item.peer);
      if (it != core_->per_peer.end() && --it->second == 0) core_->per_peer.erase(it);
    }
    core_->cv.notify_all();  // space for blocked senders
  }
  FrameSet fs;
  fs.frames.reserve(item.frames->segments.size() + 1);
  fs.frames.push_back({item.frames->header.data(), item.frames->header.size()});
  for (const auto& s : item.frames->segments) fs.frames.push_back(s);
  fs.owner = item.frames;
  Incoming in;
  in.peer = core_->kind == SocketKind::kClient ? "" : item.peer;
  auto msg = DecodeMessage(std::move(fs), core_->options.limits, core_->counters);
  if (!msg.ok()) {
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "{}: rejected a message from {}: {}",
                        core_->endpoint, in.peer, msg.status().ToString());
    return msg.status().WithContext(fmt::format("{} from {}", core_->endpoint, in.peer));
  }
  in.message = std::move(msg).value();
  return in;
}

void MemPoller::Add(Socket* socket) {
  auto* m = dynamic_cast<MemSocket*>(socket);
  TROUPE_CHECK_MSG(m != nullptr, "MemoryNetwork poller: socket is not from a MemoryNetwork");
  if (std::find(sockets_.begin(), sockets_.end(), socket) != sockets_.end()) return;
  sockets_.push_back(socket);
  cores_.push_back(m->core());
  MutexLock l(m->core()->mu);
  m->core()->pollers.push_back(this);
}

void MemPoller::Remove(Socket* socket) {
  auto it = std::find(sockets_.begin(), sockets_.end(), socket);
  if (it == sockets_.end()) return;
  std::shared_ptr<Core> c = cores_[static_cast<size_t>(it - sockets_.begin())];
  cores_.erase(cores_.begin() + (it - sockets_.begin()));
  sockets_.erase(it);
  MutexLock l(c->mu);
  c->pollers.erase(std::remove(c->pollers.begin(), c->pollers.end(), this), c->pollers.end());
}

Result<std::vector<Socket*>> MemPoller::Wait(Deadline deadline) {
  while (true) {
    {
      MutexLock l(mu_);
      signaled_ = false;
      if (woken_) {
        woken_ = false;
        return std::vector<Socket*>{};
      }
    }
    std::vector<Socket*> ready;
    for (size_t i = 0; i < sockets_.size(); ++i) {
      MutexLock l(cores_[i]->mu);
      if (!cores_[i]->inbox.empty()) ready.push_back(sockets_[i]);
    }
    if (!ready.empty()) return ready;
    MutexLock l(mu_);
    auto pred = [&]() TROUPE_REQUIRES(mu_) { return signaled_ || woken_; };
    if (!cv_.wait_until(l, deadline.at(), pred)) {
      return Timeout("no message on {} socket(s) before the deadline", sockets_.size());
    }
  }
}

}  // namespace
}  // namespace detail

MemoryFabric::MemoryFabric() : impl_(std::make_shared<detail::MemoryFabricImpl>()) {}
MemoryFabric::~MemoryFabric() = default;

std::unique_ptr<Network> MemoryFabric::NewNetwork(const NetworkIdentity& identity) {
  return std::make_unique<detail::MemNetwork>(impl_, identity);
}

Status MemoryFabric::Unbind(const std::string& endpoint) {
  MutexLock l(impl_->mu);
  auto it = impl_->bound.find(endpoint);
  if (it == impl_->bound.end()) return NotFound("nothing is bound at {}", endpoint);
  auto core = it->second;
  impl_->Kill(core);
  return Status::Ok();
}

size_t MemoryFabric::Crash(const std::string& actor_id) {
  MutexLock l(impl_->mu);
  size_t n = 0;
  for (auto& w : impl_->all) {
    auto c = w.lock();
    if (!c || c->actor_id != actor_id) continue;
    {
      MutexLock cl(c->mu);
      if (c->dead) continue;
    }
    impl_->Kill(c);
    ++n;
  }
  return n;
}

size_t MemoryFabric::live_sockets() const {
  return impl_->Live();
}

}  // namespace troupe::transport
