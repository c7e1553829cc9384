// Process-wide allocator policy for processes that move large messages.
//
// glibc serves blocks above M_MMAP_THRESHOLD (128 KiB to 32 MiB, adaptive)
// with fresh mmap()s and trims the heap top above M_TRIM_THRESHOLD, so a
// 16 MiB batch received by ZeroMQ, or a large message builder, lands in
// untouched pages every time: first touch runs at ~0.3 GB/s on the reference
// machine against ~16 GB/s for memory the process already owns. Keeping freed
// blocks in the process makes the next batch reuse warm memory.
//
// This is a process-wide decision, so the library never applies it by
// itself: the actor host, the launcher or a benchmark calls it once from
// main(), before starting threads. Not thread-safe with concurrent malloc
// tuning; harmless to call more than once.
#pragma once

#include <cstddef>

namespace troupe::transport {

struct AllocatorPolicy {
  // Blocks up to this size come from the heap and are reused after free.
  // Default 256 MiB (above the largest default message). Larger values keep
  // more memory resident after a burst.
  size_t mmap_threshold_bytes = size_t{256} << 20;
  // Free memory at the heap top kept instead of returned to the kernel.
  // Default 1 GiB.
  size_t trim_threshold_bytes = size_t{1} << 30;
};

// Applies `policy` with mallopt(); returns false where unsupported (non-glibc).
bool ApplyAllocatorPolicy(const AllocatorPolicy& policy = {});

}  // namespace troupe::transport
