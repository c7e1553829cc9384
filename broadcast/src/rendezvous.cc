// The gloo rendezvous store over the transport (rendezvous.h).
#include "rendezvous.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "chunk_stream.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/core/thread_name.h"

namespace troupe::broadcast {
namespace {

using proto::StoreOp;
using proto::StoreReplyMsg;
using proto::StoreRequestMsg;

spdlog::logger& Log() {
  return log::Get("broadcast");
}

constexpr size_t kMaxKeys = 4096;
constexpr size_t kMaxValueBytes = size_t{1} << 20;
constexpr auto kSlice = std::chrono::milliseconds(10);

std::string ToString(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}
std::vector<uint8_t> ToBytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

[[noreturn]] void ThrowTimeout(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  throw std::runtime_error(fmt::format("rendezvous store: timed out after {} ms waiting for '{}'",
                                       timeout.count(), keys.empty() ? "" : keys[0]));
}

[[noreturn]] void ThrowCancelled() {
  throw std::runtime_error("rendezvous store: cancelled (a newer epoch began, or a stop)");
}

}  // namespace

// ----------------------------------------------------------------- server state

struct RendezvousServer::State {
  transport::Network* network = nullptr;
  proto::Header header;
  std::string prefix;
  std::set<std::string> members;
  std::unique_ptr<transport::Socket> socket;
  std::unique_ptr<transport::Poller> poller;
  std::thread thread;
  std::atomic<uint64_t> refused{0};

  Mutex mu;
  CondVar cv;
  std::map<std::string, std::string> kv TROUPE_GUARDED_BY(mu);
  bool stop TROUPE_GUARDED_BY(mu) = false;

  struct Pending {
    std::string peer;
    StoreRequestMsg request;
    Clock::time_point until;
  };
  std::vector<Pending> pending;  // server thread only

  // Applies `r` to the map. False: get/wait on a key that is missing (retry later).
  bool Apply(const StoreRequestMsg& r, StoreReplyMsg* out) TROUPE_REQUIRES(mu) {
    out->id = r.id;
    out->ok = true;
    const std::string key = r.keys.empty() ? std::string() : r.keys[0];
    auto all_present = [&]() TROUPE_REQUIRES(mu) {
      for (const auto& k : r.keys)
        if (kv.count(k) == 0) return false;
      return true;
    };
    switch (r.op) {
      case StoreOp::kSet:
      case StoreOp::kCompareSet:
      case StoreOp::kAdd:
        if (!kv.count(key) && kv.size() >= kMaxKeys) {
          out->ok = false;
          out->error = fmt::format("the epoch's store holds {} keys already", kMaxKeys);
          return true;
        }
        break;
      default:
        break;
    }
    switch (r.op) {
      case StoreOp::kSet:
        kv[key] = r.value;
        cv.notify_all();
        return true;
      case StoreOp::kGet: {
        auto it = kv.find(key);
        if (it == kv.end()) return false;
        out->value = it->second;
        return true;
      }
      case StoreOp::kAdd: {
        int64_t now = 0;
        auto it = kv.find(key);
        if (it != kv.end()) {
          try {
            now = std::stoll(it->second);
          } catch (const std::exception&) {
            out->ok = false;
            out->error = fmt::format("add: '{}' does not hold an integer", key);
            return true;
          }
        }
        now += r.delta;
        kv[key] = std::to_string(now);
        out->number = now;
        cv.notify_all();
        return true;
      }
      case StoreOp::kCheck:
        out->number = all_present() ? 1 : 0;
        return true;
      case StoreOp::kWait:
        return all_present();
      case StoreOp::kDeleteKey:
        out->number = kv.erase(key) > 0 ? 1 : 0;
        return true;
      case StoreOp::kNumKeys:
        out->number = static_cast<int64_t>(kv.size());
        return true;
      case StoreOp::kCompareSet: {
        // c10d semantics: set when the value is the expected one (or absent and nothing is
        // expected); the reply is the value now held.
        auto it = kv.find(key);
        if (it == kv.end()) {
          if (r.expected.empty()) kv[key] = r.value;
          out->value = r.expected.empty() ? r.value : r.expected;
        } else {
          if (it->second == r.expected) it->second = r.value;
          out->value = it->second;
        }
        cv.notify_all();
        return true;
      }
    }
    return true;
  }

  void Refuse(const std::string& peer, const std::string& sender, const std::string& why) {
    ++refused;
    network->counters().Reject(transport::RejectReason::kUnexpected);
    TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                        "rendezvous store {}: refused a request from '{}' (sender '{}'): {}",
                        socket->endpoint(), peer, sender, why);
  }

  void Reply(const std::string& peer, const StoreReplyMsg& reply) {
    Status st = socket->SendTo(peer, proto::EncodeStoreReply(header, reply), Deadline::InMs(100));
    if (!st.ok()) Log().debug("rendezvous reply to {}: {}", peer, st.ToString());
  }

  // Validates a remote request; false after refusing it.
  bool Admit(const transport::Incoming& in, const proto::Message& m) {
    if (m.kind != proto::Kind::kStoreRequest) {
      Refuse(in.peer, m.sender, fmt::format("a {} on the rendezvous socket", KindName(m.kind)));
      return false;
    }
    if (!members.count(m.sender)) {
      Refuse(in.peer, m.sender, "not a member of this epoch");
      return false;
    }
    const StoreRequestMsg& r = m.store_request;
    bool needs_key = r.op != StoreOp::kNumKeys;
    if (needs_key && r.keys.empty()) {
      Refuse(in.peer, m.sender, "a request without a key");
      Reply(in.peer, StoreReplyMsg{r.id, false, "request without a key", "", 0});
      return false;
    }
    for (const auto& k : r.keys) {
      if (k.size() <= prefix.size() || k.compare(0, prefix.size(), prefix) != 0 ||
          k[prefix.size()] != '/') {
        Refuse(in.peer, m.sender, fmt::format("key '{}' is outside this epoch's prefix", k));
        Reply(in.peer, StoreReplyMsg{r.id, false, "key outside this epoch's store", "", 0});
        return false;
      }
    }
    if (r.value.size() > kMaxValueBytes || r.expected.size() > kMaxValueBytes) {
      Refuse(in.peer, m.sender, "a value over 1 MiB");
      Reply(in.peer, StoreReplyMsg{r.id, false, "value over 1 MiB", "", 0});
      return false;
    }
    return true;
  }

  void Run() {
    while (true) {
      {
        MutexLock l(mu);
        if (stop) return;
      }
      auto ready = poller->Wait(Deadline::In(std::chrono::milliseconds(20)));
      (void)ready;  // woken by a message, a local set, or the slice
      for (int i = 0; i < 1000; ++i) {
        auto in = socket->Recv(Deadline::Now());
        if (!in.ok()) {
          if (transport::IsBadInput(in.status())) continue;  // counted by the transport
          break;
        }
        auto m = proto::Decode(in->message);
        if (!m.ok()) {
          Refuse(in->peer, std::string(in->message.sender()), m.status().ToString());
          continue;
        }
        if (!Admit(*in, *m)) continue;
        const StoreRequestMsg& r = m->store_request;
        StoreReplyMsg reply;
        bool done;
        {
          MutexLock l(mu);
          done = Apply(r, &reply);
        }
        if (done) {
          Reply(in->peer, reply);
        } else if (pending.size() >= kMaxKeys) {
          Reply(in->peer, StoreReplyMsg{r.id, false, "too many requests held", "", 0});
        } else {
          auto hold = std::chrono::milliseconds(std::min<uint32_t>(r.timeout_ms, 3600 * 1000));
          pending.push_back(Pending{in->peer, r, Clock::now() + hold});
        }
      }
      ServePending();
    }
  }

  void ServePending() {
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      StoreReplyMsg reply;
      bool done;
      {
        MutexLock l(mu);
        done = Apply(it->request, &reply);
      }
      if (!done && now >= it->until) {
        reply.id = it->request.id;
        reply.ok = false;
        reply.error = fmt::format("timed out after {} ms waiting for '{}'", it->request.timeout_ms,
                                  it->request.keys[0]);
        done = true;
      }
      if (done) {
        Reply(it->peer, reply);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
};

// ----------------------------------------------------------------- local store

namespace {

// The learner's (rank 0's) view of its own rendezvous map.
class LocalRendezvousStore final : public c10d::Store {
 public:
  LocalRendezvousStore(std::shared_ptr<RendezvousServer::State> state,
                       std::chrono::milliseconds timeout, Interrupt interrupt)
      : c10d::Store(timeout), state_(std::move(state)), interrupt_(std::move(interrupt)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Do(StoreOp::kSet, {key}, ToString(value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return ToBytes(Do(StoreOp::kCompareSet, {key}, ToString(desired), ToString(expected)).value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return ToBytes(Do(StoreOp::kGet, {key}).value);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Do(StoreOp::kAdd, {key}, "", "", value).number;
  }
  bool deleteKey(const std::string& key) override {
    return Do(StoreOp::kDeleteKey, {key}).number != 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    return Do(StoreOp::kCheck, keys).number != 0;
  }
  int64_t getNumKeys() override { return Do(StoreOp::kNumKeys, {}).number; }
  void wait(const std::vector<std::string>& keys) override { Wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Wait(keys, timeout);
  }
  // c10d::Store::clone() is pure virtual in newer torch (2.7+) and absent in older ones, so
  // this is declared without `override`: it overrides where the base has it. A clone shares
  // the map; it may be used from another thread, so it calls no interrupt (its timeout bounds
  // every wait).
  c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<LocalRendezvousStore>(state_, timeout_, nullptr);
  }

 private:
  StoreReplyMsg Do(StoreOp op, std::vector<std::string> keys, std::string value = "",
                   std::string expected = "", int64_t delta = 0) {
    StoreRequestMsg r;
    r.op = op;
    r.keys = std::move(keys);
    r.value = std::move(value);
    r.expected = std::move(expected);
    r.delta = delta;
    StoreReplyMsg reply = Blocking(r, timeout_);
    if (!reply.ok) throw std::runtime_error("rendezvous store: " + reply.error);
    return reply;
  }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    StoreRequestMsg r;
    r.op = StoreOp::kWait;
    r.keys = keys;
    Blocking(r, timeout);
  }
  // Applies `r`, waiting (in slices, calling the interrupt between them) while keys are missing.
  StoreReplyMsg Blocking(const StoreRequestMsg& r, std::chrono::milliseconds timeout) {
    auto& s = *state_;
    const auto until = Clock::now() + timeout;
    StoreReplyMsg reply;
    while (true) {
      bool done;
      {
        MutexLock l(s.mu);
        done = s.Apply(r, &reply);
        if (!done) {
          auto slice = std::min(until, Clock::now() + kSlice);
          s.cv.wait_until(l, slice, [&]() TROUPE_REQUIRES(s.mu) { return s.Apply(r, &reply); });
          done = s.Apply(r, &reply);
        }
      }
      if (r.op == StoreOp::kSet || r.op == StoreOp::kAdd || r.op == StoreOp::kCompareSet)
        s.poller->Wake();  // members' held requests may be answerable now
      if (done) return reply;
      if (Clock::now() >= until) ThrowTimeout(r.keys, timeout);
      if (interrupt_ && interrupt_()) ThrowCancelled();
    }
  }

  std::shared_ptr<RendezvousServer::State> state_;
  Interrupt interrupt_;
};

// A member's store: request/reply with the learner's rendezvous server.
class RemoteRendezvousStore final : public c10d::Store {
 public:
  RemoteRendezvousStore(transport::Network* network, std::string endpoint,
                        std::unique_ptr<transport::Socket> socket, proto::Header header,
                        std::chrono::milliseconds timeout, Interrupt interrupt)
      : c10d::Store(timeout),
        network_(network),
        endpoint_(std::move(endpoint)),
        socket_(std::move(socket)),
        header_(std::move(header)),
        interrupt_(std::move(interrupt)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Call(StoreOp::kSet, {key}, ToString(value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return ToBytes(Call(StoreOp::kCompareSet, {key}, ToString(desired), ToString(expected)).value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return ToBytes(Call(StoreOp::kGet, {key}).value);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return Call(StoreOp::kAdd, {key}, "", "", value).number;
  }
  bool deleteKey(const std::string& key) override {
    return Call(StoreOp::kDeleteKey, {key}).number != 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    return Call(StoreOp::kCheck, keys).number != 0;
  }
  int64_t getNumKeys() override { return Call(StoreOp::kNumKeys, {}).number; }
  void wait(const std::vector<std::string>& keys) override {
    Call(StoreOp::kWait, keys, "", "", 0, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Call(StoreOp::kWait, keys, "", "", 0, timeout);
  }
  // See LocalRendezvousStore::clone. A socket belongs to one thread: a clone has its own
  // connection to the same server (no interrupt: its timeout bounds every wait).
  c10::intrusive_ptr<c10d::Store> clone() {
    return ConnectRendezvous(network_, endpoint_, header_, timeout_, nullptr);
  }

 private:
  StoreReplyMsg Call(StoreOp op, std::vector<std::string> keys, std::string value = "",
                     std::string expected = "", int64_t delta = 0,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    if (timeout.count() == 0) timeout = timeout_;
    StoreRequestMsg r;
    r.id = ++next_id_;
    r.op = op;
    r.keys = std::move(keys);
    r.value = std::move(value);
    r.expected = std::move(expected);
    r.delta = delta;
    r.timeout_ms = static_cast<uint32_t>(std::min<int64_t>(timeout.count(), 3600 * 1000));
    // The server answers a held request at its timeout; allow the round trip on top.
    const Deadline deadline = Deadline::In(timeout + std::chrono::seconds(2));
    Status st = socket_->Send(proto::EncodeStoreRequest(header_, r), deadline);
    if (!st.ok()) throw std::runtime_error("rendezvous store: " + st.ToString());
    while (true) {
      if (deadline.expired()) ThrowTimeout(r.keys, timeout);
      if (interrupt_ && interrupt_()) ThrowCancelled();
      auto in = socket_->Recv(Deadline::In(kSlice));
      if (!in.ok()) continue;  // timeout slice, or bad input (counted by the transport)
      auto m = proto::Decode(in->message);
      if (!m.ok() || m->kind != proto::Kind::kStoreReply) continue;  // not for us
      if (m->store_reply.id != r.id) continue;  // a late reply to an abandoned call
      if (!m->store_reply.ok) throw std::runtime_error("rendezvous store: " + m->store_reply.error);
      return m->store_reply;
    }
  }

  transport::Network* network_;
  std::string endpoint_;
  std::unique_ptr<transport::Socket> socket_;
  proto::Header header_;
  Interrupt interrupt_;
  uint64_t next_id_ = 0;
};

}  // namespace

// ----------------------------------------------------------------- server

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    transport::Network* network, const std::string& host, proto::Header header, std::string prefix,
    std::vector<std::string> members) {
  auto state = std::make_shared<State>();
  state->network = network;
  state->header = std::move(header);
  state->prefix = std::move(prefix);
  state->members.insert(members.begin(), members.end());
  TROUPE_ASSIGN_OR_RETURN(
      state->socket, network->Bind(transport::SocketKind::kServer, fmt::format("tcp://{}:0", host),
                                   ControlSocketOptions()));
  state->poller = network->NewPoller();
  state->poller->Add(state->socket.get());
  State* raw = state.get();
  state->thread = std::thread([raw] {
    SetThreadName("rendezvous");
    raw->Run();
  });
  std::unique_ptr<RendezvousServer> server(new RendezvousServer());
  server->state_ = std::move(state);
  return server;
}

RendezvousServer::~RendezvousServer() {
  if (!state_) return;
  {
    MutexLock l(state_->mu);
    state_->stop = true;
    state_->cv.notify_all();
  }
  state_->poller->Wake();
  if (state_->thread.joinable()) state_->thread.join();
  // LocalStores may outlive the server (held by a group): they keep the state, not the socket.
  state_->poller->Remove(state_->socket.get());
  state_->socket.reset();
}

const std::string& RendezvousServer::endpoint() const {
  return state_->socket->endpoint();
}
const std::string& RendezvousServer::prefix() const {
  return state_->prefix;
}
uint64_t RendezvousServer::refused() const {
  return state_->refused.load();
}

c10::intrusive_ptr<c10d::Store> RendezvousServer::LocalStore(std::chrono::milliseconds timeout,
                                                             Interrupt interrupt) {
  return c10::make_intrusive<LocalRendezvousStore>(state_, timeout, std::move(interrupt));
}

c10::intrusive_ptr<c10d::Store> ConnectRendezvous(transport::Network* network,
                                                  const std::string& endpoint, proto::Header header,
                                                  std::chrono::milliseconds timeout,
                                                  Interrupt interrupt) {
  auto s = network->Connect(transport::SocketKind::kClient, endpoint,
                            ControlSocketOptions(UnguessableIdentity(header.sender)));
  if (!s.ok()) throw std::runtime_error("rendezvous store: " + s.status().ToString());
  return c10::make_intrusive<RemoteRendezvousStore>(
      network, endpoint, std::move(s).value(), std::move(header), timeout, std::move(interrupt));
}

c10::intrusive_ptr<c10d::Store> CloneRendezvousStore(c10d::Store& store) {
  if (auto* local = dynamic_cast<LocalRendezvousStore*>(&store)) return local->clone();
  if (auto* remote = dynamic_cast<RemoteRendezvousStore*>(&store)) return remote->clone();
  throw std::invalid_argument("CloneRendezvousStore: not a rendezvous store");
}

}  // namespace troupe::broadcast
