// Clang thread-safety annotations and an annotated mutex.
//
// Locks are checked, not commented: members guarded by a mutex carry
// TROUPE_GUARDED_BY(mu_), functions that need it TROUPE_REQUIRES(mu_). With
// gcc the annotations compile to nothing; the test suite's
// `thread_safety_check` (scripts/check-thread-safety.py) compiles every
// annotated translation unit with clang -Wthread-safety -Werror. Lambdas that
// run under the lock (CondVar::wait_until predicates) say so with
// `[&]() TROUPE_REQUIRES(mu_) { ... }`.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TROUPE_TSA(x) __attribute__((x))
#else
#define TROUPE_TSA(x)
#endif

#define TROUPE_CAPABILITY(x) TROUPE_TSA(capability(x))
#define TROUPE_SCOPED_CAPABILITY TROUPE_TSA(scoped_lockable)
#define TROUPE_GUARDED_BY(x) TROUPE_TSA(guarded_by(x))
#define TROUPE_PT_GUARDED_BY(x) TROUPE_TSA(pt_guarded_by(x))
#define TROUPE_REQUIRES(...) TROUPE_TSA(requires_capability(__VA_ARGS__))
#define TROUPE_EXCLUDES(...) TROUPE_TSA(locks_excluded(__VA_ARGS__))
#define TROUPE_ACQUIRE(...) TROUPE_TSA(acquire_capability(__VA_ARGS__))
#define TROUPE_RELEASE(...) TROUPE_TSA(release_capability(__VA_ARGS__))
#define TROUPE_TRY_ACQUIRE(...) TROUPE_TSA(try_acquire_capability(__VA_ARGS__))
#define TROUPE_NO_THREAD_SAFETY_ANALYSIS TROUPE_TSA(no_thread_safety_analysis)

namespace troupe {

// std::mutex with capability annotations.
class TROUPE_CAPABILITY("mutex") Mutex {
 public:
  void lock() TROUPE_ACQUIRE() { mu_.lock(); }
  void unlock() TROUPE_RELEASE() { mu_.unlock(); }
  bool try_lock() TROUPE_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// RAII lock over Mutex; usable with CondVar::wait.
class TROUPE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) TROUPE_ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() TROUPE_RELEASE() = default;
  // Releases the lock for a section that must run without it; Lock() takes it back.
  void Unlock() TROUPE_RELEASE() { lock_.unlock(); }
  void Lock() TROUPE_ACQUIRE() { lock_.lock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// Condition variable that waits on a MutexLock, always with a deadline.
class CondVar {
 public:
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }
  // Waits until pred() or the deadline; returns pred().
  template <typename Pred>
  bool wait_until(MutexLock& lock, std::chrono::steady_clock::time_point at, Pred pred) {
    return cv_.wait_until(lock.native(), at, pred);
  }

 private:
  std::condition_variable cv_;
};

}  // namespace troupe
