// Secrets from the operating system's random source.
#pragma once

#include <cstddef>
#include <string>

#include "troupe/core/status.h"

namespace troupe {

// `bytes` random bytes from /dev/urandom as lowercase hex (2 x `bytes` characters): bearer
// tokens and other secrets. IoError when /dev/urandom cannot be read. Thread-safe.
Result<std::string> RandomHex(size_t bytes = 32);

}  // namespace troupe
