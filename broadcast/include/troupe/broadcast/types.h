// Value types shared by the weight sender and receiver.
//
// NamedTensors is the currency of a broadcast: Hugging Face parameter names
// with CPU tensors (any layout; non-contiguous tensors are packed correctly).
// ReceivedWeights is what a rollout actor hands to its engine:
//   engine.UpdateWeights(w.version, w.named)
// Plain value types, not synchronised.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "troupe/broadcast/config.h"
#include "troupe/core/status.h"

namespace troupe::broadcast {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One delivered version of the weights.
struct ReceivedWeights {
  uint64_t version = 0;   // the learner's policy version these weights are
  uint64_t transfer = 0;  // group epoch of the broadcast, or a catch-up id (top bit set)
  bool catch_up = false;  // true: a newcomer's full catch-up from the learner over zmq
  WireDtype wire_dtype = WireDtype::kAsStored;  // kBFloat16: float32 values passed through bf16
  uint64_t learner_incarnation = 0;             // which learner process sent them
  // Tensors in the learner's order and dtypes. They are views over receiver-owned pooled
  // memory that stays valid as long as any tensor references it, except with the shm backend
  // in zero-copy mode, where they view the shared segment and are valid only until the sink
  // returns (clone them to keep them).
  NamedTensors named;
};

// Called on the receiver's thread with each new version; the receiver acknowledges the
// version to the learner after the sink returns ok (a non-ok status is reported to the
// learner as a rejection and the receiver keeps its previous version). Keep it short: the
// learner waits for every member's acknowledgement (up to its timeout).
using WeightsSink = std::function<Status(const ReceivedWeights&)>;

// Outcome of one WeightSender::Broadcast call.
struct BroadcastReport {
  uint64_t version = 0;
  uint64_t epoch = 0;                 // group epoch the successful (or last) attempt used
  int attempts = 0;                   // 1 = first attempt succeeded
  std::vector<std::string> members;   // receivers that acknowledged this version
  std::vector<std::string> dropped;   // members dropped by this call (failed, dead, left)
  std::vector<std::string> failures;  // one line per failed attempt, naming the problem
  uint64_t payload_bytes = 0;         // bytes of the packed stream (after the wire cast)
  double pack_seconds = 0;            // packing (and checksums)
  double transfer_seconds = 0;        // first manifest sent -> last acknowledgement
  double total_seconds = 0;           // whole call, including group re-formation
};

// Fault-injection hooks for tests (a named hook, not a mock; STYLE 14). Called on the
// receiver's thread.
struct ReceiverHooks {
  // After each bucket/chunk lands: version, bytes received so far, total bytes.
  std::function<void(uint64_t version, uint64_t received, uint64_t total)> on_progress;
};

}  // namespace troupe::broadcast
