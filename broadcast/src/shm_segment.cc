// POSIX shared-memory segment of the shm backend (shm_segment.h).
#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace troupe::broadcast {
namespace {

constexpr uint64_t kMagic = 0x31305447575054ULL;  // "TPWGT01"
constexpr uint64_t kFormat = 1;
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kSlotAlign = uint64_t{2} << 20;
std::atomic<uint64_t> g_counter{0};

}  // namespace

Result<std::shared_ptr<ShmWriter>> ShmWriter::Create(const std::string& prefix, uint64_t capacity) {
  RemoveStale(prefix);
  capacity = std::max<uint64_t>(kSlotAlign, (capacity + kSlotAlign - 1) / kSlotAlign * kSlotAlign);
  std::string name = fmt::format("{}-{}-{}", prefix, ::getpid(), g_counter.fetch_add(1));
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return IoError("shm_open({}): {}", name, std::strerror(errno));
  size_t bytes = kHeaderBytes + 2 * capacity;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return ResourceExhausted("cannot size shm segment {} to {} bytes: {}", name, bytes,
                             std::strerror(e));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return ResourceExhausted("cannot map shm segment {} ({} bytes): {}", name, bytes,
                             std::strerror(e));
  }
  auto* h = new (map) ShmHeader();
  h->magic = kMagic;
  h->format = kFormat;
  h->capacity = capacity;
  h->slot_offset[0] = kHeaderBytes;
  h->slot_offset[1] = kHeaderBytes + capacity;
  h->generation[0].store(0, std::memory_order_relaxed);
  h->generation[1].store(0, std::memory_order_relaxed);
  h->owner_pid = static_cast<uint64_t>(::getpid());
  return std::shared_ptr<ShmWriter>(
      new ShmWriter(std::move(name), static_cast<uint8_t*>(map), bytes));
}

ShmWriter::~ShmWriter() {
  ::munmap(base_, bytes_);
  ::shm_unlink(name_.c_str());
}

void ShmWriter::BeginWrite(int slot) {
  uint64_t g = header_->generation[slot].load(std::memory_order_relaxed);
  header_->generation[slot].store(g | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

uint64_t ShmWriter::EndWrite(int slot) {
  uint64_t g = (header_->generation[slot].load(std::memory_order_relaxed) | 1) + 1;
  header_->generation[slot].store(g, std::memory_order_release);
  return g;
}

int ShmWriter::RemoveStale(const std::string& prefix) {
  // Segments live in /dev/shm as the name without its leading '/'.
  std::string stem = prefix.substr(1) + "-";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (dirent* ent = ::readdir(dir)) {
    std::string n = ent->d_name;
    if (n.rfind(stem, 0) != 0) continue;
    std::string rest = n.substr(stem.size());
    auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0) continue;
    long pid = 0;
    bool digits = true;
    for (size_t i = 0; i < dash; ++i) {
      if (rest[i] < '0' || rest[i] > '9' || pid > (1L << 31)) digits = false;
      pid = pid * 10 + (rest[i] - '0');
    }
    if (!digits || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::shm_unlink(("/" + n).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

Result<std::unique_ptr<ShmReader>> ShmReader::Open(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos)
    return Malformed("shm segment name '{}' is not '/name'", name);
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0)
    return Unavailable("shm_open({}): {} (is the receiver on the learner's node?)", name,
                       std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    return Malformed("shm segment {} is too small ({} bytes)", name, st.st_size);
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) return IoError("mmap shm segment {}: {}", name, std::strerror(e));
  std::unique_ptr<ShmReader> r(new ShmReader(name, static_cast<uint8_t*>(map), bytes));
  const ShmHeader* h = r->header_;
  if (h->magic != kMagic || h->format != kFormat)
    return Malformed("shm segment {} has magic {:x} format {} (not a Troupe weights segment)", name,
                     h->magic, h->format);
  for (int s = 0; s < 2; ++s)
    if (h->slot_offset[s] < kHeaderBytes || h->slot_offset[s] > bytes ||
        h->capacity > bytes - h->slot_offset[s])
      return Malformed("shm segment {} slot {} lies outside the segment", name, s);
  return r;
}

ShmReader::~ShmReader() {
  ::munmap(base_, bytes_);
}

Result<const uint8_t*> ShmReader::Slot(uint64_t offset, uint64_t bytes) const {
  for (int s = 0; s < 2; ++s)
    if (offset == header_->slot_offset[s]) {
      if (bytes > header_->capacity)
        return Malformed("{} bytes do not fit a {} byte slot of {}", bytes, header_->capacity,
                         name_);
      return base_ + offset;
    }
  return Malformed("offset {} is not a slot of shm segment {}", offset, name_);
}

uint64_t ShmReader::Generation(uint64_t offset) const {
  int s = offset == header_->slot_offset[1] ? 1 : 0;
  return header_->generation[s].load(std::memory_order_acquire);
}

}  // namespace troupe::broadcast
