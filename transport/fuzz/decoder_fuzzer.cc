// libFuzzer target for the message decoder (built with -DTROUPE_FUZZ=ON and
// clang; run by scripts/fuzz-transport.sh). Any crash, sanitizer report or
// uncaught exception is a bug: the decoder must reject bad input with a
// Status.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  troupe::transport::fuzz::DecodeOne(data, size);
  return 0;
}
