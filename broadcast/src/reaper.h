// Destroys objects on a background thread.
//
// A c10d process group or NCCL communicator that failed may block in its
// destructor until its in-flight operations time out; the broadcast hands such
// objects to a Reaper so the learner and receivers re-form their group at once.
// Add() is thread-safe and never blocks; the destructor waits until every
// object added has been destroyed (each bounded by its own timeout).
#pragma once

#include <deque>
#include <memory>
#include <thread>

#include "troupe/core/thread_annotations.h"

namespace troupe::broadcast {

class Reaper {
 public:
  Reaper() = default;
  ~Reaper();
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  void Add(std::shared_ptr<void> thing);

 private:
  void Run();
  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<void>> queue_ TROUPE_GUARDED_BY(mu_);
  bool stop_ TROUPE_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Add
};

}  // namespace troupe::broadcast
