// Small text helpers shared by every component.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe {

// `s` made safe to print in an error message or a log line: printable ASCII
// is kept, every other byte becomes \xNN; at most `max` input bytes are
// shown, followed by "..." when `s` is longer.
std::string Printable(std::string_view s, size_t max = std::string_view::npos);

// This machine's host name ("localhost" when it cannot be read).
std::string HostName();

}  // namespace troupe
