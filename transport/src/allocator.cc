#include "troupe/transport/allocator.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace troupe::transport {

bool ApplyAllocatorPolicy(const AllocatorPolicy& policy) {
#if defined(__GLIBC__)
  auto clamp = [](size_t v) { return static_cast<int>(v > INT_MAX ? INT_MAX : v); };
  // A fixed M_MMAP_THRESHOLD also turns off glibc's adaptive thresholds.
  const bool a = mallopt(M_MMAP_THRESHOLD, clamp(policy.mmap_threshold_bytes)) == 1;
  const bool b = mallopt(M_TRIM_THRESHOLD, clamp(policy.trim_threshold_bytes)) == 1;
  return a && b;
#else
  (void)policy;
  return false;
#endif
}

}  // namespace troupe::transport
