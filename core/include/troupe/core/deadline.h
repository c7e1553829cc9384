// Deadlines: every blocking call in Troupe takes one (DESIGN invariant 6).
//
// A Deadline is an absolute point on the steady clock. Value type; thread-safe
// to copy. `Deadline::Never()` exists for tests and for loops that are woken by
// a stop flag, and should be rare in library code.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace troupe {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class Deadline {
 public:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  static Deadline In(Clock::duration d) { return Deadline(Clock::now() + d); }
  static Deadline InMs(int64_t ms) { return In(Millis(ms)); }
  static Deadline Never() { return Deadline(Clock::time_point::max()); }
  static Deadline Now() { return Deadline(Clock::now()); }

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  bool is_never() const { return at_ == Clock::time_point::max(); }
  // Remaining time, clamped at zero.
  Clock::duration remaining() const {
    if (is_never()) return Clock::duration::max();
    auto now = Clock::now();
    return now >= at_ ? Clock::duration::zero() : at_ - now;
  }
  // Remaining milliseconds for APIs that take an int timeout (zmq_poll: -1 = forever).
  int64_t remaining_ms_or_minus1() const {
    if (is_never()) return -1;
    return std::chrono::duration_cast<Millis>(remaining()).count();
  }
  // The earlier of two deadlines.
  Deadline min(Deadline other) const { return Deadline(std::min(at_, other.at_)); }

 private:
  Clock::time_point at_;
};

// Wall clock in nanoseconds since the Unix epoch (for timestamps on the wire).
inline int64_t WallTimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace troupe
