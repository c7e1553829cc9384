// Cap'n Proto encoding of the broadcast control messages (protocol.h).
#include "protocol.h"

#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "troupe/core/deadline.h"
#include "troupe/wire/troupe.capnp.h"

namespace troupe::broadcast::proto {
namespace {

// Upper bounds on what a peer may make us decode.
constexpr size_t kMaxMessageBytes = size_t{256} << 20;
constexpr size_t kMaxMembers = 1 << 16;
constexpr size_t kMaxSlots = size_t{1} << 22;
constexpr size_t kMaxText = 4096;

wire::Envelope::Builder Start(capnp::MallocMessageBuilder& mb, const Header& h) {
  auto env = mb.initRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  env.setSender(h.sender);
  env.setIncarnation(h.incarnation);
  env.setSendTimeNs(WallTimeNs());
  return env;
}

Bytes Finish(capnp::MallocMessageBuilder& mb) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return Bytes(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

std::string Text(capnp::Text::Reader t, const char* field) {
  if (t.size() > kMaxText)
    throw std::length_error(fmt::format("{} longer than {}", field, kMaxText));
  return std::string(t.cStr(), t.size());
}

}  // namespace

bool ChunkMsg::Absolute(uint64_t bucket_bytes, uint64_t* out) const {
  uint64_t base = static_cast<uint64_t>(bucket) * bucket_bytes;
  if (bucket_bytes != 0 && base / bucket_bytes != bucket) return false;
  if (base + bucket_offset < base) return false;
  *out = base + bucket_offset;
  return true;
}

Bytes EncodeRegister(const Header& h, const RegisterMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto r = Start(mb, h).initBody().initRegister();
  r.setActorId(h.sender);
  r.setRole(wire::Role::ROLLOUT);
  r.setNode(m.node);
  r.setPid(m.pid);
  auto eps = r.initEndpoints(1);
  eps[0].setName("weights-data");
  eps[0].setAddress(m.data_endpoint);
  r.setPolicyVersion(m.version);
  return Finish(mb);
}

Bytes EncodeHeartbeat(const Header& h, const HeartbeatMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto hb = Start(mb, h).initBody().initHeartbeat();
  switch (m.state) {
    case PeerState::kAlive:
      hb.setState(wire::ActorState::READY);
      break;
    case PeerState::kLeaving:
      hb.setState(wire::ActorState::DRAINING);
      break;
    case PeerState::kExited:
      hb.setState(wire::ActorState::EXITED);
      break;
    case PeerState::kUnknown:
      hb.setState(wire::ActorState::LOST);
      break;
  }
  hb.setPolicyVersion(m.version);
  return Finish(mb);
}

Bytes EncodeGroup(const Header& h, const GroupMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto g = Start(mb, h).initBody().initBroadcastGroup();
  g.setEpoch(m.epoch);
  g.setBackend(m.backend);
  auto members = g.initMembers(static_cast<unsigned>(m.members.size()));
  for (size_t i = 0; i < m.members.size(); ++i) members.set(i, m.members[i]);
  auto eps = g.initMemberEndpoints(static_cast<unsigned>(m.endpoints.size()));
  for (size_t i = 0; i < m.endpoints.size(); ++i) eps.set(i, m.endpoints[i]);
  g.setStoreAddress(m.store_address);
  if (!m.nccl_id.empty())
    g.setNcclUniqueId(
        capnp::Data::Reader(reinterpret_cast<const uint8_t*>(m.nccl_id.data()), m.nccl_id.size()));
  g.setTimeoutMs(m.timeout_ms);
  g.setAlgorithm(m.algorithm);
  return Finish(mb);
}

Bytes EncodeManifest(const Header& h, const ManifestMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto w = Start(mb, h).initBody().initWeightsManifest();
  const Layout& l = m.layout;
  w.setVersion(l.version);
  w.setEpoch(l.transfer);
  w.setWireDtype(l.wire_dtype == WireDtype::kBFloat16 ? wire::DType::BFLOAT16
                                                      : wire::DType::FLOAT32);
  w.setBucketBytes(l.bucket_bytes);
  w.setChunkBytes(l.chunk_bytes);
  w.setTotalBytes(l.total_bytes);
  auto slots = w.initTensors(static_cast<unsigned>(l.slots.size()));
  for (size_t i = 0; i < l.slots.size(); ++i) {
    const Slot& s = l.slots[i];
    auto o = slots[i];
    o.setName(s.name);
    o.setDtype(static_cast<wire::DType>(s.dtype));
    auto shape = o.initShape(static_cast<unsigned>(s.shape.size()));
    for (size_t d = 0; d < s.shape.size(); ++d) shape.set(d, s.shape[d]);
    o.setBucket(static_cast<uint32_t>(s.offset / l.bucket_bytes));
    o.setOffset(s.offset % l.bucket_bytes);
    o.setBytes(s.bytes);
  }
  auto sums = w.initBucketChecksums(static_cast<unsigned>(l.checksums.size()));
  for (size_t i = 0; i < l.checksums.size(); ++i) sums.set(i, l.checksums[i]);
  w.setShmSegment(m.shm_segment);
  w.setShmOffset(m.shm_offset);
  w.setShmGeneration(m.shm_generation);
  return Finish(mb);
}

Bytes EncodeAck(const Header& h, const AckMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto a = Start(mb, h).initBody().initAck();
  auto seqs = a.initSeqs(2);
  seqs.set(0, m.version);
  seqs.set(1, m.transfer);
  if (!m.ok) {
    auto rej = a.initRejected(1);
    rej[0].setSeq(m.version);
    rej[0].setReason(m.reason.substr(0, kMaxText));
  }
  a.setReceiverIncarnation(h.incarnation);
  return Finish(mb);
}

Bytes EncodeChunk(const Header& h, const ChunkMsg& m) {
  capnp::MallocMessageBuilder mb;
  auto c = Start(mb, h).initBody().initWeightsChunk();
  c.setVersion(m.version);
  c.setBucket(m.bucket);
  c.setOffset(m.bucket_offset);
  c.setLast(m.last);
  c.setTransfer(m.transfer);
  return Finish(mb);
}

Result<Message> Decode(const void* data, size_t size) {
  if (size == 0) return Malformed("empty message");
  if (size % sizeof(capnp::word) != 0)
    return Malformed("message of {} bytes is not a whole number of 8-byte words", size);
  if (size > kMaxMessageBytes)
    return ResourceExhausted("message of {} bytes exceeds {}", size, kMaxMessageBytes);
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(words.begin(), data, size);
  Message out;
  try {
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = words.size() * 4 + 4096;
    capnp::FlatArrayMessageReader reader(words.asPtr(), opts);
    auto env = reader.getRoot<wire::Envelope>();
    if (env.getSchemaVersion() != wire::SCHEMA_VERSION)
      return ProtocolError("schema version {} (this build speaks {})", env.getSchemaVersion(),
                           wire::SCHEMA_VERSION);
    out.sender = Text(env.getSender(), "sender");
    out.incarnation = env.getIncarnation();
    auto body = env.getBody();
    switch (body.which()) {
      case wire::Envelope::Body::REGISTER: {
        auto r = body.getRegister();
        out.kind = Kind::kRegister;
        out.reg.node = Text(r.getNode(), "node");
        out.reg.pid = r.getPid();
        out.reg.version = r.getPolicyVersion();
        for (auto ep : r.getEndpoints())
          if (ep.getName() == "weights-data") out.reg.data_endpoint = Text(ep.getAddress(), "ep");
        if (!r.getActorId().size() || r.getActorId() != env.getSender())
          return ProtocolError("Register.actorId '{}' differs from the envelope sender '{}'",
                               Text(r.getActorId(), "actorId"), out.sender);
        break;
      }
      case wire::Envelope::Body::HEARTBEAT: {
        auto hb = body.getHeartbeat();
        out.kind = Kind::kHeartbeat;
        switch (hb.getState()) {
          case wire::ActorState::DRAINING:
          case wire::ActorState::STOPPING:
            out.heartbeat.state = PeerState::kLeaving;
            break;
          case wire::ActorState::EXITED:
          case wire::ActorState::FAILED:
            out.heartbeat.state = PeerState::kExited;
            break;
          case wire::ActorState::LOST:
            out.heartbeat.state = PeerState::kUnknown;
            break;
          default:
            out.heartbeat.state = PeerState::kAlive;
            break;
        }
        out.heartbeat.version = hb.getPolicyVersion();
        break;
      }
      case wire::Envelope::Body::BROADCAST_GROUP: {
        auto g = body.getBroadcastGroup();
        out.kind = Kind::kGroup;
        out.group.epoch = g.getEpoch();
        out.group.backend = Text(g.getBackend(), "backend");
        if (g.getMembers().size() > kMaxMembers || g.getMemberEndpoints().size() > kMaxMembers)
          return ResourceExhausted("BroadcastGroup with more than {} members", kMaxMembers);
        for (auto m : g.getMembers()) out.group.members.push_back(Text(m, "member"));
        for (auto e : g.getMemberEndpoints()) out.group.endpoints.push_back(Text(e, "endpoint"));
        out.group.store_address = Text(g.getStoreAddress(), "storeAddress");
        auto id = g.getNcclUniqueId();
        out.group.nccl_id.assign(reinterpret_cast<const char*>(id.begin()), id.size());
        out.group.timeout_ms = g.getTimeoutMs();
        out.group.algorithm = Text(g.getAlgorithm(), "algorithm");
        break;
      }
      case wire::Envelope::Body::WEIGHTS_MANIFEST: {
        auto w = body.getWeightsManifest();
        out.kind = Kind::kManifest;
        Layout& l = out.manifest.layout;
        l.version = w.getVersion();
        l.transfer = w.getEpoch();
        switch (w.getWireDtype()) {
          case wire::DType::FLOAT32:
            l.wire_dtype = WireDtype::kAsStored;
            break;
          case wire::DType::BFLOAT16:
            l.wire_dtype = WireDtype::kBFloat16;
            break;
          default:
            return Malformed("manifest wireDtype {} (float32 or bfloat16 expected)",
                             static_cast<int>(w.getWireDtype()));
        }
        l.bucket_bytes = w.getBucketBytes();
        l.chunk_bytes = w.getChunkBytes();
        l.total_bytes = w.getTotalBytes();
        if (l.bucket_bytes == 0) return Malformed("manifest bucketBytes is 0");
        auto tensors = w.getTensors();
        if (tensors.size() > kMaxSlots)
          return ResourceExhausted("manifest lists {} tensors (max {})", tensors.size(), kMaxSlots);
        l.slots.reserve(tensors.size());
        for (auto t : tensors) {
          Slot s;
          s.name = Text(t.getName(), "tensor name");
          auto dt = static_cast<int>(t.getDtype());
          if (dt < 0 || dt >= kNumDTypes)
            return Malformed("tensor '{}' has unknown dtype ordinal {}", s.name, dt);
          s.dtype = static_cast<DType>(dt);
          s.wire = (l.wire_dtype == WireDtype::kBFloat16 && s.dtype == DType::kFloat32)
                       ? DType::kBFloat16
                       : s.dtype;
          auto shape = t.getShape();
          if (shape.size() > 64) return Malformed("tensor '{}' has {} dims", s.name, shape.size());
          for (auto d : shape) s.shape.push_back(d);
          uint64_t base = static_cast<uint64_t>(t.getBucket()) * l.bucket_bytes;
          if (base / l.bucket_bytes != t.getBucket() || base + t.getOffset() < base)
            return Malformed("tensor '{}' position overflows", s.name);
          s.offset = base + t.getOffset();
          s.bytes = t.getBytes();
          l.slots.push_back(std::move(s));
        }
        auto sums = w.getBucketChecksums();
        if (sums.size() > kMaxSlots) return ResourceExhausted("too many bucket checksums");
        for (auto c : sums) l.checksums.push_back(c);
        out.manifest.shm_segment = Text(w.getShmSegment(), "shmSegment");
        out.manifest.shm_offset = w.getShmOffset();
        out.manifest.shm_generation = w.getShmGeneration();
        break;
      }
      case wire::Envelope::Body::ACK: {
        auto a = body.getAck();
        out.kind = Kind::kAck;
        auto seqs = a.getSeqs();
        if (seqs.size() != 2)
          return ProtocolError("weights Ack carries {} seqs (expected [version, transfer])",
                               seqs.size());
        out.ack.version = seqs[0];
        out.ack.transfer = seqs[1];
        auto rej = a.getRejected();
        if (rej.size() > 0) {
          out.ack.ok = false;
          out.ack.reason = Text(rej[0].getReason(), "reason");
        }
        break;
      }
      case wire::Envelope::Body::WEIGHTS_CHUNK: {
        auto c = body.getWeightsChunk();
        out.kind = Kind::kChunk;
        out.chunk.version = c.getVersion();
        out.chunk.transfer = c.getTransfer();
        out.chunk.bucket = c.getBucket();
        out.chunk.bucket_offset = c.getOffset();
        out.chunk.last = c.getLast();
        if (c.hasData() && c.getData().size() > 0)
          return ProtocolError(
              "WeightsChunk carries inline data; the payload must be its own frame");
        break;
      }
      default:
        return ProtocolError("unexpected message kind (union ordinal {}) on the weights channel",
                             static_cast<int>(body.which()));
    }
  } catch (const kj::Exception& e) {
    return Malformed("undecodable envelope: {}", e.getDescription().cStr());
  } catch (const std::exception& e) {
    return Malformed("bad envelope: {}", e.what());
  }
  return out;
}

}  // namespace troupe::broadcast::proto
