// The backend seam of the weight broadcast: one data path per backend.
//
//   WeightSender (membership, epochs, catch-up, acks) ──SenderPath──▶ bytes ──▶
//   ──▶ ReceiverPath ── WeightReceiver (registration, epochs, delivery, acks)
//
// A data path moves the bytes of one version from the learner (rank 0) to the
// members of one epoch's group, and nothing else: it forms the group for an
// epoch, sends or receives a layout within a deadline, and aborts. The sender
// and receiver keep everything else (who is a member, epochs, manifests and
// acknowledgements on the control socket, newcomer catch-up over the chunk
// stream, checksums, the sink). Each backend is one file pair
// (gloo_path, nccl_path, zmq_path, shm_path) whose header declares its two
// factory functions; data_path.cc holds the table that maps Backend values to
// them (the only switch over backends, and the only #ifdef for NCCL).
//
// Threading: a path belongs to the thread of its WeightSender/WeightReceiver;
// no method is thread-safe. Calls that can block take a Deadline and an
// Interrupt, which the path calls every few milliseconds while it waits (the
// owner serves its control socket there) and which returns true to abandon
// the operation (Cancelled). Destroying a path never blocks on a failed
// group: it is handed to the Reaper.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "buffer_pool.h"
#include "protocol.h"
#include "reaper.h"
#include "troupe/broadcast/config.h"
#include "troupe/broadcast/layout.h"
#include "troupe/broadcast/types.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/text.h"
#include "troupe/transport/socket.h"

namespace troupe::broadcast {

class ChunkSender;
class ChunkReceiver;

// Called while a path blocks; true = abandon (the path returns Cancelled).
using Interrupt = std::function<bool()>;
// Receiving side: bytes of the version landed so far, and the total.
using Progress = std::function<void(uint64_t received, uint64_t total)>;

// A member of an epoch's group, as the sender sees it (rank = index + 1).
struct PathMember {
  std::string id;
  std::string node;
  std::string data_endpoint;
};

// Where one version is packed on the sender.
struct Stream {
  uint8_t* data = nullptr;
  std::shared_ptr<void> owner;  // keeps `data` alive (in-flight zero-copy sends hold it too)
};

// What a sender-side path may use. Borrowed; all outlive the path.
struct SenderContext {
  const BroadcastConfig* config = nullptr;
  transport::Network* network = nullptr;
  proto::Header header;           // the sender's actor id and broadcast incarnation
  std::string node;               // the learner's node (shm locality)
  ChunkSender* chunks = nullptr;  // the chunk stream to receivers' data sockets
  BufferPool* pool = nullptr;     // stream buffers
  Reaper* reaper = nullptr;       // destroys failed groups in the background
};

class SenderPath {
 public:
  virtual ~SenderPath() = default;
  // The backend's part of the announcement of `group->epoch` (rendezvous endpoint and secret,
  // communicator id, algorithm name). Called once per epoch, before the announcement.
  virtual Status Announce(proto::GroupMsg* group) = 0;
  // Forms the announced group as rank 0 (`members`: ranks 1..K). Blocks up to `deadline`.
  virtual Status Form(const proto::GroupMsg& group, const std::vector<PathMember>& members,
                      Deadline deadline, const Interrupt& interrupt) = 0;
  // Memory for the next version (`bytes` long); the sender packs it there.
  virtual Result<Stream> Acquire(uint64_t bytes) = 0;
  // The sender packed a version into the stream last returned by Acquire.
  virtual void Packed() {}
  // Fills what the manifest of the current version tells `member` (shm: the segment).
  virtual void Describe(const PathMember& member, proto::ManifestMsg* manifest) const {
    (void)member;
    (void)manifest;
  }
  // Moves the packed version (`layout`, in `stream`) to every member of the formed group.
  // Adds the payload bytes handed to the transport to *bytes_sent. Blocks up to `deadline`;
  // each step without progress fails within the config's timeout.
  virtual Status Send(const Layout& layout, const Stream& stream,
                      const std::vector<PathMember>& members, Deadline deadline,
                      const Interrupt& interrupt, uint64_t* bytes_sent) = 0;
  // Every member acknowledged a transfer of the current group: each of them formed it.
  virtual void Acknowledged() {}
  // Drops the current group (a broken one is destroyed in the background).
  virtual void Abort() = 0;
};

// What a receiver-side path may use. Borrowed; all outlive the path.
struct ReceiverContext {
  const ReceiverConfig* config = nullptr;
  transport::Network* network = nullptr;
  proto::Header header;             // the receiver's actor id and broadcast incarnation
  ChunkReceiver* chunks = nullptr;  // this receiver's data socket
  BufferPool* pool = nullptr;       // stream buffers
  Reaper* reaper = nullptr;
  bool zero_copy = false;  // the sink may take views into shared memory (shm)
};

// A version that arrived, before checksums and the sink.
struct Landed {
  const uint8_t* data = nullptr;
  std::shared_ptr<void> owner;          // keeps `data` alive; null for a shared segment
  const NamedTensors* views = nullptr;  // ready-made tensors over `data` (shm zero copy)
  uint64_t bytes_received = 0;          // bytes that came off a socket or a device (stats)
  // Re-checked after the sink returned (shm: the slot was not rewritten meanwhile).
  std::function<Status()> still_valid;
};

class ReceiverPath {
 public:
  virtual ~ReceiverPath() = default;
  // Joins the group announced in `group` as `rank` (>= 1). Blocks up to `deadline`.
  virtual Status Join(const proto::GroupMsg& group, int rank, Deadline deadline,
                      const Interrupt& interrupt) = 0;
  // Receives the version `manifest` describes. Fails within the group's timeout when no
  // progress is made, at once when `interrupt` says so (Cancelled).
  virtual Result<Landed> Receive(const proto::ManifestMsg& manifest, const Interrupt& interrupt,
                                 const Progress& progress) = 0;
  // True when a failed transfer leaves the group unusable (a collective): the receiver then
  // waits for the next epoch.
  virtual bool BreaksOnFailure() const = 0;
  // Leaves the group (a broken one is destroyed in the background).
  virtual void Abort() = 0;
};

// The factory (data_path.cc). Unavailable when `backend` is not built into this binary or
// cannot run here (nccl without the configured GPU).
Result<std::unique_ptr<SenderPath>> NewSenderPath(Backend backend, const SenderContext& context);
Result<std::unique_ptr<ReceiverPath>> NewReceiverPath(Backend backend,
                                                      const ReceiverContext& context);

// Small helpers shared by the sender, the receiver and the paths.
// `bytes` random bytes as lowercase hex (std::random_device).
std::string RandomHex(size_t bytes);
// A socket identity for `actor_id` that no other process can guess: "<actor_id>/<32 hex>".
std::string UnguessableIdentity(const std::string& actor_id);
// The actor id inside an identity made by UnguessableIdentity ("" when malformed).
std::string IdentityActor(const std::string& identity);
// Milliseconds left before `deadline`, at least 1 and at most `cap`.
std::chrono::milliseconds Budget(Deadline deadline, std::chrono::milliseconds cap);

}  // namespace troupe::broadcast
