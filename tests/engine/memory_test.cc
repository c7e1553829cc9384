// ConfigureAllocatorForTensors (engine/memory.h): after it, blocks of any size come from the
// heap and freed ones are reused, so a step's large logits never fault in fresh pages.
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "troupe/engine/memory.h"

namespace troupe::engine {
namespace {

TEST(Memory, LargeBlocksComeFromTheHeapOnEveryThread) {
  ASSERT_TRUE(ConfigureAllocatorForTensors());
  // 365 MB: a learner step's [600, 151936] float32 logits; 39 MB: a decode step's.
  for (size_t bytes : {size_t{39} << 20, size_t{365} << 20}) {
    auto allocate = [bytes] {
      const size_t mapped = mallinfo2().hblks;  // mappings made before (static init)
      void* p = std::malloc(bytes);
      ASSERT_NE(p, nullptr);
      std::memset(p, 1, bytes);
      EXPECT_EQ(mallinfo2().hblks, mapped) << bytes << " bytes were mmapped";
      std::free(p);
    };
    allocate();
    std::thread other(allocate);  // another thread: still the main heap, never a mapping
    other.join();
  }
  // Freed memory stays with the process (no trim), ready for the next step.
  EXPECT_GE(mallinfo2().arena, size_t{365} << 20);
}

}  // namespace
}  // namespace troupe::engine
