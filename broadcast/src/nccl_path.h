// The nccl backend (GPUs): one NCCL communicator per epoch. Compiled only when
// CUDA + NCCL are found (nccl_path.cc is then part of the library and the
// factory in data_path.cc lists it); this header needs neither.
//
// The learner creates an ncclUniqueId per epoch and sends it to the members
// inside BroadcastGroup (the control plane). Every rank initialises a
// non-blocking communicator (config.blocking = 0) and polls it, so neither
// initialisation nor a collective can hang: on the deadline, on an
// asynchronous NCCL error, or when the caller's `should_abort` says so (a
// newer epoch arrived), the communicator is aborted with ncclCommAbort, never
// waited on. A stream in host memory (what WeightSender and WeightReceiver hand
// over today: checksums and newcomers' catch-up read host bytes) is staged
// through a device buffer: rank 0 copies it in, ncclBroadcast fans it out, the
// others copy it back out. A stream already in this GPU's memory (PackTensors
// with a CUDA flat_device) moves with no staging and no host round trip. Not
// thread-safe; one transfer at a time.
//
// What NCCL does not protect: its bootstrap and transport connections are
// neither authenticated nor encrypted. The ncclUniqueId (which names rank 0's
// bootstrap address) travels only in the epoch's BroadcastGroup on the
// control socket; across nodes with CURVE on the launcher refuses nccl unless
// broadcast.allow_unauthenticated_nccl is set (docs/multinode.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "data_path.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::broadcast {

// The paths (nccl_path.cc). The sender's fails at creation when its nccl_device is not visible.
Result<std::unique_ptr<SenderPath>> NewNcclSenderPath(const SenderContext& context);
Result<std::unique_ptr<ReceiverPath>> NewNcclReceiverPath(const ReceiverContext& context);

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

  // Moves the stream from rank 0 to every rank (see the file comment). `flat` is host memory
  // or memory of this rank's device (another device's is refused).
  Status Transfer(uint8_t* flat, const Layout& layout, Deadline deadline,
                  const std::function<bool()>& should_abort);

 private:
  struct Impl;
  explicit NcclGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::broadcast
