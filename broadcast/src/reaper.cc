// Background destruction of failed groups (reaper.h).
#include "reaper.h"
#include "troupe/core/thread_name.h"

namespace troupe::broadcast {

Reaper::~Reaper() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Reaper::Add(std::shared_ptr<void> thing) {
  if (!thing) return;
  MutexLock lock(mu_);
  queue_.push_back(std::move(thing));
  if (!thread_.joinable())
    thread_ = std::thread([this] {
      SetThreadName("reaper");
      Run();
    });
  cv_.notify_all();
}

void Reaper::Run() {
  while (true) {
    std::shared_ptr<void> next;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stop_)
        cv_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(1),
                       [&]() TROUPE_REQUIRES(mu_) { return !queue_.empty() || stop_; });
      if (queue_.empty()) return;  // stop_ and nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next.reset();  // may block until the object's operations time out
  }
}

}  // namespace troupe::broadcast
