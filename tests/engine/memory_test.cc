// ConfigureAllocatorForTensors (engine/memory.h): after it, blocks of any size come from the
// heap and freed ones are reused, so a step's large logits never fault in fresh pages.
#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
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

// The VmFlags line of the /proc/self/smaps mapping that holds address p ("" if none).
std::string VmFlagsAt(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(Memory, HugePageBuffersAreAlignedZeroedAndAdvised) {
  for (size_t bytes : {size_t{1}, size_t{1} << 20, kHugePageBytes, size_t{5} << 20}) {
    auto* p = static_cast<unsigned char*>(AllocateOnHugePages(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << bytes;
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    size_t nonzero = 0;
    for (size_t i = 0; i < rounded; i += 4093) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0u) << bytes;
    // Where the kernel has transparent huge pages, the whole buffer carries the advice
    // ("hg" in its mapping's flags), whether or not huge pages were free to back it.
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode((std::istreambuf_iterator<char>(thp)), std::istreambuf_iterator<char>());
    if (!mode.empty() && mode.find("[never]") == std::string::npos) {
      EXPECT_NE(VmFlagsAt(p).find(" hg"), std::string::npos) << bytes << ": " << VmFlagsAt(p);
      EXPECT_NE(VmFlagsAt(p + rounded - 1).find(" hg"), std::string::npos) << bytes;
    }
    std::free(p);
  }
  EXPECT_EQ(AllocateOnHugePages(0), nullptr);
}

}  // namespace
}  // namespace troupe::engine
