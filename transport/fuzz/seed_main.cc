// Writes the seed corpus (good messages of several kinds) into a directory.
#include <cstdio>
#include <fstream>
#include <string>

#include "fuzz_input.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  for (const auto& [name, bytes] : troupe::transport::fuzz::SeedInputs()) {
    std::ofstream(std::string(argv[1]) + "/" + name, std::ios::binary) << bytes;
  }
  return 0;
}
