#include "troupe/engine/memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace troupe::engine {

bool ConfigureAllocatorForTensors() {
  bool ok = true;
  // glibc's upper bound for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
  ok &= mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  // Never give the top of the heap back: the next forward pass would fault it in again.
  ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  // Blocks above 32 MiB (a [64, 151936] float32 logits tensor is 39 MB, a learner step's
  // [600, 151936] one 365 MB) would still get a fresh mmap per allocation: serve them from
  // the heap too, and keep every thread on the main (sbrk) heap, since another arena maps
  // blocks above its 64 MiB heaps regardless of M_MMAP_MAX.
  ok &= mallopt(M_MMAP_MAX, 0) == 1;
  ok &= mallopt(M_ARENA_MAX, 1) == 1;
  return ok;
}

void* AllocateOnHugePages(size_t bytes) {
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = nullptr;
  if (rounded == 0 || posix_memalign(&p, kHugePageBytes, rounded) != 0) return nullptr;
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // before the first touch: faults take huge pages
  std::memset(p, 0, rounded);
  return p;
}

}  // namespace troupe::engine
