#include "troupe/engine/memory.h"

#include <malloc.h>

namespace troupe::engine {

bool ConfigureAllocatorForTensors() {
  bool ok = true;
  // glibc's upper bound for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
  ok &= mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  // Never give the top of the heap back: the next forward pass would fault it in again.
  ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok;
}

}  // namespace troupe::engine
