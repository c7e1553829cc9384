// WeightSender: the learner's side of the weight broadcast.
//
//   learner ══ Broadcast(version, named) ══▶ every rollout actor's WeightReceiver
//
// The sender owns the broadcast group: the learner (rank 0) plus the current
// receivers, versioned by an epoch. Receivers register on the control socket
// (endpoint()). A newcomer first gets the full current weights over ZeroMQ
// (catch-up), then joins the group at the next epoch. A receiver that leaves,
// stops answering, or fails a transfer is dropped at the next epoch. Every
// step is bounded: a member killed mid-broadcast makes that attempt fail
// within config.timeout_ms; the group is re-formed without it and (within
// max_attempts and the deadline) the version is sent again to the rest.
//
// Every socket (control, data, the gloo rendezvous) comes from the
// transport::Network it is given: the learner actor's own network, so CURVE,
// size limits and TransportCounters are shared with its other sockets. The
// data path is the backend's (data_path.h); this class keeps membership,
// epochs, catch-up and acknowledgements. A receiver is known by its actor id
// *and* its connection: a second connection claiming the id of a live member
// is refused and counted (it cannot take the member's place), the member stays. A
// receiver whose declared adapters (ReceiverConfig::adapters) do not match
// config.adapters is refused at registration with the mismatch, logged and counted
// (receivers_refused); it never joins, and the group goes on without it.
//
// Threading: one internal service thread owns all sockets and the process
// group; it answers registrations, heartbeats and catch-ups even while the
// learner trains. Public methods are thread-safe; Broadcast calls are
// serialised. The destructor stops the thread, closes every socket, aborts or
// reaps the group and unlinks shared memory (bounded by the timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/broadcast/config.h"
#include "troupe/broadcast/types.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::transport {
class Network;
}

namespace troupe::broadcast {

// What the learner knows about one receiver.
struct MemberInfo {
  std::string id;
  std::string node;
  std::string state;     // "catching-up", "ready" (waiting for the next epoch), "member"
  uint64_t version = 0;  // version of this learner it acknowledged last (0: none yet)
};

struct SenderStats {
  uint64_t broadcasts_ok = 0;      // Broadcast calls that reached every member
  uint64_t broadcasts_failed = 0;  // calls that returned an error
  uint64_t attempts_failed = 0;    // failed attempts (a call may retry)
  uint64_t catch_ups = 0;          // newcomer catch-ups completed
  uint64_t epochs = 0;             // groups formed
  uint64_t members_dropped = 0;    // receivers removed for failing, dying or leaving
  // Payload bytes the learner handed to its transport: once per destination for zmq, once
  // per transfer for gloo/nccl (gloo's own broadcast then sends more: a tree from the root).
  uint64_t bytes_sent = 0;
  // Well-formed messages refused on the control socket (a kind it does not take, a sender
  // whose connection does not match) — also counted as rejected.unexpected in the network's
  // TransportCounters.
  uint64_t refused = 0;
  // Registrations refused because another live connection holds that receiver id.
  uint64_t takeovers_refused = 0;
  // Registrations refused because the receiver's engine cannot apply this learner's adapters
  // (BroadcastConfig::adapters vs its declared layout), and the last such reason ("rollout-2:
  // learner trains LoRA r=16 ...; engine has no lora config").
  uint64_t receivers_refused = 0;
  std::string last_refusal;
};

class WeightSender {
 public:
  // Validates `config`, binds the control socket on `network` and starts the service
  // thread. `network` is borrowed and must outlive the sender. An empty config.actor_id
  // means the network's actor id. Errors: bad config, endpoint in use, backend unavailable.
  static Result<std::unique_ptr<WeightSender>> Create(const BroadcastConfig& config,
                                                      transport::Network& network);
  ~WeightSender();
  WeightSender(const WeightSender&) = delete;
  WeightSender& operator=(const WeightSender&) = delete;

  // Resolved control endpoint receivers connect to (port 0 replaced).
  const std::string& endpoint() const;
  // Random id of this sender process incarnation (receivers re-sync when it changes).
  uint64_t incarnation() const;

  // Sends `version` of the weights to every member and returns once each acknowledged it
  // (or with an error). Blocks the caller; may return Timeout at the deadline, Unavailable
  // when members failed on every attempt, InvalidArgument for bad tensors or a version not
  // above the previous one. Membership changes pending at the call are applied first (a new
  // epoch). The tensors are read during the call only. Even on error the version becomes
  // the "current weights" newcomers are caught up with.
  Status Broadcast(uint64_t version, const NamedTensors& named, Deadline deadline);

  // Adapter-only broadcasts (LoRA). `base`: tensors every receiver needs once, which the
  // caller does not change while they are set (a frozen base; the handles are kept, the
  // data read when sent). The next Broadcast carries base + its own tensors to the group,
  // until one such broadcast reached every member; later ones carry only their own
  // tensors. A newcomer's catch-up carries base + the current tensors in one transfer.
  // Calling it again replaces the base (it is sent again). Errors: empty/duplicate names,
  // undefined tensors. Thread-safe.
  Status SetBase(const NamedTensors& base);

  // Details of the last Broadcast call.
  BroadcastReport last_report() const;

  // Blocks until at least `count` receivers are members of a formed group (or the
  // deadline: Timeout naming how many there are).
  Status WaitForMembers(size_t count, Deadline deadline);

  std::vector<MemberInfo> Members() const;
  uint64_t epoch() const;
  uint64_t version() const;  // last version passed to Broadcast (0: none)
  SenderStats stats() const;

  class Impl;

 private:
  explicit WeightSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::broadcast
