// Control-plane messages of the weight broadcast, as plain structs, and their
// Cap'n Proto encoding (wire::Envelope). Decoding copies everything it needs
// out of the message inside one try block, so malformed bytes become a
// Status, never an exception or a crash. Torch-free.
//
// Reuse of the shared wire messages (see docs/broadcast.md, "Protocol"):
//   receiver -> learner  Register         join (or re-join) the broadcast group
//                        Heartbeat        liveness; state draining = leave request,
//                                         exited = going away now
//                        BroadcastGroup   echo {epoch}: "I accept epoch e"
//                        Ack              seqs = [version, transfer]; rejected = failure reason
//   learner -> receiver  Heartbeat        keepalive (policyVersion = learner's version);
//                                         state lost = "I do not know you: register"
//                        BroadcastGroup   the group of an epoch (members, endpoints, store, ...)
//                        WeightsManifest  a transfer begins (epoch = transfer id)
//   data sockets         WeightsChunk     header frame; the payload follows as its own frame
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/broadcast/layout.h"
#include "troupe/core/status.h"

namespace troupe::broadcast::proto {

enum class Kind { kRegister, kHeartbeat, kGroup, kManifest, kAck, kChunk };

struct RegisterMsg {
  std::string node;  // host the receiver runs on (shm locality)
  int32_t pid = 0;
  std::string data_endpoint;  // where its data socket listens
  uint64_t version = 0;       // version it holds (from any learner), 0 = none
};

// kUnknown (wire: lost) is the learner telling a sender it does not know: register again.
enum class PeerState { kAlive, kLeaving, kExited, kUnknown };

struct HeartbeatMsg {
  PeerState state = PeerState::kAlive;
  uint64_t version = 0;
};

struct GroupMsg {
  uint64_t epoch = 0;
  std::string backend;
  std::vector<std::string> members;    // index = rank; rank 0 is the learner
  std::vector<std::string> endpoints;  // data endpoint per rank ("" for the learner)
  std::string store_address;           // host:port of the TCPStore (gloo)
  std::string nccl_id;                 // raw ncclUniqueId bytes (nccl)
  uint32_t timeout_ms = 0;
  std::string algorithm;  // "chain", "broadcast", "star"
};

struct ManifestMsg {
  Layout layout;  // layout.transfer = group epoch or catch-up id
  std::string shm_segment;
  uint64_t shm_offset = 0;
  uint64_t shm_generation = 0;
};

struct AckMsg {
  uint64_t version = 0;
  uint64_t transfer = 0;
  bool ok = true;
  std::string reason;  // set when !ok
};

struct ChunkMsg {
  uint64_t version = 0;
  uint64_t transfer = 0;
  uint32_t bucket = 0;         // bucket the chunk starts in
  uint64_t bucket_offset = 0;  // offset inside that bucket
  bool last = false;
  // Absolute offset in the stream; false on overflow.
  bool Absolute(uint64_t bucket_bytes, uint64_t* out) const;
};

struct Message {
  std::string sender;
  uint64_t incarnation = 0;
  Kind kind = Kind::kHeartbeat;
  RegisterMsg reg;
  HeartbeatMsg heartbeat;
  GroupMsg group;
  ManifestMsg manifest;
  AckMsg ack;
  ChunkMsg chunk;
};

// Encoded bytes of one Envelope.
using Bytes = std::string;

struct Header {
  std::string sender;
  uint64_t incarnation = 0;
};

Bytes EncodeRegister(const Header& h, const RegisterMsg& m);
Bytes EncodeHeartbeat(const Header& h, const HeartbeatMsg& m);
Bytes EncodeGroup(const Header& h, const GroupMsg& m);
Bytes EncodeManifest(const Header& h, const ManifestMsg& m);
Bytes EncodeAck(const Header& h, const AckMsg& m);
Bytes EncodeChunk(const Header& h, const ChunkMsg& m);

// Decodes one Envelope. Errors name what is wrong (schema version, unknown or unexpected
// kind, limits, undecodable bytes).
Result<Message> Decode(const void* data, size_t size);

}  // namespace troupe::broadcast::proto
