// WeightReceiver: a rollout actor's side of the weight broadcast.
//
//   learner ══broadcast══▶ WeightReceiver ──sink(version, named)──▶ engine.UpdateWeights
//
// The receiver registers with the learner's WeightSender, gets the full
// current weights first (catch-up), then takes part in every broadcast of the
// group it is a member of. Each new version is delivered once, in order, with
// its number: the receiver always knows exactly which version it holds
// (version()). When the learner goes away it keeps its weights and registers
// again; a restarted learner (new incarnation) re-syncs it to that learner's
// version, even an older one.
//
// Delivery: either a sink (called on the receiver's thread; the version is
// acknowledged to the learner after it returns ok), or, without a sink,
// Receive() hands out the newest version not yet returned.
//
// Sockets (control client, data server, relay, rendezvous) come from the
// transport::Network it is given: the rollout actor's own network, so CURVE,
// size limits and TransportCounters are shared with its other sockets. Its
// control connection has an identity nobody else can guess
// ("<actor id>/<random>"), so no other peer can take its place at the learner.
// The data socket takes chunks only from the peer the protocol names for the
// transfer (the learner, or the predecessor on a chain); others are refused and
// counted (rejected.unexpected). Its Register declares the adapters its engine applies
// (config.adapters); a learner training others refuses it there (refusal()).
//
// Threading: one internal thread owns the sockets and the group and runs the
// sink. Public methods are thread-safe. The destructor tells the learner it is
// going (so no one waits a timeout for it), stops the thread and closes every
// socket.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/broadcast/config.h"
#include "troupe/broadcast/types.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::transport {
class Network;
}

namespace troupe::broadcast {

struct ReceiverStats {
  uint64_t delivered = 0;        // versions delivered (sink ok or queued for Receive)
  uint64_t catch_ups = 0;        // of which full catch-ups
  uint64_t rejected = 0;         // transfers that failed checks or the sink
  uint64_t aborted = 0;          // transfers abandoned (timeout, dead peer, newer epoch)
  uint64_t epochs = 0;           // groups joined
  uint64_t learner_changes = 0;  // learner incarnations seen after the first
  uint64_t bytes_received = 0;
  // Well-formed messages refused (wrong kind for the socket, chunks from a peer that is not
  // the transfer's sender) — also counted as rejected.unexpected in the TransportCounters.
  uint64_t refused = 0;
  // Times the learner refused our Register (our engine cannot apply its adapters).
  uint64_t refusals = 0;
};

class WeightReceiver {
 public:
  // Validates `config`, binds the data socket on `network`, connects to the learner and
  // starts the receiver thread. `network` is borrowed and must outlive the receiver; an
  // empty config.actor_id means the network's. `sink` may be null (use Receive). `hooks`
  // are for tests.
  static Result<std::unique_ptr<WeightReceiver>> Create(const ReceiverConfig& config,
                                                        transport::Network& network,
                                                        WeightsSink sink = nullptr,
                                                        ReceiverHooks hooks = {});
  ~WeightReceiver();
  WeightReceiver(const WeightReceiver&) = delete;
  WeightReceiver& operator=(const WeightReceiver&) = delete;

  // Resolved data endpoint (port 0 replaced).
  const std::string& data_endpoint() const;

  // Last version delivered (0: none yet).
  uint64_t version() const;
  // True once this receiver is a member of a formed group.
  bool in_group() const;

  // Without a sink: blocks until a version newer than the last one returned is available,
  // then returns the newest (older undelivered ones are skipped). Timeout at the deadline;
  // InvalidArgument when a sink was given.
  Result<ReceivedWeights> Receive(Deadline deadline);

  // Blocks until version() >= `version` (Timeout at the deadline; the refusal at once when
  // the learner refused us, see refusal()).
  Status WaitForVersion(uint64_t version, Deadline deadline);

  // Ok, or why the learner refused our Register (InvalidArgument: "refused by learner
  // learner-0: rollout-2: learner trains LoRA r=16 ...; engine has no lora config"). A refused
  // receiver never joins; it stops registering and asks again only after the learner went
  // silent for learner_timeout_ms (a restarted learner may take it). Receive and
  // WaitForVersion return it.
  Status refusal() const;

  // Leaves the group gracefully: the learner confirms by forming the next epoch without us
  // (an in-flight broadcast completes first). Blocks until confirmed or the deadline; the
  // receiver thread stops either way.
  Status Leave(Deadline deadline);

  ReceiverStats stats() const;

  class Impl;

 private:
  explicit WeightReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::broadcast
