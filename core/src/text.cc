#include "troupe/core/text.h"

#include <unistd.h>

#include <cstdio>

namespace troupe {

std::string Printable(std::string_view s, size_t max) {
  const std::string_view shown = s.substr(0, max);
  std::string out;
  out.reserve(shown.size() + 3);
  for (char c : shown) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    }
  }
  if (s.size() > shown.size()) out += "...";
  return out;
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace troupe
