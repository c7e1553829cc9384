// The gloo backend (libtorch c10d ProcessGroupGloo over TCP): the CPU default.
//
// Every epoch forms a fresh ProcessGroupGloo through that epoch's rendezvous
// store (rendezvous.h: served by the learner over the transport, fresh port and
// secret prefix per epoch), with Options::timeout = the group timeout, so a
// group broken by a dead member is simply dropped (destroyed on the Reaper) and
// the next epoch starts clean. Each rank's gloo device binds the address it is
// given (config gloo_hostname: the actor's bind host), never a wildcard.
//
// Two data paths (config gloo_algorithm):
//   chain      chunked send/recv along ranks 0 -> 1 -> ... -> K; every member
//              posts all its receives up front and forwards a chunk the moment it
//              lands: each link (the learner's in particular) carries each byte once.
//   broadcast  ProcessGroupGloo::broadcast per bucket (gloo's own tree; kept for
//              comparison, see docs/broadcast.md).
//
// What gloo does not protect: its pair connections carry the bytes unencrypted
// and unauthenticated (anyone who reaches a member's gloo port can read or
// inject). docs/multinode.md says what that means across nodes; the launcher
// refuses gloo across nodes with CURVE on unless
// broadcast.allow_unauthenticated_gloo is set.
#pragma once

#include <memory>

#include "data_path.h"

namespace troupe::broadcast {

Result<std::unique_ptr<SenderPath>> NewGlooSenderPath(const SenderContext& context);
Result<std::unique_ptr<ReceiverPath>> NewGlooReceiverPath(const ReceiverContext& context);

}  // namespace troupe::broadcast
