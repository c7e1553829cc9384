// Names the calling thread, so that top -H, perf, gdb and /proc/<pid>/task/*/comm tell an
// actor's threads apart (the engine, the weight receiver, the transport's sender...). The
// kernel keeps at most 15 bytes; longer names are cut. Never fails: a name is a diagnostic.
#pragma once

#include <pthread.h>

#include <string>

namespace troupe {

inline void SetThreadName(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace troupe
