// Process-level allocator tuning for processes that run torch (rollout actors, the learner,
// benchmarks). Torch allocates its CPU tensors with malloc; glibc serves blocks above the
// mmap threshold with fresh mmap()s and returns freed heap tops to the kernel, so every
// forward pass touches fresh pages (first touch costs ~0.3 GB/s on our machines, ~50x
// slower than reused memory). On the default model this made a full forward ~5x slower.
//
// ConfigureAllocatorForTensors() raises the mmap threshold to glibc's maximum (32 MiB),
// stops heap trimming, turns mmap off for larger blocks (M_MMAP_MAX 0) and keeps every
// thread on the main heap (M_ARENA_MAX 1), so freed tensor memory is reused: with a
// 151k-token vocabulary every step's logits are 39-365 MB, and fresh pages for them halved
// generation and training throughput (bench/engine/models_bench). The price: the process
// keeps its peak heap. Call it once at the start of
// main(), before threads start; it is not called by any library code (it changes the
// whole process). Returns false if glibc refused a setting. Thread-compatible only.
//
// AllocateOnHugePages(bytes): zeroed memory aligned to 2 MiB and advised as transparent huge
// pages (madvise MADV_HUGEPAGE), for buffers that every step reads a little of in many places:
// the KV cache, whose attention reads touch one 4 KiB page per (slot, head) row, thousands of
// TLB entries a step. A rollout that idles between grant waves starts each wave with those
// entries gone (bench/actors/job_bench.py --only duty_cycle). Returns nullptr where the aligned
// allocation fails; the advice is best effort (4 KiB pages where the kernel refuses it). Free
// with std::free. Thread-safe.
#pragma once

#include <cstddef>

namespace troupe::engine {

bool ConfigureAllocatorForTensors();

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
void* AllocateOnHugePages(size_t bytes);

}  // namespace troupe::engine
