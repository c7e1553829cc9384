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
#pragma once

namespace troupe::engine {

bool ConfigureAllocatorForTensors();

}  // namespace troupe::engine
