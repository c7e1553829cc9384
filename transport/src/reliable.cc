// Reliable delivery: ReliableSender (outbox, seq, retransmit, re-route) and
// ReliableReceiver (FIFO, dedupe, acks). Protocol in reliable.h and
// docs/transport.md.
#include "troupe/transport/reliable.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
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
int64_t MsSince(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count();
}
}  // namespace

Status ReliableSenderOptions::Validate() const {
  if (max_outbox_messages < 1) return InvalidArgument("max_outbox_messages must be >= 1");
  if (max_outbox_bytes < 1) return InvalidArgument("max_outbox_bytes must be >= 1");
  if (retransmit_timeout_ms < 1 || max_retransmit_timeout_ms < retransmit_timeout_ms) {
    return InvalidArgument(
        "retransmit_timeout_ms = {} / max_retransmit_timeout_ms = {}: need 1 <= timeout <= max",
        retransmit_timeout_ms, max_retransmit_timeout_ms);
  }
  if (dead_after_timeouts < 0) {
    return InvalidArgument("dead_after_timeouts = {}: must be >= 0", dead_after_timeouts);
  }
  return Status::Ok();
}

Status ReliableReceiverOptions::Validate() const {
  if (max_reorder_messages < 1) return InvalidArgument("max_reorder_messages must be >= 1");
  if (ack_batch < 1) return InvalidArgument("ack_batch must be >= 1");
  if (ack_delay_ms < 0 || ack_delay_ms > 10000) {
    return InvalidArgument("ack_delay_ms = {}: must be in 0..10000", ack_delay_ms);
  }
  if (max_streams < 1) return InvalidArgument("max_streams must be >= 1");
  return Status::Ok();
}

// ================================================================ sender

namespace detail {

class ReliableSenderImpl {
 public:
  ReliableSenderImpl(Network* network, ReliableSenderOptions options)
      : network_(network), options_(std::move(options)), poller_(network->NewPoller()) {
    TROUPE_CHECK_MSG(options_.Validate().ok(), "ReliableSenderOptions: {}",
                     options_.Validate().ToString());
    thread_ = std::thread([this] {
      SetThreadName("reliable-send");
      Loop();
    });
  }

  ~ReliableSenderImpl() {
    {
      MutexLock l(mu_);
      stop_ = true;
      space_cv_.notify_all();
    }
    poller_->Wake();
    thread_.join();
    MutexLock l(mu_);
    size_t unacked = queued_.size();
    for (auto& [name, p] : peers_) unacked += p->unacked.size();
    if (unacked > 0) {
      Log().warn(
          "reliable sender shutting down with {} message(s) not acknowledged ({} never "
          "sent); they are dropped here",
          unacked, queued_.size());
    }
    for (auto& [name, p] : peers_) poller_->Remove(p->socket.get());
    for (auto& p : graveyard_) poller_->Remove(p->socket.get());
  }

  Status ConnectPeer(const std::string& name, const std::string& endpoint) {
    SocketOptions o = options_.peer_socket;
    if (o.identity.empty()) o.identity = network_->identity().actor_id;
    o.send_hwm = std::max<int>(o.send_hwm, static_cast<int>(options_.max_outbox_messages) + 16);
    TROUPE_ASSIGN_OR_RETURN(auto sock, network_->Connect(SocketKind::kClient, endpoint, o));
    return AddPeer(name, std::move(sock));
  }

  Status AddPeer(const std::string& name, std::unique_ptr<Socket> client) {
    if (client == nullptr || client->kind() != SocketKind::kClient) {
      return InvalidArgument("AddPeer('{}'): needs a connected client socket", name);
    }
    {
      MutexLock l(mu_);
      if (peers_.count(name)) return AlreadyExists("peer '{}' already added", name);
      auto p = std::make_unique<Peer>();
      p->name = name;
      p->socket = std::move(client);
      p->rto_ms = options_.retransmit_timeout_ms;
      p->last_heard = Clock::now();
      peers_[name] = std::move(p);
      sync_poller_ = true;
      FlushQueuedLocked();
    }
    poller_->Wake();
    return Status::Ok();
  }

  Status RemovePeer(const std::string& name) {
    {
      MutexLock l(mu_);
      auto it = peers_.find(name);
      if (it == peers_.end()) return NotFound("no peer '{}'", name);
      auto p = std::move(it->second);
      peers_.erase(it);
      p->alive = false;
      RerouteLocked(p.get());
      graveyard_.push_back(std::move(p));
      sync_poller_ = true;
    }
    poller_->Wake();
    return Status::Ok();
  }

  void MarkPeerDead(const std::string& name) {
    MutexLock l(mu_);
    auto it = peers_.find(name);
    if (it == peers_.end() || !it->second->alive) return;
    it->second->dead_by_caller = true;
    DeclareDeadLocked(it->second.get(), "declared dead by the caller");
  }

  void MarkPeerAlive(const std::string& name) {
    MutexLock l(mu_);
    auto it = peers_.find(name);
    if (it == peers_.end()) return;
    ReviveLocked(it->second.get());
  }

  std::vector<std::string> live_peers() {
    MutexLock l(mu_);
    std::vector<std::string> out;
    for (auto& [name, p] : peers_) {
      if (p->alive) out.push_back(name);
    }
    return out;
  }

  Status Send(OutMessage message, Deadline deadline) {
    const size_t bytes = message.ByteSize();
    MutexLock l(mu_);
    auto fits = [&]() TROUPE_REQUIRES(mu_) {
      if (stop_) return true;
      const size_t count = OutboxCountLocked();
      if (count >= options_.max_outbox_messages) return false;
      return count == 0 || outbox_bytes_ + bytes <= options_.max_outbox_bytes;
    };
    if (!fits()) {
      ++stats_.send_blocked;
      if (!space_cv_.wait_until(l, deadline.at(), fits)) {
        return ResourceExhausted(
            "outbox full: {} messages / {} bytes waiting for acks (max_outbox_messages {}, "
            "max_outbox_bytes {}); the receivers are not keeping up",
            OutboxCountLocked(), outbox_bytes_, options_.max_outbox_messages,
            options_.max_outbox_bytes);
      }
    }
    if (stop_) return Cancelled("reliable sender is shutting down");
    ++stats_.sent;
    outbox_bytes_ += bytes;
    Entry e;
    e.msg = std::move(message);
    e.bytes = bytes;
    DispatchLocked(std::move(e));
    return Status::Ok();
  }

  Status Flush(Deadline deadline) {
    MutexLock l(mu_);
    auto empty = [&]() TROUPE_REQUIRES(mu_) { return OutboxCountLocked() == 0; };
    if (!space_cv_.wait_until(l, deadline.at(), empty)) {
      return Timeout("flush: {} message(s) still unacknowledged at the deadline",
                     OutboxCountLocked());
    }
    return Status::Ok();
  }

  void SetOutcomeCallback(std::function<void(const DeliveryOutcome&)> cb) {
    MutexLock l(mu_);
    callback_ = std::move(cb);
  }

  ReliableSenderStats stats() {
    MutexLock l(mu_);
    ReliableSenderStats s = stats_;
    s.queued = queued_.size();
    s.in_flight = 0;
    for (auto& [name, p] : peers_) s.in_flight += p->unacked.size();
    s.outbox_bytes = outbox_bytes_;
    return s;
  }

 private:
  struct Entry {
    OutMessage msg;
    size_t bytes = 0;
    uint64_t seq = 0;
    Clock::time_point last_sent{};
    int sends = 0;
  };

  struct Peer {
    std::string name;
    std::unique_ptr<Socket> socket;
    bool alive = true;
    bool dead_by_caller = false;
    bool in_poller = false;
    uint64_t next_seq = 1;
    std::map<uint64_t, Entry> unacked;
    uint64_t receiver_incarnation = 0;
    uint64_t delivered_floor = 0;  // seqs below were delivered by the current incarnation
    Clock::time_point last_heard;
    Clock::time_point last_probe{};
    int64_t rto_ms = 0;
    int silent_timeouts = 0;
    uint64_t Floor() const { return unacked.empty() ? next_seq : unacked.begin()->first; }
  };

  size_t OutboxCountLocked() TROUPE_REQUIRES(mu_) {
    size_t n = queued_.size();
    for (auto& [name, p] : peers_) n += p->unacked.size();
    return n;
  }

  Peer* PickPeerLocked() TROUPE_REQUIRES(mu_) {
    Peer* best = nullptr;
    size_t i = 0, best_i = 0;
    for (auto& [name, p] : peers_) {
      if (p->alive) {
        // Fewest in flight; ties broken round-robin.
        const size_t key = p->unacked.size();
        const bool better = best == nullptr || key < best->unacked.size() ||
                            (key == best->unacked.size() &&
                             (i + peers_.size() - rr_ % peers_.size()) % peers_.size() <
                                 (best_i + peers_.size() - rr_ % peers_.size()) % peers_.size());
        if (better) {
          best = p.get();
          best_i = i;
        }
      }
      ++i;
    }
    if (best) ++rr_;
    return best;
  }

  void DispatchLocked(Entry e) TROUPE_REQUIRES(mu_) {
    Peer* p = PickPeerLocked();
    if (p == nullptr) {
      queued_.push_back(std::move(e));
      return;
    }
    AssignLocked(p, std::move(e));
  }

  void AssignLocked(Peer* p, Entry e) TROUPE_REQUIRES(mu_) {
    const uint64_t seq = p->next_seq++;
    if (e.msg.sealed()) {
      e.msg = e.msg.WithSeq(seq);  // re-routed: new seq, tensors shared
    } else {
      e.msg.set_seq(seq);
    }
    e.seq = seq;
    e.sends = 0;
    auto& slot = p->unacked[seq];
    slot = std::move(e);
    TransmitLocked(p, &slot);
  }

  void TransmitLocked(Peer* p, Entry* e) TROUPE_REQUIRES(mu_) {
    e->last_sent = Clock::now();
    if (e->sends++ > 0) ++stats_.retransmits;
    // Peer sockets have send_hwm above the outbox size, so this never waits
    // in practice; if it cannot go out now the retransmit timer sends it.
    Status st = p->socket->SendSequenced({}, e->msg, p->Floor(), Deadline::Now());
    if (!st.ok() && Log().should_log(spdlog::level::debug)) {
      Log().debug("reliable send of seq {} to {} deferred: {}", e->seq, p->name, st.ToString());
    }
  }

  void RetransmitLocked(Peer* p, uint64_t from_seq) TROUPE_REQUIRES(mu_) {
    for (auto it = p->unacked.lower_bound(from_seq); it != p->unacked.end(); ++it) {
      TransmitLocked(p, &it->second);
    }
  }

  void FlushQueuedLocked() TROUPE_REQUIRES(mu_) {
    while (!queued_.empty()) {
      Peer* p = PickPeerLocked();
      if (p == nullptr) return;
      Entry e = std::move(queued_.front());
      queued_.pop_front();
      AssignLocked(p, std::move(e));
    }
  }

  void RerouteLocked(Peer* from) TROUPE_REQUIRES(mu_) {
    if (from->unacked.empty()) return;
    std::vector<Entry> moved;
    for (auto& [seq, e] : from->unacked) moved.push_back(std::move(e));
    from->unacked.clear();
    stats_.rerouted += moved.size();
    Log().warn("re-routing {} unacknowledged message(s) away from {}", moved.size(), from->name);
    // Keep their order ahead of anything still queued.
    for (auto it = moved.rbegin(); it != moved.rend(); ++it) queued_.push_front(std::move(*it));
    FlushQueuedLocked();
  }

  void DeclareDeadLocked(Peer* p, const char* why) TROUPE_REQUIRES(mu_) {
    if (!p->alive) return;
    p->alive = false;
    ++stats_.peers_declared_dead;
    Log().warn("peer {} {}", p->name, why);
    RerouteLocked(p);
  }

  void ReviveLocked(Peer* p) TROUPE_REQUIRES(mu_) {
    if (p->alive) return;
    p->alive = true;
    p->dead_by_caller = false;
    p->silent_timeouts = 0;
    p->rto_ms = options_.retransmit_timeout_ms;
    p->last_heard = Clock::now();
    Log().info("peer {} is alive again", p->name);
    FlushQueuedLocked();
  }

  void Resolve(Peer* p, std::map<uint64_t, Entry>::iterator it, bool accepted, std::string reason,
               std::vector<DeliveryOutcome>* outcomes) TROUPE_REQUIRES(mu_) {
    outbox_bytes_ -= it->second.bytes;
    if (accepted) {
      ++stats_.acked;
    } else {
      ++stats_.rejected;
    }
    if (callback_) {
      outcomes->push_back(
          DeliveryOutcome{p->name, it->first, accepted, std::move(reason), it->second.msg});
    }
    p->unacked.erase(it);
  }

  void HandleAck(Peer* p, const InMessage& m, std::vector<DeliveryOutcome>* outcomes)
      TROUPE_REQUIRES(mu_) {
    auto ack = m.envelope().getBody().getAck();
    const uint64_t mine = network_->identity().incarnation;
    if (ack.getStreamIncarnation() != 0 && mine != 0 && ack.getStreamIncarnation() != mine) {
      // Meant for a previous process of this actor (same routing id): its
      // seqs and floors say nothing about ours.
      ++stats_.foreign_acks;
      return;
    }
    const auto now = Clock::now();
    p->last_heard = now;
    p->silent_timeouts = 0;
    if (!p->alive && !p->dead_by_caller) ReviveLocked(p);
    const uint64_t inc = ack.getReceiverIncarnation();
    const bool restarted =
        p->receiver_incarnation != 0 && inc != 0 && inc != p->receiver_incarnation;
    if (inc != 0) p->receiver_incarnation = inc;
    bool progress = false;
    // Rejections first: the cumulative floor below counts everything else
    // under it as accepted.
    for (auto r : ack.getRejected()) {
      auto it = p->unacked.find(r.getSeq());
      if (it == p->unacked.end()) continue;
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000, "{} rejected seq {}: {}", p->name,
                          r.getSeq(), r.getReason().cStr());
      Resolve(p, it, false, r.getReason().cStr(), outcomes);
      progress = true;
    }
    for (uint64_t seq : ack.getSeqs()) {
      auto it = p->unacked.find(seq);
      if (it == p->unacked.end()) continue;
      Resolve(p, it, true, {}, outcomes);
      progress = true;
    }
    const uint64_t processed = ack.getProcessedThrough();
    while (!p->unacked.empty() && p->unacked.begin()->first < processed) {
      Resolve(p, p->unacked.begin(), true, {}, outcomes);
      progress = true;
    }
    if (restarted) {
      ++stats_.receiver_restarts;
      p->delivered_floor = ack.getDeliveredThrough();
      Log().info(
          "peer {} restarted (incarnation {:x}); retransmitting {} unacknowledged "
          "message(s)",
          p->name, inc, p->unacked.size());
      RetransmitLocked(p, p->delivered_floor);
    } else if (ack.getDeliveredThrough() > p->delivered_floor) {
      p->delivered_floor = ack.getDeliveredThrough();
      progress = true;
    }
    if (progress) p->rto_ms = options_.retransmit_timeout_ms;
    if (p->alive) FlushQueuedLocked();
    space_cv_.notify_all();
  }

  void SilentTimeoutLocked(Peer* p, Clock::time_point now) TROUPE_REQUIRES(mu_) {
    if (MsSince(p->last_heard, now) < p->rto_ms) return;
    ++p->silent_timeouts;
    p->rto_ms = std::min(p->rto_ms * 2, options_.max_retransmit_timeout_ms);
    if (options_.dead_after_timeouts > 0 && p->silent_timeouts >= options_.dead_after_timeouts) {
      bool other_alive = false;
      for (auto& [name, q] : peers_) other_alive = other_alive || (q.get() != p && q->alive);
      if (other_alive) DeclareDeadLocked(p, "declared dead: no reply to retransmits");
    }
  }

  // Returns when the next timer is due.
  Clock::time_point TimersLocked() TROUPE_REQUIRES(mu_) {
    const auto now = Clock::now();
    auto next = now + std::chrono::milliseconds(options_.max_retransmit_timeout_ms);
    for (auto& [name, pp] : peers_) {
      Peer* p = pp.get();
      if (!p->alive || p->unacked.empty()) continue;
      // Oldest transmission among messages not yet confirmed delivered: the
      // first of them, since (re)transmissions always go out in seq order
      // (probes touch only messages below the delivered floor).
      Clock::time_point oldest = Clock::time_point::max();
      auto first = p->unacked.lower_bound(p->delivered_floor);
      if (first != p->unacked.end()) oldest = first->second.last_sent;
      if (oldest != Clock::time_point::max()) {
        const auto due = oldest + std::chrono::milliseconds(p->rto_ms);
        if (due <= now) {
          RetransmitLocked(p, p->delivered_floor);
          SilentTimeoutLocked(p, now);
          if (p->alive) next = std::min(next, now + std::chrono::milliseconds(p->rto_ms));
        } else {
          next = std::min(next, due);
        }
        continue;
      }
      // Everything delivered, nothing acked yet (a slow receiver): probe it now
      // and then with the oldest message so a dead or restarted receiver is
      // noticed.
      const auto since = std::max(p->last_heard, p->last_probe);
      const auto due = since + std::chrono::milliseconds(options_.max_retransmit_timeout_ms);
      if (due <= now) {
        p->last_probe = now;
        TransmitLocked(p, &p->unacked.begin()->second);
        SilentTimeoutLocked(p, now);
        next = std::min(next, now + std::chrono::milliseconds(options_.max_retransmit_timeout_ms));
      } else {
        next = std::min(next, due);
      }
    }
    return next;
  }

  void SyncPollerLocked() TROUPE_REQUIRES(mu_) {
    if (!sync_poller_) return;
    sync_poller_ = false;
    for (auto& [name, p] : peers_) {
      if (!p->in_poller) {
        poller_->Add(p->socket.get());
        p->in_poller = true;
      }
    }
    for (auto& p : graveyard_) {
      if (p->in_poller) poller_->Remove(p->socket.get());
    }
    graveyard_.clear();  // closes their sockets on this thread
  }

  Peer* PeerBySocketLocked(Socket* s) TROUPE_REQUIRES(mu_) {
    for (auto& [name, p] : peers_) {
      if (p->socket.get() == s) return p.get();
    }
    return nullptr;
  }

  void Loop() {
    auto next = Clock::now();
    while (true) {
      {
        MutexLock l(mu_);
        if (stop_) return;
        SyncPollerLocked();
      }
      // Wake at least every base timeout so a fresh send's timer is never late
      // by more than that.
      const auto cap =
          std::chrono::milliseconds(std::min<int64_t>(1000, options_.retransmit_timeout_ms));
      auto ready = poller_->Wait(Deadline(std::min(next, Clock::now() + cap)));
      std::vector<DeliveryOutcome> outcomes;
      std::function<void(const DeliveryOutcome&)> cb;
      if (ready.ok()) {
        for (Socket* s : *ready) {
          while (true) {
            auto in = s->Recv(Deadline::Now());
            if (!in.ok()) {
              if (in.status().code() == Code::kTimeout) break;
              continue;  // bad input: counted and logged by the socket
            }
            MutexLock l(mu_);
            Peer* p = PeerBySocketLocked(s);
            if (p == nullptr) continue;  // removed meanwhile
            if (in->message.kind() == MessageKind::ACK) {
              HandleAck(p, in->message, &outcomes);
            } else {
              TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 1000,
                                  "reliable sender: ignoring a {} message from {}",
                                  KindName(in->message.kind()), p->name);
            }
          }
        }
      }
      {
        MutexLock l(mu_);
        next = TimersLocked();
        cb = callback_;
      }
      // Callbacks run without the lock.
      for (const auto& o : outcomes) {
        if (cb) cb(o);
      }
    }
  }

  Network* network_;
  const ReliableSenderOptions options_;
  std::unique_ptr<Poller> poller_;  // used by the thread only (Wake from anywhere)

  Mutex mu_;
  CondVar space_cv_;
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  bool sync_poller_ TROUPE_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Peer>> peers_ TROUPE_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Peer>> graveyard_ TROUPE_GUARDED_BY(mu_);
  std::deque<Entry> queued_ TROUPE_GUARDED_BY(mu_);
  uint64_t outbox_bytes_ TROUPE_GUARDED_BY(mu_) = 0;
  uint64_t rr_ TROUPE_GUARDED_BY(mu_) = 0;
  ReliableSenderStats stats_ TROUPE_GUARDED_BY(mu_);
  std::function<void(const DeliveryOutcome&)> callback_ TROUPE_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace detail

ReliableSender::ReliableSender(Network* network, ReliableSenderOptions options)
    : impl_(std::make_unique<detail::ReliableSenderImpl>(network, std::move(options))) {}
ReliableSender::~ReliableSender() = default;
Status ReliableSender::ConnectPeer(const std::string& name, const std::string& endpoint) {
  return impl_->ConnectPeer(name, endpoint);
}
Status ReliableSender::AddPeer(const std::string& name, std::unique_ptr<Socket> client) {
  return impl_->AddPeer(name, std::move(client));
}
Status ReliableSender::RemovePeer(const std::string& name) {
  return impl_->RemovePeer(name);
}
void ReliableSender::MarkPeerDead(const std::string& name) {
  impl_->MarkPeerDead(name);
}
void ReliableSender::MarkPeerAlive(const std::string& name) {
  impl_->MarkPeerAlive(name);
}
std::vector<std::string> ReliableSender::live_peers() const {
  return impl_->live_peers();
}
Status ReliableSender::Send(OutMessage message, Deadline deadline) {
  return impl_->Send(std::move(message), deadline);
}
Status ReliableSender::Flush(Deadline deadline) {
  return impl_->Flush(deadline);
}
void ReliableSender::SetOutcomeCallback(std::function<void(const DeliveryOutcome&)> callback) {
  impl_->SetOutcomeCallback(std::move(callback));
}
ReliableSenderStats ReliableSender::stats() const {
  return impl_->stats();
}

// ================================================================ receiver

namespace detail {

class ReliableReceiverImpl {
 public:
  ReliableReceiverImpl(Socket* server, ReliableReceiverOptions options)
      : server_(server), options_(options) {
    TROUPE_CHECK_MSG(server_ != nullptr && server_->kind() == SocketKind::kServer,
                     "ReliableReceiver needs a server socket");
    TROUPE_CHECK_MSG(options_.Validate().ok(), "ReliableReceiverOptions: {}",
                     options_.Validate().ToString());
  }

  ~ReliableReceiverImpl() { FlushAcks(Deadline::InMs(100)).IgnoreError(); }

  Result<Delivery> Recv(Deadline deadline) {
    recv_thread_.store(std::this_thread::get_id());
    while (true) {
      {
        MutexLock l(mu_);
        if (!ready_.empty()) {
          Delivery d = std::move(ready_.front());
          ready_.pop_front();
          return d;
        }
      }
      Clock::time_point oldest_ack;
      const size_t pending = PendingCount(&oldest_ack);
      if (pending >= options_.ack_batch) FlushAcks(Deadline::InMs(100)).IgnoreError();
      auto in = server_->Recv(Deadline::Now());
      if (!in.ok() && in.status().code() == Code::kTimeout) {
        if (pending > 0 && pending < options_.ack_batch) {
          // Nothing waiting: give the burst ack_delay_ms to continue so one ack
          // covers it, then acknowledge before blocking for long.
          const Deadline flush_at(oldest_ack + std::chrono::milliseconds(options_.ack_delay_ms));
          in = server_->Recv(flush_at.min(deadline));
          if (!in.ok() && in.status().code() == Code::kTimeout) {
            FlushAcks(Deadline::InMs(100)).IgnoreError();
            if (deadline.expired()) return in.status();
            continue;
          }
        } else {
          in = server_->Recv(deadline);
        }
      }
      if (!in.ok()) return in.status();
      std::optional<Delivery> passthrough = Handle(std::move(in).value());
      if (passthrough) return std::move(*passthrough);
    }
  }

  void Ack(const Delivery& d, bool accepted, std::string reason) {
    if (!d.sequenced()) return;
    bool flush_now;
    {
      MutexLock l(mu_);
      const Key key{std::string(d.message.sender()), d.message.incarnation()};
      Stream& s = StreamLocked(key);
      const uint64_t seq = d.message.seq();
      s.acked_above.insert(seq);
      while (s.acked_above.count(s.acked_below)) s.acked_above.erase(s.acked_below++);
      auto& pending = pending_[{d.peer, key}];
      if (accepted) {
        pending.seqs.push_back(seq);
        ++stats_.acked;
      } else {
        s.rejections[seq] = reason;
        if (s.rejections.size() > 1024) s.rejections.erase(s.rejections.begin());
        pending.rejected.emplace_back(seq, std::move(reason));
        ++stats_.rejected;
      }
      CountPendingLocked(1);
      flush_now =
          std::this_thread::get_id() != recv_thread_.load() || pending_count_ >= options_.ack_batch;
    }
    if (flush_now) FlushAcks(Deadline::InMs(100)).IgnoreError();
  }

  Status FlushAcks(Deadline deadline) {
    struct Out {
      std::string peer;
      OutMessage msg;
    };
    std::vector<Out> outs;
    {
      MutexLock l(mu_);
      if (pending_.empty()) return Status::Ok();
      const uint64_t incarnation = server_->identity().incarnation;
      for (auto& [pk, p] : pending_) {
        // Rejections the sender may not have heard of yet (at or above its
        // floor) ride along every ack, so a lost ack cannot turn one into an
        // acceptance under processedThrough.
        auto sit = streams_.find(pk.second);
        if (sit != streams_.end()) {
          for (auto r = sit->second.rejections.lower_bound(sit->second.last_floor);
               r != sit->second.rejections.end(); ++r) {
            bool listed = false;
            for (auto& e : p.rejected) listed = listed || e.first == r->first;
            if (!listed) p.rejected.emplace_back(r->first, r->second);
          }
        }
        Out o{pk.first, OutMessage()};
        auto ack = o.msg.envelope().getBody().initAck();
        auto seqs = ack.initSeqs(static_cast<unsigned>(p.seqs.size()));
        for (size_t i = 0; i < p.seqs.size(); ++i) seqs.set(static_cast<unsigned>(i), p.seqs[i]);
        auto rej = ack.initRejected(static_cast<unsigned>(p.rejected.size()));
        for (size_t i = 0; i < p.rejected.size(); ++i) {
          rej[static_cast<unsigned>(i)].setSeq(p.rejected[i].first);
          rej[static_cast<unsigned>(i)].setReason(p.rejected[i].second);
        }
        ack.setReceiverIncarnation(incarnation);
        ack.setStreamIncarnation(pk.second.second);
        auto it = streams_.find(pk.second);
        if (it != streams_.end()) {
          ack.setDeliveredThrough(it->second.next_expected);
          ack.setProcessedThrough(it->second.acked_below);
        }
        outs.push_back(std::move(o));
      }
      pending_.clear();
      pending_count_ = 0;
      stats_.ack_messages += outs.size();
    }
    Status first;
    for (auto& o : outs) {
      Status st = server_->SendTo(o.peer, o.msg, deadline);
      if (!st.ok()) {
        // The sender retransmits and we answer the duplicate with the ack.
        if (Log().should_log(spdlog::level::debug)) {
          Log().debug("ack to {} not sent: {}", o.peer, st.ToString());
        }
        if (first.ok()) first = st;
      }
    }
    return first;
  }

  std::vector<StreamState> Snapshot() {
    MutexLock l(mu_);
    std::vector<StreamState> out;
    for (auto& [k, s] : streams_) out.push_back(StreamState{k.first, k.second, s.acked_below});
    return out;
  }

  void Restore(const std::vector<StreamState>& states) {
    MutexLock l(mu_);
    for (const auto& st : states) {
      Stream& s = StreamLocked({st.sender, st.incarnation});
      s.next_expected = std::max(s.next_expected, st.next_expected);
      s.acked_below = std::max(s.acked_below, st.next_expected);
    }
  }

  ReliableReceiverStats stats() {
    MutexLock l(mu_);
    ReliableReceiverStats s = stats_;
    s.streams = streams_.size();
    return s;
  }

 private:
  using Key = std::pair<std::string, uint64_t>;  // (sender, incarnation)
  struct Stream {
    uint64_t next_expected = 0;  // 0: not seen yet
    std::map<uint64_t, Delivery> buffer;
    uint64_t acked_below = 0;  // every seq below was acked or rejected
    std::set<uint64_t> acked_above;
    std::map<uint64_t, std::string> rejections;  // recent, to answer duplicates
    uint64_t last_floor = 0;                     // the sender's ack floor, last seen
    Clock::time_point last_active;
  };
  struct PendingAck {
    std::vector<uint64_t> seqs;
    std::vector<std::pair<uint64_t, std::string>> rejected;
  };

  size_t PendingCount(Clock::time_point* oldest) {
    MutexLock l(mu_);
    *oldest = oldest_pending_;
    return pending_count_;
  }
  void CountPendingLocked(size_t n) TROUPE_REQUIRES(mu_) {
    if (pending_count_ == 0) oldest_pending_ = Clock::now();
    pending_count_ += n;
  }

  Stream& StreamLocked(const Key& key) TROUPE_REQUIRES(mu_) {
    auto it = streams_.find(key);
    if (it != streams_.end()) return it->second;
    if (streams_.size() >= options_.max_streams) {
      auto oldest = streams_.begin();
      for (auto j = streams_.begin(); j != streams_.end(); ++j) {
        if (j->second.last_active < oldest->second.last_active) oldest = j;
      }
      streams_.erase(oldest);
    }
    return streams_[key];
  }

  // Marks that `peer` should hear from us (a receipt) even without new acks.
  void ReceiptLocked(const std::string& peer, const Key& key) TROUPE_REQUIRES(mu_) {
    auto [it, inserted] = pending_.try_emplace({peer, key});
    if (inserted) CountPendingLocked(1);
  }

  void DrainBufferLocked(Stream& s) TROUPE_REQUIRES(mu_) {
    for (auto it = s.buffer.begin(); it != s.buffer.end();) {
      if (it->first < s.next_expected) {
        ++stats_.skipped;
        it = s.buffer.erase(it);
      } else if (it->first == s.next_expected) {
        ready_.push_back(std::move(it->second));
        ++stats_.delivered;
        ++s.next_expected;
        it = s.buffer.erase(it);
      } else {
        break;
      }
    }
  }

  // Files one message; returns it when it bypasses sequencing.
  std::optional<Delivery> Handle(Incoming in) {
    Delivery d{std::move(in.peer), std::move(in.message)};
    const uint64_t seq = d.message.seq();
    MutexLock l(mu_);
    if (seq == 0) {
      ++stats_.unsequenced;
      return d;
    }
    const Key key{std::string(d.message.sender()), d.message.incarnation()};
    Stream& s = StreamLocked(key);
    s.last_active = Clock::now();
    const uint64_t floor = d.message.ack_floor();
    s.last_floor = std::max(s.last_floor, floor);
    if (s.next_expected == 0) {
      // First contact (or we restarted): start where the sender's unacked
      // messages start.
      s.next_expected = floor != 0 ? std::min(floor, seq) : seq;
      s.acked_below = s.next_expected;
    }
    if (floor > s.next_expected) {
      // The sender resolved everything below `floor` (acked, rejected or
      // re-routed elsewhere): stop waiting for it.
      s.next_expected = floor;
      s.acked_below = std::max(s.acked_below, floor);
      s.acked_above.erase(s.acked_above.begin(), s.acked_above.lower_bound(floor));
      DrainBufferLocked(s);
    }
    ReceiptLocked(d.peer, key);
    if (seq < s.next_expected) {
      // Already delivered. The receipt queued above answers it: its
      // processedThrough / deliveredThrough (and any unresolved rejection)
      // tell the sender everything it missed.
      ++stats_.duplicates;
      if (seq >= s.acked_below && s.acked_above.count(seq)) {
        pending_[{d.peer, key}].seqs.push_back(seq);  // acked out of order
        CountPendingLocked(1);
      }
      return std::nullopt;
    }
    if (seq == s.next_expected) {
      ++s.next_expected;
      ++stats_.delivered;
      ready_.push_back(std::move(d));
      DrainBufferLocked(s);
      return std::nullopt;
    }
    if (s.buffer.count(seq)) {
      ++stats_.duplicates;
    } else if (s.buffer.size() < options_.max_reorder_messages) {
      ++stats_.out_of_order;
      s.buffer.emplace(seq, std::move(d));
    } else {
      ++stats_.reorder_overflow;  // not acked: the sender retransmits it
    }
    return std::nullopt;
  }

  Socket* server_;
  const ReliableReceiverOptions options_;
  std::atomic<std::thread::id> recv_thread_{};

  Mutex mu_;
  std::map<Key, Stream> streams_ TROUPE_GUARDED_BY(mu_);
  std::deque<Delivery> ready_ TROUPE_GUARDED_BY(mu_);
  std::map<std::pair<std::string, Key>, PendingAck> pending_ TROUPE_GUARDED_BY(mu_);
  size_t pending_count_ TROUPE_GUARDED_BY(mu_) = 0;
  Clock::time_point oldest_pending_ TROUPE_GUARDED_BY(mu_){};
  ReliableReceiverStats stats_ TROUPE_GUARDED_BY(mu_);
};

}  // namespace detail

ReliableReceiver::ReliableReceiver(Socket* server, ReliableReceiverOptions options)
    : impl_(std::make_unique<detail::ReliableReceiverImpl>(server, options)) {}
ReliableReceiver::~ReliableReceiver() = default;
Result<Delivery> ReliableReceiver::Recv(Deadline deadline) {
  return impl_->Recv(deadline);
}
void ReliableReceiver::Ack(const Delivery& delivery) {
  impl_->Ack(delivery, true, {});
}
void ReliableReceiver::Reject(const Delivery& delivery, std::string reason) {
  impl_->Ack(delivery, false, std::move(reason));
}
Status ReliableReceiver::FlushAcks(Deadline deadline) {
  return impl_->FlushAcks(deadline);
}
std::vector<StreamState> ReliableReceiver::Snapshot() const {
  return impl_->Snapshot();
}
void ReliableReceiver::Restore(const std::vector<StreamState>& streams) {
  impl_->Restore(streams);
}
ReliableReceiverStats ReliableReceiver::stats() const {
  return impl_->stats();
}

}  // namespace troupe::transport
