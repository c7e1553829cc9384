// Messages of the weight broadcast, as plain structs, and their encoding as
// transport messages (wire::Envelope, transport/schema/troupe.capnp). Every
// message travels on a transport::Socket, so framing, CURVE, size limits and
// the validation of every pointer happen in the transport; Decode() only maps a
// validated InMessage onto these structs and checks what the schema cannot
// (counts, the kinds this channel takes). It never throws. Torch-free.
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
//   data sockets         WeightsChunk     one chunk; its bytes are the `payload` tensor
//   rendezvous socket    StoreRequest / StoreReply   gloo's key-value store (gloo_path.cc)
//
// Every message names its sender (the actor id) and the sender's broadcast
// incarnation (random per WeightSender / WeightReceiver), set here rather
// than by the network, so a sender or receiver re-created inside one process
// is a new incarnation to its peers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/broadcast/adapter_layout.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/status.h"
#include "troupe/transport/message.h"
#include "troupe/transport/tensor.h"

namespace troupe::broadcast::proto {

enum class Kind {
  kRegister,
  kHeartbeat,
  kGroup,
  kManifest,
  kAck,
  kChunk,
  kStoreRequest,
  kStoreReply
};
const char* KindName(Kind kind);

struct RegisterMsg {
  std::string node;  // host the receiver runs on (shm locality)
  int32_t pid = 0;
  std::string data_endpoint;  // where its data socket listens
  uint64_t version = 0;       // version it holds (from any learner), 0 = none
  AdapterLayout adapters;     // what its engine applies (checked at registration)
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
  std::string store_address;           // gloo: this epoch's rendezvous endpoint
  std::string store_prefix;            // gloo: this epoch's secret key prefix
  std::string nccl_id;                 // raw ncclUniqueId bytes (nccl)
  uint32_t timeout_ms = 0;
  std::string algorithm;  // "chain", "broadcast", "star", "shm"
};

struct ManifestMsg {
  Layout layout;  // layout.transfer = group epoch or catch-up id
  std::string shm_segment;
  uint64_t shm_offset = 0;
  uint64_t shm_generation = 0;
};

// Receiver -> learner: a transfer's outcome. Learner -> receiver, with version = transfer = 0
// and !ok: its Register was refused (reason names the mismatch); it does not join.
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
  uint64_t token = 0;  // the transfer's chunk token (from its manifest)
  // Received chunks: the payload, a view into the message's frame (valid while it lives).
  transport::TensorView payload;
  // Absolute offset in the stream; false on overflow.
  bool Absolute(uint64_t bucket_bytes, uint64_t* out) const;
};

enum class StoreOp { kSet, kGet, kAdd, kCheck, kWait, kDeleteKey, kNumKeys, kCompareSet };

struct StoreRequestMsg {
  uint64_t id = 0;
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;
  std::string value;     // set, compareSet (bytes)
  std::string expected;  // compareSet
  int64_t delta = 0;     // add
  uint32_t timeout_ms = 0;
};

struct StoreReplyMsg {
  uint64_t id = 0;
  bool ok = true;
  std::string error;
  std::string value;
  int64_t number = 0;
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
  StoreRequestMsg store_request;
  StoreReplyMsg store_reply;
};

struct Header {
  std::string sender;
  uint64_t incarnation = 0;
};

transport::OutMessage EncodeRegister(const Header& h, const RegisterMsg& m);
transport::OutMessage EncodeHeartbeat(const Header& h, const HeartbeatMsg& m);
transport::OutMessage EncodeGroup(const Header& h, const GroupMsg& m);
transport::OutMessage EncodeManifest(const Header& h, const ManifestMsg& m);
transport::OutMessage EncodeAck(const Header& h, const AckMsg& m);
// `payload`: the chunk's bytes, referenced without a copy (see TensorBytes).
Result<transport::OutMessage> EncodeChunk(const Header& h, const ChunkMsg& m,
                                          transport::TensorBytes payload);
transport::OutMessage EncodeStoreRequest(const Header& h, const StoreRequestMsg& m);
transport::OutMessage EncodeStoreReply(const Header& h, const StoreReplyMsg& m);

// Maps a message the transport validated onto the structs. Errors (kProtocol) name the
// problem: a kind the broadcast does not use, a Register whose actor id is not its sender,
// a manifest or group over the limits, a chunk without its payload.
Result<Message> Decode(const transport::InMessage& in);

// Limits on what one control message may make us hold.
inline constexpr uint64_t kMaxControlMessageBytes = uint64_t{64} << 20;
inline constexpr size_t kMaxMembers = size_t{1} << 16;
inline constexpr size_t kMaxText = 4096;

}  // namespace troupe::broadcast::proto
