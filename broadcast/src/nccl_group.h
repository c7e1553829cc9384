// The nccl backend's communicator for one epoch. Built only when CUDA + NCCL
// are found (TROUPE_BROADCAST_HAVE_NCCL).
//
// The learner creates an ncclUniqueId per epoch and sends it to the members
// inside BroadcastGroup (the control plane). Every rank initialises a
// non-blocking communicator (config.blocking = 0) and polls it, so neither
// initialisation nor a collective can hang: on the deadline, on an
// asynchronous NCCL error, or when the caller's `should_abort` says so (a
// newer epoch arrived), the communicator is aborted with ncclCommAbort, never
// waited on. Buckets are staged through a device buffer: rank 0 copies its
// host stream in, ncclBroadcast fans it out, the others copy it back out (this
// build's libtorch is CPU-only; with CUDA tensors the copies would be device
// to device). Not thread-safe; one transfer at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/broadcast/layout.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::broadcast {

class NcclGroup {
 public:
  // Number of visible CUDA devices (0 when the runtime finds none or fails).
  static int VisibleDevices();
  // A fresh ncclUniqueId as raw bytes.
  static Result<std::string> NewUniqueId();
  // Joins the communicator `unique_id` as `rank` of `size` on CUDA `device`.
  static Result<std::unique_ptr<NcclGroup>> Form(const std::string& unique_id, int rank, int size,
                                                 int device, Deadline deadline,
                                                 const std::function<bool()>& should_abort);
  ~NcclGroup();

  // Moves the stream from rank 0 to every rank (see the file comment).
  Status Transfer(uint8_t* flat, const Layout& layout, Deadline deadline,
                  const std::function<bool()>& should_abort);

 private:
  struct Impl;
  explicit NcclGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::broadcast
