// The factory of data paths (data_path.h): the one table that knows every backend.
//
// Adding a backend: an enum value in config.h (with its name in config.cc), one file pair
// <name>_path.{h,cc} implementing SenderPath and ReceiverPath, one row below, and the .cc
// in broadcast/CMakeLists.txt. The sender and receiver need no change.
#include "data_path.h"

#include <unistd.h>

#include <random>

#include "gloo_path.h"
#include "nccl_path.h"
#include "shm_path.h"
#include "zmq_path.h"

namespace troupe::broadcast {
namespace {

struct BackendEntry {
  Backend backend;
  Result<std::unique_ptr<SenderPath>> (*sender)(const SenderContext&);
  Result<std::unique_ptr<ReceiverPath>> (*receiver)(const ReceiverContext&);
};

const BackendEntry kBackends[] = {
    {Backend::kGloo, NewGlooSenderPath, NewGlooReceiverPath},
    {Backend::kZmq, NewZmqSenderPath, NewZmqReceiverPath},
    {Backend::kShm, NewShmSenderPath, NewShmReceiverPath},
#ifdef TROUPE_BROADCAST_HAVE_NCCL
    {Backend::kNccl, NewNcclSenderPath, NewNcclReceiverPath},
#endif
};

const BackendEntry* Find(Backend backend) {
  for (const auto& e : kBackends)
    if (e.backend == backend) return &e;
  return nullptr;
}

}  // namespace

Result<std::unique_ptr<SenderPath>> NewSenderPath(Backend backend, const SenderContext& context) {
  const BackendEntry* e = Find(backend);
  if (e == nullptr)
    return Unavailable("broadcast backend '{}' is not built in", BackendName(backend));
  return e->sender(context);
}

Result<std::unique_ptr<ReceiverPath>> NewReceiverPath(Backend backend,
                                                      const ReceiverContext& context) {
  const BackendEntry* e = Find(backend);
  if (e == nullptr)
    return Unavailable("broadcast backend '{}' is not built in", BackendName(backend));
  return e->receiver(context);
}

// ----------------------------------------------------------------- helpers

std::string RandomHex(size_t bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::random_device rd;
  std::string out;
  out.reserve(bytes * 2);
  for (size_t i = 0; i < bytes; ++i) {
    auto b = static_cast<unsigned>(rd()) & 0xff;
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::string UnguessableIdentity(const std::string& actor_id) {
  return actor_id + "/" + RandomHex(16);
}

std::string IdentityActor(const std::string& identity) {
  auto slash = identity.rfind('/');
  if (slash == std::string::npos || slash == 0 || identity.size() - slash != 33) return "";
  return identity.substr(0, slash);
}

std::chrono::milliseconds Budget(Deadline deadline, std::chrono::milliseconds cap) {
  auto rem = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
  return std::max(std::chrono::milliseconds(1), std::min(rem, cap));
}

}  // namespace troupe::broadcast
