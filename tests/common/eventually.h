// Polling for tests that watch other processes (actors, daemons, a head): they
// give us nothing to wait on but their answers, so poll `pred` until it holds
// or the deadline passes (bounded, never a bare sleep).
#pragma once

#include <chrono>
#include <thread>

#include "troupe/core/deadline.h"

namespace troupe::testing {

template <typename Pred>
bool Eventually(Pred pred, int timeout_ms = 20000, int poll_ms = 100) {
  auto d = Deadline::InMs(timeout_ms);
  while (!d.expired()) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return pred();
}

}  // namespace troupe::testing
