// Process-level allocator tuning for processes that run torch (rollout actors, the learner,
// benchmarks). Torch allocates its CPU tensors with malloc; glibc serves blocks above the
// mmap threshold with fresh mmap()s and returns freed heap tops to the kernel, so every
// forward pass touches fresh pages (first touch costs ~0.3 GB/s on our machines, ~50x
// slower than reused memory). On the default model this made a full forward ~5x slower.
//
// ConfigureAllocatorForTensors() raises the mmap threshold to glibc's maximum (32 MiB)
// and stops heap trimming, so freed tensor memory is reused. Call it once at the start of
// main(), before threads start; it is not called by any library code (it changes the
// whole process). Returns false if glibc refused a setting. Thread-compatible only.
#pragma once

namespace troupe::engine {

bool ConfigureAllocatorForTensors();

}  // namespace troupe::engine
