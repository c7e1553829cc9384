#include "troupe/core/random.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace troupe {

Result<std::string> RandomHex(size_t bytes) {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open /dev/urandom: {}", std::strerror(errno));
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::read(fd, buf.data() + got, bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != bytes) return IoError("short read from /dev/urandom ({} of {} bytes)", got, bytes);
  std::string hex;
  hex.reserve(2 * bytes);
  for (unsigned char b : buf) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace troupe
