// Reusable, page-aligned byte buffers for the weight stream.
//
// Fresh memory is expensive here (first touch ~0.3 GB/s vs ~16 GB/s for
// touched memory), so the sender packs, and receivers receive, into buffers
// that live across versions. A buffer is free again when nothing but the pool
// references it: tensors handed to a sink hold a reference (UnpackTensors
// keeps the owner alive), and so do ZeroMQ zero-copy sends in flight. Large
// buffers are 2 MiB aligned and advised for transparent huge pages.
//
// FlatBuffer is immutable in size; BufferPool is used by one thread (its owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::broadcast {

class FlatBuffer {
 public:
  // Maps `bytes` (rounded up) of anonymous memory. Errors: out of memory (named size).
  static Result<std::shared_ptr<FlatBuffer>> Allocate(size_t bytes);
  ~FlatBuffer();
  FlatBuffer(const FlatBuffer&) = delete;
  FlatBuffer& operator=(const FlatBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  FlatBuffer(void* map, size_t map_bytes, uint8_t* data, size_t capacity)
      : map_(map), map_bytes_(map_bytes), data_(data), capacity_(capacity) {}
  void* map_;
  size_t map_bytes_;
  uint8_t* data_;
  size_t capacity_;
};

class BufferPool {
 public:
  // Keeps at most `max_buffers` references (busy buffers beyond that are forgotten and freed
  // by their last user).
  explicit BufferPool(size_t max_buffers = 3) : max_buffers_(max_buffers) {}
  // A buffer of at least `bytes` that nobody else references (reused when possible).
  Result<std::shared_ptr<FlatBuffer>> Get(size_t bytes);
  // Drops every reference the pool holds.
  void Clear() { buffers_.clear(); }

 private:
  size_t max_buffers_;
  std::vector<std::shared_ptr<FlatBuffer>> buffers_;
};

}  // namespace troupe::broadcast
