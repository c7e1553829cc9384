// FaultInjectingNetwork: drops, delays, duplicates, failures and peer kills.
#include "troupe/transport/fault_injection.h"

#include <condition_variable>
#include <map>
#include <queue>
#include <set>
#include <thread>

#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/core/thread_annotations.h"

namespace troupe::transport {
namespace detail {

struct DelayedSend {
  Clock::time_point due;
  uint64_t order;
  std::weak_ptr<Socket> socket;
  std::string to;
  bool addressed;
  uint64_t ack_floor;
  OutMessage message;
  bool operator>(const DelayedSend& o) const {
    return due != o.due ? due > o.due : order > o.order;
  }
};

class FaultState {
 public:
  FaultState() : timer_([this] { TimerLoop(); }) {}
  ~FaultState() {
    {
      MutexLock l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    timer_.join();
  }

  struct Rule {
    FaultAction action;
    int remaining;
    SendFilter filter;
  };

  void SetHook(const std::string& name, SendHook hook) {
    MutexLock l(mu_);
    hooks_[name] = std::move(hook);
  }
  void RemoveHook(const std::string& name) {
    MutexLock l(mu_);
    hooks_.erase(name);
  }
  void AddRule(FaultAction action, int n, SendFilter filter) {
    MutexLock l(mu_);
    rules_.push_back(Rule{action, n, std::move(filter)});
  }
  void Kill(const std::string& peer, bool dead) {
    MutexLock l(mu_);
    if (dead) {
      killed_.insert(peer);
    } else {
      killed_.erase(peer);
    }
  }
  bool Killed(std::string_view a, std::string_view b = {}) {
    MutexLock l(mu_);
    return (!a.empty() && killed_.count(std::string(a))) ||
           (!b.empty() && killed_.count(std::string(b)));
  }
  FaultStats stats() {
    MutexLock l(mu_);
    return stats_;
  }
  void Count(uint64_t FaultStats::*field) {
    MutexLock l(mu_);
    ++(stats_.*field);
  }

  FaultAction Decide(const SendEvent& ev) {
    std::vector<SendHook> hooks;
    {
      MutexLock l(mu_);
      if ((!ev.to.empty() && killed_.count(std::string(ev.to))) ||
          killed_.count(std::string(ev.endpoint))) {
        ++stats_.killed_out;
        return FaultAction::Drop();
      }
      for (auto& [name, h] : hooks_) hooks.push_back(h);
    }
    // Hooks run without the lock: they may take their own.
    for (auto& h : hooks) {
      FaultAction a = h(ev);
      if (a.kind != FaultAction::kPass) return Counted(a);
    }
    MutexLock l(mu_);
    for (auto it = rules_.begin(); it != rules_.end(); ++it) {
      if (it->remaining <= 0 || (it->filter && !it->filter(ev))) continue;
      FaultAction a = it->action;
      if (--it->remaining == 0) rules_.erase(it);
      return CountedLocked(a);
    }
    return FaultAction::Pass();
  }

  void Schedule(DelayedSend d) {
    MutexLock l(mu_);
    d.order = next_order_++;
    queue_.push(std::move(d));
    cv_.notify_all();
  }

 private:
  FaultAction Counted(FaultAction a) {
    MutexLock l(mu_);
    return CountedLocked(a);
  }
  FaultAction CountedLocked(FaultAction a) TROUPE_REQUIRES(mu_) {
    switch (a.kind) {
      case FaultAction::kDrop:
        ++stats_.dropped;
        break;
      case FaultAction::kDuplicate:
        ++stats_.duplicated;
        break;
      case FaultAction::kDelay:
        ++stats_.delayed;
        break;
      case FaultAction::kFail:
        ++stats_.failed;
        break;
      case FaultAction::kPass:
        break;
    }
    return a;
  }

  void TimerLoop() {
    MutexLock l(mu_);
    while (!stop_) {
      if (queue_.empty()) {
        cv_.wait_until(l, Clock::now() + std::chrono::seconds(1),
                       [&]() TROUPE_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
        continue;
      }
      auto due = queue_.top().due;
      if (Clock::now() < due) {
        cv_.wait_until(l, due, [&]() TROUPE_REQUIRES(mu_) {
          return stop_ || (!queue_.empty() && queue_.top().due < due);
        });
        continue;
      }
      DelayedSend d = queue_.top();
      queue_.pop();
      l.native().unlock();
      if (auto s = d.socket.lock()) {
        Status st = s->SendSequenced(d.addressed ? std::string_view(d.to) : std::string_view(),
                                     d.message, d.ack_floor, Deadline::InMs(1000));
        if (!st.ok()) {
          log::Get("transport").debug("delayed send failed: {}", st.ToString());
        }
      }
      l.native().lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  std::map<std::string, SendHook> hooks_ TROUPE_GUARDED_BY(mu_);
  std::vector<Rule> rules_ TROUPE_GUARDED_BY(mu_);
  std::set<std::string> killed_ TROUPE_GUARDED_BY(mu_);
  FaultStats stats_ TROUPE_GUARDED_BY(mu_);
  std::priority_queue<DelayedSend, std::vector<DelayedSend>, std::greater<DelayedSend>> queue_
      TROUPE_GUARDED_BY(mu_);
  uint64_t next_order_ TROUPE_GUARDED_BY(mu_) = 0;
  std::thread timer_;
};

namespace {

class FaultSocket final : public Socket {
 public:
  FaultSocket(std::shared_ptr<Socket> inner, std::shared_ptr<FaultState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}

  SocketKind kind() const override { return inner_->kind(); }
  const std::string& endpoint() const override { return inner_->endpoint(); }
  const NetworkIdentity& identity() const override { return inner_->identity(); }
  Status Subscribe(std::string_view topic) override { return inner_->Subscribe(topic); }
  Status ConnectAlso(const std::string& endpoint) override { return inner_->ConnectAlso(endpoint); }

  Status DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) override {
    message.Seal(SealInfo{identity().actor_id, identity().incarnation});
    SendEvent ev{inner_->kind(), inner_->endpoint(), args.to, message.reader()};
    FaultAction a = state_->Decide(ev);
    switch (a.kind) {
      case FaultAction::kPass:
        return inner_->DoSend(args, message, deadline);
      case FaultAction::kDrop:
        return Status::Ok();  // lost on the wire
      case FaultAction::kFail:
        return Unavailable("fault injected: send on {} failed", inner_->endpoint());
      case FaultAction::kDuplicate: {
        TROUPE_RETURN_IF_ERROR(inner_->DoSend(args, message, deadline));
        return inner_->DoSend(args, message, deadline);
      }
      case FaultAction::kDelay: {
        DelayedSend d{Clock::now() + std::chrono::milliseconds(a.delay_ms),
                      0,
                      inner_,
                      std::string(args.to),
                      args.addressed,
                      args.ack_floor,
                      message};
        state_->Schedule(std::move(d));
        return Status::Ok();
      }
    }
    return Internal("unknown fault action");
  }

  Result<Incoming> Recv(Deadline deadline) override {
    while (true) {
      auto r = inner_->Recv(deadline);
      if (!r.ok()) return r;
      if (state_->Killed(r->message.sender(), r->peer)) {
        state_->Count(&FaultStats::killed_in);
        continue;
      }
      return r;
    }
  }

  Socket* inner() { return inner_.get(); }

 private:
  std::shared_ptr<Socket> inner_;
  std::shared_ptr<FaultState> state_;
};

class FaultPoller final : public Poller {
 public:
  explicit FaultPoller(std::unique_ptr<Poller> inner) : inner_(std::move(inner)) {}
  void Add(Socket* socket) override {
    auto* f = dynamic_cast<FaultSocket*>(socket);
    TROUPE_CHECK_MSG(f != nullptr, "FaultInjectingNetwork poller: foreign socket");
    map_[f->inner()] = socket;
    inner_->Add(f->inner());
  }
  void Remove(Socket* socket) override {
    auto* f = dynamic_cast<FaultSocket*>(socket);
    if (f == nullptr) return;
    map_.erase(f->inner());
    inner_->Remove(f->inner());
  }
  Result<std::vector<Socket*>> Wait(Deadline deadline) override {
    auto r = inner_->Wait(deadline);
    if (!r.ok()) return r;
    std::vector<Socket*> out;
    for (auto* s : *r) out.push_back(map_.at(s));
    return out;
  }
  void Wake() override { inner_->Wake(); }

 private:
  std::unique_ptr<Poller> inner_;
  std::map<Socket*, Socket*> map_;
};

}  // namespace
}  // namespace detail

FaultInjectingNetwork::FaultInjectingNetwork(Network* inner)
    : inner_(inner), state_(std::make_shared<detail::FaultState>()) {}
FaultInjectingNetwork::~FaultInjectingNetwork() = default;

void FaultInjectingNetwork::SetHook(const std::string& name, SendHook hook) {
  state_->SetHook(name, std::move(hook));
}
void FaultInjectingNetwork::RemoveHook(const std::string& name) {
  state_->RemoveHook(name);
}
void FaultInjectingNetwork::DropNext(int n, SendFilter filter) {
  state_->AddRule(FaultAction::Drop(), n, std::move(filter));
}
void FaultInjectingNetwork::DuplicateNext(int n, SendFilter filter) {
  state_->AddRule(FaultAction::Duplicate(), n, std::move(filter));
}
void FaultInjectingNetwork::DelayNext(int n, int64_t delay_ms, SendFilter filter) {
  state_->AddRule(FaultAction::Delay(delay_ms), n, std::move(filter));
}
void FaultInjectingNetwork::FailNext(int n, SendFilter filter) {
  state_->AddRule(FaultAction::Fail(), n, std::move(filter));
}
void FaultInjectingNetwork::KillPeer(const std::string& peer) {
  state_->Kill(peer, true);
}
void FaultInjectingNetwork::RevivePeer(const std::string& peer) {
  state_->Kill(peer, false);
}
FaultStats FaultInjectingNetwork::stats() const {
  return state_->stats();
}

Result<std::unique_ptr<Socket>> FaultInjectingNetwork::Bind(SocketKind kind,
                                                            const std::string& endpoint,
                                                            const SocketOptions& options) {
  TROUPE_ASSIGN_OR_RETURN(auto s, inner_->Bind(kind, endpoint, options));
  return std::unique_ptr<Socket>(
      std::make_unique<detail::FaultSocket>(std::shared_ptr<Socket>(std::move(s)), state_));
}

Result<std::unique_ptr<Socket>> FaultInjectingNetwork::Connect(SocketKind kind,
                                                               const std::string& endpoint,
                                                               const SocketOptions& options) {
  TROUPE_ASSIGN_OR_RETURN(auto s, inner_->Connect(kind, endpoint, options));
  return std::unique_ptr<Socket>(
      std::make_unique<detail::FaultSocket>(std::shared_ptr<Socket>(std::move(s)), state_));
}

std::unique_ptr<Poller> FaultInjectingNetwork::NewPoller() {
  return std::make_unique<detail::FaultPoller>(inner_->NewPoller());
}

}  // namespace troupe::transport
