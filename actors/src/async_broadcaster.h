// The learner's weight publisher: broadcasts versions on a background thread,
// coalescing — while one broadcast runs, only the newest pending version is
// kept, so a slow receiver costs versions, never the learner's time.
//
//   learner loop ──Publish(version, weights)──▶ [next] ──thread──▶ WeightSender::Broadcast
//
// Publish and WaitIdle may be called from any thread; the sender is only used
// on the publisher's own thread. The destructor stops and joins it (a
// broadcast in progress finishes or fails by its deadline first).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "troupe/broadcast/sender.h"
#include "troupe/core/deadline.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/engine/model.h"

namespace troupe::actors {

class AsyncBroadcaster {
 public:
  // Borrows `sender` (must outlive this).
  explicit AsyncBroadcaster(broadcast::WeightSender* sender);
  ~AsyncBroadcaster();
  AsyncBroadcaster(const AsyncBroadcaster&) = delete;
  AsyncBroadcaster& operator=(const AsyncBroadcaster&) = delete;

  // Snapshots `named` (the learner keeps training) and queues it, replacing
  // any version still waiting.
  void Publish(uint64_t version, const engine::NamedTensors& named);
  // Blocks until everything queued was broadcast, or the deadline (false).
  bool WaitIdle(Deadline deadline);
  uint64_t published() const { return published_.load(); }
  uint64_t failures() const { return failures_.load(); }
  double last_seconds() const { return last_seconds_.load(); }

 private:
  void Loop();

  broadcast::WeightSender* sender_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  bool has_next_ TROUPE_GUARDED_BY(mu_) = false;
  bool busy_ TROUPE_GUARDED_BY(mu_) = false;
  uint64_t next_version_ TROUPE_GUARDED_BY(mu_) = 0;
  broadcast::NamedTensors next_ TROUPE_GUARDED_BY(mu_);
  std::atomic<uint64_t> published_{0}, failures_{0};
  std::atomic<double> last_seconds_{0};
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace troupe::actors
