// The zmq backend: the weight stream in chunks over transport sockets
// (chunk_stream.h), so it is CURVE-encrypted and authenticated whenever the
// job's network is, on any network and with any membership.
//
// Topologies (config zmq_topology):
//   chain  learner -> r1 -> r2 -> ...: each member forwards every chunk (the
//          received frame, no copy) to its successor as soon as it has it, so
//          every link carries each byte once. A member whose relay fails keeps
//          its own copy; the learner re-forms the chain without the dead hop.
//   star   the learner sends every chunk to every member (K copies on its link).
// Nothing to form per epoch beyond the relay socket to the successor.
#pragma once

#include <memory>

#include "data_path.h"

namespace troupe::broadcast {

Result<std::unique_ptr<SenderPath>> NewZmqSenderPath(const SenderContext& context);
Result<std::unique_ptr<ReceiverPath>> NewZmqReceiverPath(const ReceiverContext& context);

}  // namespace troupe::broadcast
