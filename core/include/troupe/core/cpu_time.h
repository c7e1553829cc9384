// CPU time consumed so far, in seconds: by the calling thread or by the whole
// process (every thread). Differences of these are load-robust costs: time the
// OS gave to other processes does not count. Never block; any thread.
#pragma once

#include <time.h>

namespace troupe {

inline double CpuSeconds(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
inline double ThreadCpuSeconds() {
  return CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
}
inline double ProcessCpuSeconds() {
  return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
}

}  // namespace troupe
