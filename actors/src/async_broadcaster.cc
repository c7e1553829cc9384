#include "async_broadcaster.h"

#include <chrono>

#include "troupe/core/log.h"
#include "troupe/core/thread_name.h"

namespace troupe::actors {
namespace {

spdlog::logger& Log() {
  return log::Get("learner");
}

}  // namespace

AsyncBroadcaster::AsyncBroadcaster(broadcast::WeightSender* sender)
    : sender_(sender), thread_([this] {
        SetThreadName("weights-publish");
        Loop();
      }) {}

AsyncBroadcaster::~AsyncBroadcaster() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncBroadcaster::Publish(uint64_t version, const engine::NamedTensors& named) {
  broadcast::NamedTensors copy;
  copy.reserve(named.size());
  for (const auto& [n, t] : named) copy.emplace_back(n, t.detach().clone());
  MutexLock l(mu_);
  next_version_ = version;
  next_ = std::move(copy);
  has_next_ = true;
  cv_.notify_all();
}

bool AsyncBroadcaster::WaitIdle(Deadline deadline) {
  MutexLock l(mu_);
  return cv_.wait_until(l, deadline.at(),
                        [&]() TROUPE_REQUIRES(mu_) { return !has_next_ && !busy_; });
}

void AsyncBroadcaster::Loop() {
  while (true) {
    uint64_t v = 0;
    broadcast::NamedTensors named;
    {
      MutexLock l(mu_);
      while (!stop_ && !has_next_)
        cv_.wait_until(l, Clock::now() + std::chrono::seconds(1),
                       [&]() TROUPE_REQUIRES(mu_) { return stop_ || has_next_; });
      if (stop_) return;
      v = next_version_;
      named = std::move(next_);
      has_next_ = false;
      busy_ = true;
    }
    const auto t0 = Clock::now();
    Status s = sender_->Broadcast(v, named, Deadline::InMs(60000));
    last_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s.ok()) {
      published_ = v;
    } else {
      failures_.fetch_add(1);
      TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000, "broadcast of version {} failed: {}", v,
                          s.ToString());
    }
    MutexLock l(mu_);
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace troupe::actors
