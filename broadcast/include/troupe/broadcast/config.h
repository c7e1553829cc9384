// Weight-broadcast configuration: typed, torch-free, validated in one place.
//
// The learner side is described by BroadcastConfig, a rollout actor's side by
// ReceiverConfig. The launcher (which never includes torch) maps YAML onto
// these structs and calls Validate() before spawning anything. Everything a
// receiver must agree on with the learner (backend, algorithm, bucket and
// chunk sizes, wire dtype, checksums, collective timeout) is decided by the
// learner and sent to receivers on the wire (BroadcastGroup, WeightsManifest),
// so receivers cannot be misconfigured against their learner.
//
// Plain value types; not synchronised (copy them, don't share them mutably).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/broadcast/adapter_layout.h"
#include "troupe/core/status.h"

namespace troupe::config {
class Binder;
}

namespace troupe::broadcast {

// How the bytes travel. See docs/broadcast.md for each backend's protocol.
enum class Backend {
  kGloo,  // libtorch c10d ProcessGroupGloo over TCP; the default on CPU
  kNccl,  // NCCL between GPUs (built only when CUDA + NCCL are found)
  kZmq,   // chunked ZeroMQ transfer; any network, any membership
  kShm,   // one copy into POSIX shared memory that local receivers map
};
const char* BackendName(Backend backend);
Result<Backend> ParseBackend(std::string_view name);
// True when this build contains the backend (nccl needs CUDA + NCCL at build time).
bool BackendCompiled(Backend backend);

// Dtype of floating-point tensors on the wire.
enum class WireDtype {
  kAsStored,  // every tensor travels in its own dtype (bit-exact)
  kBFloat16,  // float32 tensors travel as bfloat16 (half the bytes); receivers cast back
};
const char* WireDtypeName(WireDtype dtype);
Result<WireDtype> ParseWireDtype(std::string_view name);

// Data path of the gloo backend.
enum class GlooAlgorithm {
  kChain,      // pipelined chain over gloo send/recv: the learner's link carries each byte once
  kBroadcast,  // ProcessGroupGloo::broadcast per bucket (gloo's own algorithm, see docs)
};
const char* GlooAlgorithmName(GlooAlgorithm algorithm);
Result<GlooAlgorithm> ParseGlooAlgorithm(std::string_view name);

// Data path of the zmq backend.
enum class ZmqTopology {
  kChain,  // learner -> r1 -> r2 -> ... relayed chunk by chunk (each byte once on every link)
  kStar,   // learner sends every chunk to every receiver (K copies on the learner's link)
};
const char* ZmqTopologyName(ZmqTopology topology);
Result<ZmqTopology> ParseZmqTopology(std::string_view name);

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

// Learner side (WeightSender).
struct BroadcastConfig {
  // Transport of the weights; gloo is the CPU default, nccl needs GPUs, shm local receivers only.
  Backend backend = Backend::kGloo;
  // Tensors are packed back to back into one flat stream cut into buckets of this size:
  // the unit of a collective call and of a checksum. Larger = fewer calls, more latency. 32 MiB.
  uint64_t bucket_bytes = 32 * kMiB;
  // Pipelining unit of the chain paths (zmq frames, gloo send/recv); a multiple of 8 (chunks
  // go out without a copy). Smaller = lower per-hop latency on a chain, more per-message
  // overhead; keep ZeroMQ frames at a few MiB. 1 MiB.
  uint64_t chunk_bytes = 1 * kMiB;
  // Down-cast float32 to bfloat16 on the wire (receivers cast back). Default: as stored.
  WireDtype wire_dtype = WireDtype::kAsStored;
  // Add a 64-bit checksum per bucket; receivers verify it and reject corrupted weights.
  // Costs one extra read pass on each side. Default off.
  bool checksum = false;
  // A broadcast step (collective, chunk, ack, group formation) that makes no progress for this
  // long fails; the group is re-formed without the members that did not answer. 10 s.
  int64_t timeout_ms = 10000;
  // The learner pings every receiver this often (receivers ping back on their own interval).
  int64_t heartbeat_ms = 500;
  // A receiver silent for this long is dropped from the next epoch. Keep it above timeout_ms:
  // a receiver blocked in a failing collective cannot ping. 15 s.
  int64_t member_timeout_ms = 15000;
  // Attempts per Broadcast() call: a failed attempt re-forms the group and retries if the
  // deadline allows. 1 = never retry. Default 2.
  int max_attempts = 2;
  // Where the learner's control socket binds (tcp://host:port with port 0 = pick one, or
  // ipc://path). Receivers connect here. Default tcp://127.0.0.1:0.
  std::string control_endpoint = "tcp://127.0.0.1:0";
  // Address the gloo rendezvous store binds (a transport socket on the learner's network, a
  // fresh port per epoch; its endpoint travels only in BroadcastGroup). The learner's bind
  // address; 127.0.0.1.
  std::string store_host = "127.0.0.1";
  // Address the learner's gloo device binds (must be reachable by receivers; never a
  // wildcard). 127.0.0.1.
  std::string gloo_hostname = "127.0.0.1";
  // gloo and nccl move the bytes over connections that nothing authenticates or encrypts
  // (c10d/Gloo pairs, NCCL sockets): a host that reaches them can read the weights or inject
  // its own. The launcher refuses either across nodes with CURVE on unless the matching key is
  // true, i.e. you accept that on your network. zmq and shm are covered by CURVE. Default
  // false. (Not read by the sender: the decision is the launcher's, which knows the hosts.)
  bool allow_unauthenticated_gloo = false;
  bool allow_unauthenticated_nccl = false;
  // gloo data path: chain (default; each byte once on the learner's link) or broadcast.
  GlooAlgorithm gloo_algorithm = GlooAlgorithm::kChain;
  // zmq data path: chain (default) or star (K copies from the learner; for comparison).
  ZmqTopology zmq_topology = ZmqTopology::kChain;
  // CUDA device of the learner for the nccl backend. 0.
  int nccl_device = 0;
  // Name prefix of the shm backend's POSIX shared-memory segments ("/troupe-w"). The
  // learner's pid and a counter are appended; stale segments of dead learners are removed.
  std::string shm_prefix = "/troupe-w";
  // ZeroMQ send/receive high-water mark in chunks per data socket: bounds the memory a slow
  // hop can pin (hwm x chunk_bytes); deeper queues ride out scheduling hiccups along a
  // chain. 16.
  int zmq_hwm_chunks = 16;
  // Node name compared with receivers' for shm locality; empty = this host's name.
  std::string node;
  // Name of the learner in logs and on the wire; empty = the network's actor id. Empty.
  std::string actor_id;
  // The LoRA adapters this learner trains (rank 0: full weights); receivers whose declared
  // layout differs are refused at registration (adapter_layout.h). Not a YAML key: the
  // learner sets it from the job's model. Default undeclared (no check).
  AdapterLayout adapters;

  Status Validate() const;
};

// Rollout-actor side (WeightReceiver).
struct ReceiverConfig {
  // Unique id of this receiver within the job ("rollout-3"); empty = the network's actor id.
  std::string actor_id;
  // The learner's control endpoint (WeightSender::endpoint()). Required.
  std::string learner_endpoint;
  // Where this receiver's data socket binds (zmq chain/star and newcomer catch-up). Must be a
  // concrete address the learner and peers can reach; port 0 = pick one. tcp://127.0.0.1:0.
  std::string data_endpoint = "tcp://127.0.0.1:0";
  // Address this receiver's gloo device binds (reachable by its chain neighbours). 127.0.0.1.
  std::string gloo_hostname = "127.0.0.1";
  // CUDA device for the nccl backend. 0.
  int nccl_device = 0;
  // Liveness ping to the learner (also the Register retry interval). 500 ms.
  int64_t heartbeat_ms = 500;
  // A learner silent for this long is presumed gone: the receiver forgets its group and
  // registers again (with a restarted learner when one comes up). A learner that exits
  // cleanly says so at once; this bounds the wait after a crash. 15 s.
  int64_t learner_timeout_ms = 15000;
  // shm backend, sink mode: hand the sink views over the shared segment (no copy; valid only
  // until the sink returns). Off: copy into receiver-owned memory first. Default on.
  bool shm_zero_copy = true;
  // Verify bucket checksums when the learner sends them. Default on.
  bool verify_checksums = true;
  // ZeroMQ high-water mark in chunks for the data sockets (see BroadcastConfig). 16.
  int zmq_hwm_chunks = 16;
  // Node name sent to the learner for shm locality; empty = this host's name.
  std::string node;
  // Largest weight stream accepted: bounds the memory a (faulty) peer can make us allocate.
  // 64 GiB.
  uint64_t max_bytes = uint64_t{64} << 30;
  // The LoRA adapters this receiver's engine applies (rank 0: no lora config), sent with
  // every Register; a learner training other adapters refuses it there (adapter_layout.h).
  // Not a YAML key: the rollout actor sets it from its engine's model. Default undeclared.
  AdapterLayout adapters;

  Status Validate() const;
};

// The YAML keys of these structs, each documented once (troupe/core/config_binder.h; the
// launcher binds job files with them, `troupe config-keys` lists them).
void Describe(config::Binder& b, BroadcastConfig& c);

}  // namespace troupe::broadcast
