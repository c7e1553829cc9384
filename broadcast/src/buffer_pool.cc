// Page-aligned pooled buffers (buffer_pool.h).
#include "buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace troupe::broadcast {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;
}  // namespace

Result<std::shared_ptr<FlatBuffer>> FlatBuffer::Allocate(size_t bytes) {
  size_t capacity = std::max<size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  bool huge = capacity >= kHugePage;
  size_t map_bytes = huge ? capacity + kHugePage : capacity;
  void* map =
      ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return ResourceExhausted("cannot map a {} byte buffer: {}", map_bytes, std::strerror(errno));
  auto* data = static_cast<uint8_t*>(map);
  if (huge) {
    auto addr = reinterpret_cast<uintptr_t>(map);
    data = reinterpret_cast<uint8_t*>((addr + kHugePage - 1) / kHugePage * kHugePage);
#ifdef MADV_HUGEPAGE
    ::madvise(data, capacity, MADV_HUGEPAGE);  // advisory: failure only costs speed
#endif
  }
  return std::shared_ptr<FlatBuffer>(new FlatBuffer(map, map_bytes, data, capacity));
}

FlatBuffer::~FlatBuffer() {
  ::munmap(map_, map_bytes_);
}

Result<std::shared_ptr<FlatBuffer>> BufferPool::Get(size_t bytes) {
  std::shared_ptr<FlatBuffer>* best = nullptr;
  for (auto& b : buffers_) {
    if (b.use_count() != 1 || b->capacity() < bytes) continue;
    if (best == nullptr || b->capacity() < (*best)->capacity()) best = &b;
  }
  if (best != nullptr) return *best;
  // Free buffers too small for this size are unlikely to fit later versions: drop them.
  buffers_.erase(std::remove_if(buffers_.begin(), buffers_.end(),
                                [&](const std::shared_ptr<FlatBuffer>& b) {
                                  return b.use_count() == 1 && b->capacity() < bytes;
                                }),
                 buffers_.end());
  TROUPE_ASSIGN_OR_RETURN(auto fresh, FlatBuffer::Allocate(bytes));
  buffers_.push_back(fresh);
  while (buffers_.size() > max_buffers_) {
    // Forget the oldest entry (a free one first); busy ones are freed by their last user.
    auto it = std::find_if(buffers_.begin(), buffers_.end() - 1,
                           [](const std::shared_ptr<FlatBuffer>& b) { return b.use_count() == 1; });
    buffers_.erase(it != buffers_.end() - 1 ? it : buffers_.begin());
  }
  return fresh;
}

}  // namespace troupe::broadcast
