#include "troupe/trainer/allocator.h"

#include <malloc.h>

namespace troupe::trainer {

Status TuneAllocatorForTraining() {
  constexpr int kMmapThreshold = 32 << 20;  // glibc's maximum on 64-bit
  constexpr int kTrimThreshold = 1 << 30;
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1) {
    return Internal("mallopt(M_MMAP_THRESHOLD, {}) was refused", kMmapThreshold);
  }
  if (mallopt(M_TRIM_THRESHOLD, kTrimThreshold) != 1) {
    return Internal("mallopt(M_TRIM_THRESHOLD, {}) was refused", kTrimThreshold);
  }
  return Status::Ok();
}

}  // namespace troupe::trainer
