// Names and validation of the broadcast config (config.h). Torch-free.
#include "troupe/broadcast/config.h"

#include <cctype>
#include "troupe/core/config_binder.h"

namespace troupe::broadcast {
namespace {

constexpr uint64_t kMinBucket = 4096;
constexpr uint64_t kMaxBucket = uint64_t{4} << 30;
constexpr uint64_t kMinChunk = 4096;
constexpr uint64_t kMaxChunk = uint64_t{256} << 20;

// "tcp://host:port" with a concrete host, or "ipc://path" / "inproc://name".
Status CheckEndpoint(std::string_view field, const std::string& ep, bool allow_wildcard) {
  if (ep.rfind("ipc://", 0) == 0) {
    if (ep.size() <= 6) return InvalidArgument("{} '{}' has an empty ipc path", field, ep);
    return Status::Ok();
  }
  if (ep.rfind("inproc://", 0) == 0) return Status::Ok();
  if (ep.rfind("tcp://", 0) != 0)
    return InvalidArgument("{} '{}' must start with tcp://, ipc:// or inproc://", field, ep);
  auto colon = ep.rfind(':');
  if (colon == std::string::npos || colon <= 6)
    return InvalidArgument("{} '{}' needs host:port", field, ep);
  std::string host = ep.substr(6, colon - 6);
  std::string port = ep.substr(colon + 1);
  if (host.empty()) return InvalidArgument("{} '{}' has an empty host", field, ep);
  if (!allow_wildcard && (host == "*" || host == "0.0.0.0"))
    return InvalidArgument(
        "{} '{}' binds a wildcard; give the concrete address peers should connect to", field, ep);
  if (port.empty() || port.size() > 5)
    return InvalidArgument("{} '{}' has a bad port '{}'", field, ep, port);
  for (char c : port)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return InvalidArgument("{} '{}' has a bad port '{}'", field, ep, port);
  if (std::stoi(port) > 65535) return InvalidArgument("{} '{}' port above 65535", field, ep);
  return Status::Ok();
}

Status CheckActorId(std::string_view field, const std::string& id) {
  if (id.empty() || id.size() > 200)
    return InvalidArgument("{} must have 1..200 characters, got {}", field, id.size());
  for (char c : id)
    if (!std::isgraph(static_cast<unsigned char>(c)))
      return InvalidArgument("{} '{}' contains a space or control character", field, id);
  return Status::Ok();
}

Status CheckPositive(std::string_view field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) return InvalidArgument("{} = {} outside [{}, {}]", field, v, lo, hi);
  return Status::Ok();
}

}  // namespace

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
    case Backend::kZmq:
      return "zmq";
    case Backend::kShm:
      return "shm";
  }
  return "?";
}

Result<Backend> ParseBackend(std::string_view name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  if (name == "zmq") return Backend::kZmq;
  if (name == "shm") return Backend::kShm;
  return InvalidArgument("unknown broadcast backend '{}' (gloo, nccl, zmq, shm)", name);
}

bool BackendCompiled(Backend b) {
  // TROUPE_BROADCAST_NCCL_BUILT (0 or 1) comes from broadcast/CMakeLists.txt.
  return b != Backend::kNccl || TROUPE_BROADCAST_NCCL_BUILT != 0;
}

const char* WireDtypeName(WireDtype d) {
  return d == WireDtype::kBFloat16 ? "bfloat16" : "as_stored";
}

Result<WireDtype> ParseWireDtype(std::string_view name) {
  if (name == "as_stored" || name == "float32" || name == "native") return WireDtype::kAsStored;
  if (name == "bfloat16" || name == "bf16") return WireDtype::kBFloat16;
  return InvalidArgument("unknown wire dtype '{}' (as_stored, bfloat16)", name);
}

const char* GlooAlgorithmName(GlooAlgorithm a) {
  return a == GlooAlgorithm::kChain ? "chain" : "broadcast";
}

Result<GlooAlgorithm> ParseGlooAlgorithm(std::string_view name) {
  if (name == "chain") return GlooAlgorithm::kChain;
  if (name == "broadcast") return GlooAlgorithm::kBroadcast;
  return InvalidArgument("unknown gloo algorithm '{}' (chain, broadcast)", name);
}

const char* ZmqTopologyName(ZmqTopology t) {
  return t == ZmqTopology::kChain ? "chain" : "star";
}

Result<ZmqTopology> ParseZmqTopology(std::string_view name) {
  if (name == "chain") return ZmqTopology::kChain;
  if (name == "star") return ZmqTopology::kStar;
  return InvalidArgument("unknown zmq topology '{}' (chain, star)", name);
}

Status BroadcastConfig::Validate() const {
  if (!BackendCompiled(backend))
    return InvalidArgument(
        "broadcast backend '{}' is not built in (CUDA + NCCL were not found at build time)",
        BackendName(backend));
  if (bucket_bytes < kMinBucket || bucket_bytes > kMaxBucket)
    return InvalidArgument("bucket_bytes = {} outside [{}, {}]", bucket_bytes, kMinBucket,
                           kMaxBucket);
  if (chunk_bytes < kMinChunk || chunk_bytes > kMaxChunk)
    return InvalidArgument("chunk_bytes = {} outside [{}, {}]", chunk_bytes, kMinChunk, kMaxChunk);
  if (chunk_bytes % 8 != 0)
    return InvalidArgument("chunk_bytes = {} is not a multiple of 8 (chunks are sent in place)",
                           chunk_bytes);
  TROUPE_RETURN_IF_ERROR(CheckPositive("timeout_ms", timeout_ms, 10, 3600 * 1000));
  TROUPE_RETURN_IF_ERROR(CheckPositive("heartbeat_ms", heartbeat_ms, 1, 600 * 1000));
  TROUPE_RETURN_IF_ERROR(
      CheckPositive("member_timeout_ms", member_timeout_ms, 2 * heartbeat_ms, 3600 * 1000));
  TROUPE_RETURN_IF_ERROR(CheckPositive("max_attempts", max_attempts, 1, 100));
  TROUPE_RETURN_IF_ERROR(CheckPositive("zmq_hwm_chunks", zmq_hwm_chunks, 1, 1024));
  TROUPE_RETURN_IF_ERROR(CheckEndpoint("control_endpoint", control_endpoint, true));
  if (store_host.empty()) return InvalidArgument("store_host is empty");
  if (gloo_hostname.empty()) return InvalidArgument("gloo_hostname is empty");
  if (nccl_device < 0) return InvalidArgument("nccl_device = {} is negative", nccl_device);
  if (shm_prefix.size() < 2 || shm_prefix[0] != '/' ||
      shm_prefix.find('/', 1) != std::string::npos || shm_prefix.size() > 100)
    return InvalidArgument("shm_prefix '{}' must be '/name' (no further '/', at most 100 chars)",
                           shm_prefix);
  if (!actor_id.empty()) TROUPE_RETURN_IF_ERROR(CheckActorId("actor_id", actor_id));
  return Status::Ok();
}

Status ReceiverConfig::Validate() const {
  if (!actor_id.empty()) TROUPE_RETURN_IF_ERROR(CheckActorId("actor_id", actor_id));
  if (learner_endpoint.empty()) return InvalidArgument("learner_endpoint is empty");
  TROUPE_RETURN_IF_ERROR(CheckEndpoint("learner_endpoint", learner_endpoint, false));
  TROUPE_RETURN_IF_ERROR(CheckEndpoint("data_endpoint", data_endpoint, false));
  if (gloo_hostname.empty()) return InvalidArgument("gloo_hostname is empty");
  if (nccl_device < 0) return InvalidArgument("nccl_device = {} is negative", nccl_device);
  TROUPE_RETURN_IF_ERROR(CheckPositive("heartbeat_ms", heartbeat_ms, 1, 600 * 1000));
  TROUPE_RETURN_IF_ERROR(
      CheckPositive("learner_timeout_ms", learner_timeout_ms, 2 * heartbeat_ms, 3600 * 1000));
  TROUPE_RETURN_IF_ERROR(CheckPositive("zmq_hwm_chunks", zmq_hwm_chunks, 1, 1024));
  if (max_bytes < (uint64_t{1} << 20))
    return InvalidArgument("max_bytes = {} below 1 MiB", max_bytes);
  return Status::Ok();
}

// Describe(): the YAML keys of the config structs, one documented line each
// (troupe/core/config_binder.h).
using config::Binder;
using config::EnumField;

void Describe(Binder& b, BroadcastConfig& c) {
  EnumField<Backend>(
      b, "backend", &c.backend, "gloo | nccl | zmq | shm",
      [](Backend x) { return std::string(BackendName(x)); }, ParseBackend);
  b.Field("bucket_bytes", &c.bucket_bytes, "bucket size tensors are packed into");
  b.Field("chunk_bytes", &c.chunk_bytes, "pipelining unit of the chain paths");
  EnumField<WireDtype>(
      b, "wire_dtype", &c.wire_dtype, "float32 on the wire: as_stored | bfloat16",
      [](WireDtype x) { return std::string(WireDtypeName(x)); }, ParseWireDtype);
  b.Field("checksum", &c.checksum, "64-bit checksum per bucket, verified by receivers");
  b.Field("timeout_ms", &c.timeout_ms,
          "a broadcast step without progress this long fails; the group re-forms");
  b.Field("heartbeat_ms", &c.heartbeat_ms, "learner <-> receiver ping interval");
  b.Field("member_timeout_ms", &c.member_timeout_ms,
          "a silent receiver is dropped from the next epoch");
  b.Field("max_attempts", &c.max_attempts, "attempts per broadcast (re-forming the group between)");
  EnumField<GlooAlgorithm>(
      b, "gloo_algorithm", &c.gloo_algorithm, "gloo data path: chain | broadcast",
      [](GlooAlgorithm x) { return std::string(GlooAlgorithmName(x)); }, ParseGlooAlgorithm);
  EnumField<ZmqTopology>(
      b, "zmq_topology", &c.zmq_topology, "zmq data path: chain | star",
      [](ZmqTopology x) { return std::string(ZmqTopologyName(x)); }, ParseZmqTopology);
  b.Field("nccl_device", &c.nccl_device, "CUDA device of the learner (nccl)");
  b.Field("zmq_hwm_chunks", &c.zmq_hwm_chunks, "ZeroMQ high-water mark in chunks per data socket");
  b.Field("allow_unauthenticated_gloo", &c.allow_unauthenticated_gloo,
          "run gloo across nodes with CURVE on anyway: its TCP pairs are neither authenticated nor "
          "encrypted (a host that reaches them can read or inject weights)");
  b.Field("allow_unauthenticated_nccl", &c.allow_unauthenticated_nccl,
          "run nccl across nodes with CURVE on anyway: NCCL's connections are neither "
          "authenticated nor encrypted (a host that reaches them can read or inject weights)");
}

}  // namespace troupe::broadcast
