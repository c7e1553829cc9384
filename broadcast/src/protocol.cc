// Transport encoding of the broadcast messages (protocol.h).
#include "protocol.h"

#include <kj/exception.h>

#include "troupe/wire/troupe.capnp.h"

namespace troupe::broadcast::proto {
namespace {

constexpr size_t kMaxSlots = size_t{1} << 22;
constexpr size_t kMaxStoreKeys = 4096;

transport::OutMessage Start(const Header& h, size_t size_hint = 0) {
  transport::OutMessage out =
      size_hint > 0 ? transport::OutMessage(size_hint) : transport::OutMessage();
  auto env = out.envelope();
  env.setSender(h.sender);
  env.setIncarnation(h.incarnation);
  return out;
}

std::string Text(capnp::Text::Reader t, const char* field) {
  if (t.size() > kMaxText)
    throw std::length_error(fmt::format("{} longer than {} bytes", field, kMaxText));
  return std::string(t.cStr(), t.size());
}

std::string Bytes(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

capnp::Data::Reader AsData(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

wire::StoreOp ToWire(StoreOp op) {
  switch (op) {
    case StoreOp::kSet:
      return wire::StoreOp::SET;
    case StoreOp::kGet:
      return wire::StoreOp::GET;
    case StoreOp::kAdd:
      return wire::StoreOp::ADD;
    case StoreOp::kCheck:
      return wire::StoreOp::CHECK;
    case StoreOp::kWait:
      return wire::StoreOp::WAIT;
    case StoreOp::kDeleteKey:
      return wire::StoreOp::DELETE_KEY;
    case StoreOp::kNumKeys:
      return wire::StoreOp::NUM_KEYS;
    case StoreOp::kCompareSet:
      return wire::StoreOp::COMPARE_SET;
  }
  return wire::StoreOp::GET;
}

Result<StoreOp> FromWire(wire::StoreOp op) {
  switch (op) {
    case wire::StoreOp::SET:
      return StoreOp::kSet;
    case wire::StoreOp::GET:
      return StoreOp::kGet;
    case wire::StoreOp::ADD:
      return StoreOp::kAdd;
    case wire::StoreOp::CHECK:
      return StoreOp::kCheck;
    case wire::StoreOp::WAIT:
      return StoreOp::kWait;
    case wire::StoreOp::DELETE_KEY:
      return StoreOp::kDeleteKey;
    case wire::StoreOp::NUM_KEYS:
      return StoreOp::kNumKeys;
    case wire::StoreOp::COMPARE_SET:
      return StoreOp::kCompareSet;
  }
  return ProtocolError("unknown store operation {}", static_cast<int>(op));
}

constexpr size_t kMaxAdapterTensors = size_t{1} << 16;
constexpr size_t kMaxDims = 8;

Status DecodeAdapters(wire::AdapterLayout::Reader a, AdapterLayout* out) {
  out->declared = a.getDeclared();
  out->rank = a.getRank();
  out->alpha = a.getAlpha();
  if (a.getTargets().size() > 64)
    return ProtocolError("Register.adapters lists {} target modules", a.getTargets().size());
  for (auto t : a.getTargets()) out->targets.push_back(Text(t, "adapters.targets"));
  if (a.getTensors().size() > kMaxAdapterTensors)
    return ProtocolError("Register.adapters lists {} tensors (at most {})", a.getTensors().size(),
                         kMaxAdapterTensors);
  out->tensors.reserve(a.getTensors().size());
  for (auto t : a.getTensors()) {
    AdapterTensor x;
    x.name = Text(t.getName(), "adapters.tensors.name");
    if (t.getShape().size() > kMaxDims)
      return ProtocolError("Register.adapters tensor '{}' has {} dimensions", x.name,
                           t.getShape().size());
    for (int64_t d : t.getShape()) x.shape.push_back(d);
    out->tensors.push_back(std::move(x));
  }
  return Status::Ok();
}

Status DecodeRegister(wire::Register::Reader r, const std::string& sender, RegisterMsg* out) {
  out->node = Text(r.getNode(), "node");
  out->pid = r.getPid();
  out->version = r.getPolicyVersion();
  if (r.hasAdapters()) TROUPE_RETURN_IF_ERROR(DecodeAdapters(r.getAdapters(), &out->adapters));
  for (auto ep : r.getEndpoints())
    if (ep.getName() == "weights-data") out->data_endpoint = Text(ep.getAddress(), "endpoint");
  if (r.getActorId().size() == 0 || r.getActorId() != sender)
    return ProtocolError("Register.actorId '{}' differs from the envelope sender '{}'",
                         Text(r.getActorId(), "actorId"), sender);
  return Status::Ok();
}

PeerState DecodeState(wire::ActorState s) {
  switch (s) {
    case wire::ActorState::DRAINING:
    case wire::ActorState::STOPPING:
      return PeerState::kLeaving;
    case wire::ActorState::EXITED:
    case wire::ActorState::FAILED:
      return PeerState::kExited;
    case wire::ActorState::LOST:
      return PeerState::kUnknown;
    default:
      return PeerState::kAlive;
  }
}

Status DecodeGroup(wire::BroadcastGroup::Reader g, GroupMsg* out) {
  out->epoch = g.getEpoch();
  out->backend = Text(g.getBackend(), "backend");
  if (g.getMembers().size() > kMaxMembers || g.getMemberEndpoints().size() > kMaxMembers)
    return ResourceExhausted("BroadcastGroup with more than {} members", kMaxMembers);
  for (auto m : g.getMembers()) out->members.push_back(Text(m, "member"));
  for (auto e : g.getMemberEndpoints()) out->endpoints.push_back(Text(e, "endpoint"));
  out->store_address = Text(g.getStoreAddress(), "storeAddress");
  out->store_prefix = Text(g.getStorePrefix(), "storePrefix");
  out->nccl_id = Bytes(g.getNcclUniqueId());
  out->timeout_ms = g.getTimeoutMs();
  out->algorithm = Text(g.getAlgorithm(), "algorithm");
  return Status::Ok();
}

Status DecodeManifest(wire::WeightsManifest::Reader w, ManifestMsg* out) {
  Layout& l = out->layout;
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
    s.wire = (l.wire_dtype == WireDtype::kBFloat16 && s.dtype == DType::kFloat32) ? DType::kBFloat16
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
  out->shm_segment = Text(w.getShmSegment(), "shmSegment");
  out->shm_offset = w.getShmOffset();
  out->shm_generation = w.getShmGeneration();
  l.token = w.getChunkToken();
  return Status::Ok();
}

Status DecodeChunk(wire::WeightsChunk::Reader c, ChunkMsg* out) {
  out->version = c.getVersion();
  out->transfer = c.getTransfer();
  out->bucket = c.getBucket();
  out->bucket_offset = c.getOffset();
  out->last = c.getLast();
  out->token = c.getToken();
  if (c.hasData() && c.getData().size() > 0)
    return ProtocolError("WeightsChunk carries inline data; the bytes belong in `payload`");
  if (!c.hasPayload()) return ProtocolError("WeightsChunk without a payload");
  TROUPE_ASSIGN_OR_RETURN(out->payload,
                          transport::ReadTensor(c.getPayload(), "weightsChunk.payload"));
  if (out->payload.dtype != wire::DType::UINT8 || out->payload.rank() != 1)
    return ProtocolError("WeightsChunk payload must be a 1-d uint8 tensor");
  return Status::Ok();
}

Status DecodeStoreRequest(wire::StoreRequest::Reader r, StoreRequestMsg* out) {
  out->id = r.getId();
  TROUPE_ASSIGN_OR_RETURN(out->op, FromWire(r.getOp()));
  if (r.getKeys().size() > kMaxStoreKeys)
    return ResourceExhausted("store request with {} keys (max {})", r.getKeys().size(),
                             kMaxStoreKeys);
  for (auto k : r.getKeys()) out->keys.push_back(Text(k, "store key"));
  out->value = Bytes(r.getValue());
  out->expected = Bytes(r.getExpected());
  out->delta = r.getDelta();
  out->timeout_ms = r.getTimeoutMs();
  return Status::Ok();
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kRegister:
      return "register";
    case Kind::kHeartbeat:
      return "heartbeat";
    case Kind::kGroup:
      return "broadcastGroup";
    case Kind::kManifest:
      return "weightsManifest";
    case Kind::kAck:
      return "ack";
    case Kind::kChunk:
      return "weightsChunk";
    case Kind::kStoreRequest:
      return "storeRequest";
    case Kind::kStoreReply:
      return "storeReply";
  }
  return "?";
}

bool ChunkMsg::Absolute(uint64_t bucket_bytes, uint64_t* out) const {
  uint64_t base = static_cast<uint64_t>(bucket) * bucket_bytes;
  if (bucket_bytes != 0 && base / bucket_bytes != bucket) return false;
  if (base + bucket_offset < base) return false;
  *out = base + bucket_offset;
  return true;
}

transport::OutMessage EncodeRegister(const Header& h, const RegisterMsg& m) {
  auto out = Start(h);
  auto env = out.envelope();
  auto r = env.initBody().initRegister();
  r.setActorId(h.sender);
  r.setRole(wire::Role::ROLLOUT);
  r.setNode(m.node);
  r.setPid(m.pid);
  auto eps = r.initEndpoints(1);
  eps[0].setName("weights-data");
  eps[0].setAddress(m.data_endpoint);
  r.setPolicyVersion(m.version);
  if (m.adapters.declared) {
    auto a = r.initAdapters();
    a.setDeclared(true);
    a.setRank(static_cast<uint32_t>(m.adapters.rank));
    a.setAlpha(m.adapters.alpha);
    auto targets = a.initTargets(static_cast<unsigned>(m.adapters.targets.size()));
    for (size_t i = 0; i < m.adapters.targets.size(); ++i)
      targets.set(static_cast<unsigned>(i), m.adapters.targets[i]);
    auto tensors = a.initTensors(static_cast<unsigned>(m.adapters.tensors.size()));
    for (size_t i = 0; i < m.adapters.tensors.size(); ++i) {
      const AdapterTensor& t = m.adapters.tensors[i];
      tensors[static_cast<unsigned>(i)].setName(t.name);
      auto shape = tensors[static_cast<unsigned>(i)].initShape(static_cast<unsigned>(t.shape.size()));
      for (size_t d = 0; d < t.shape.size(); ++d) shape.set(static_cast<unsigned>(d), t.shape[d]);
    }
  }
  return out;
}

transport::OutMessage EncodeHeartbeat(const Header& h, const HeartbeatMsg& m) {
  auto out = Start(h);
  auto env = out.envelope();
  auto hb = env.initBody().initHeartbeat();
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
  return out;
}

transport::OutMessage EncodeGroup(const Header& h, const GroupMsg& m) {
  auto out = Start(h);
  auto env = out.envelope();
  auto g = env.initBody().initBroadcastGroup();
  g.setEpoch(m.epoch);
  g.setBackend(m.backend);
  auto members = g.initMembers(static_cast<unsigned>(m.members.size()));
  for (size_t i = 0; i < m.members.size(); ++i) members.set(i, m.members[i]);
  auto eps = g.initMemberEndpoints(static_cast<unsigned>(m.endpoints.size()));
  for (size_t i = 0; i < m.endpoints.size(); ++i) eps.set(i, m.endpoints[i]);
  g.setStoreAddress(m.store_address);
  g.setStorePrefix(m.store_prefix);
  if (!m.nccl_id.empty()) g.setNcclUniqueId(AsData(m.nccl_id));
  g.setTimeoutMs(m.timeout_ms);
  g.setAlgorithm(m.algorithm);
  return out;
}

transport::OutMessage EncodeManifest(const Header& h, const ManifestMsg& m) {
  const Layout& l = m.layout;
  // One first segment for the whole manifest (~100 bytes per tensor): fewer far pointers.
  auto out = Start(h, 1024 + l.slots.size() * 128 + l.checksums.size() * 8);
  auto env = out.envelope();
  auto w = env.initBody().initWeightsManifest();
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
  w.setChunkToken(l.token);
  return out;
}

transport::OutMessage EncodeAck(const Header& h, const AckMsg& m) {
  auto out = Start(h);
  auto env = out.envelope();
  auto a = env.initBody().initAck();
  auto seqs = a.initSeqs(2);
  seqs.set(0, m.version);
  seqs.set(1, m.transfer);
  if (!m.ok) {
    auto rej = a.initRejected(1);
    rej[0].setSeq(m.version);
    rej[0].setReason(m.reason.substr(0, kMaxText));
  }
  a.setReceiverIncarnation(h.incarnation);
  return out;
}

Result<transport::OutMessage> EncodeChunk(const Header& h, const ChunkMsg& m,
                                          transport::TensorBytes payload) {
  auto out = Start(h);
  auto env = out.envelope();
  auto c = env.initBody().initWeightsChunk();
  c.setVersion(m.version);
  c.setBucket(m.bucket);
  c.setOffset(m.bucket_offset);
  c.setLast(m.last);
  c.setTransfer(m.transfer);
  c.setToken(m.token);
  const int64_t n = static_cast<int64_t>(payload.bytes);
  TROUPE_RETURN_IF_ERROR(
      out.SetTensor(c.initPayload(), wire::DType::UINT8, {n}, std::move(payload)));
  return out;
}

transport::OutMessage EncodeStoreRequest(const Header& h, const StoreRequestMsg& m) {
  size_t hint = 256 + m.value.size() + m.expected.size();
  for (const auto& k : m.keys) hint += k.size() + 16;
  auto out = Start(h, hint);
  auto env = out.envelope();
  auto r = env.initBody().initStoreRequest();
  r.setId(m.id);
  r.setOp(ToWire(m.op));
  auto keys = r.initKeys(static_cast<unsigned>(m.keys.size()));
  for (size_t i = 0; i < m.keys.size(); ++i) keys.set(i, m.keys[i]);
  r.setValue(AsData(m.value));
  r.setExpected(AsData(m.expected));
  r.setDelta(m.delta);
  r.setTimeoutMs(m.timeout_ms);
  return out;
}

transport::OutMessage EncodeStoreReply(const Header& h, const StoreReplyMsg& m) {
  auto out = Start(h, 256 + m.value.size() + m.error.size());
  auto env = out.envelope();
  auto r = env.initBody().initStoreReply();
  r.setId(m.id);
  r.setOk(m.ok);
  r.setError(m.error.substr(0, kMaxText));
  r.setValue(AsData(m.value));
  r.setNumber(m.number);
  return out;
}

Result<Message> Decode(const transport::InMessage& in) {
  Message out;
  try {
    auto env = in.envelope();
    out.sender = Text(env.getSender(), "sender");
    out.incarnation = env.getIncarnation();
    auto body = env.getBody();
    Status st = Status::Ok();
    switch (body.which()) {
      case wire::Envelope::Body::REGISTER:
        out.kind = Kind::kRegister;
        st = DecodeRegister(body.getRegister(), out.sender, &out.reg);
        break;
      case wire::Envelope::Body::HEARTBEAT:
        out.kind = Kind::kHeartbeat;
        out.heartbeat.state = DecodeState(body.getHeartbeat().getState());
        out.heartbeat.version = body.getHeartbeat().getPolicyVersion();
        break;
      case wire::Envelope::Body::BROADCAST_GROUP:
        out.kind = Kind::kGroup;
        st = DecodeGroup(body.getBroadcastGroup(), &out.group);
        break;
      case wire::Envelope::Body::WEIGHTS_MANIFEST:
        out.kind = Kind::kManifest;
        st = DecodeManifest(body.getWeightsManifest(), &out.manifest);
        break;
      case wire::Envelope::Body::ACK: {
        out.kind = Kind::kAck;
        auto a = body.getAck();
        auto seqs = a.getSeqs();
        if (seqs.size() != 2)
          return ProtocolError("weights Ack carries {} seqs (expected [version, transfer])",
                               seqs.size());
        out.ack.version = seqs[0];
        out.ack.transfer = seqs[1];
        if (a.getRejected().size() > 0) {
          out.ack.ok = false;
          out.ack.reason = Text(a.getRejected()[0].getReason(), "reason");
        }
        break;
      }
      case wire::Envelope::Body::WEIGHTS_CHUNK:
        out.kind = Kind::kChunk;
        st = DecodeChunk(body.getWeightsChunk(), &out.chunk);
        break;
      case wire::Envelope::Body::STORE_REQUEST:
        out.kind = Kind::kStoreRequest;
        st = DecodeStoreRequest(body.getStoreRequest(), &out.store_request);
        break;
      case wire::Envelope::Body::STORE_REPLY: {
        out.kind = Kind::kStoreReply;
        auto r = body.getStoreReply();
        out.store_reply.id = r.getId();
        out.store_reply.ok = r.getOk();
        out.store_reply.error = Text(r.getError(), "error");
        out.store_reply.value = Bytes(r.getValue());
        out.store_reply.number = r.getNumber();
        break;
      }
      default:
        return ProtocolError("a {} message is not part of the weight broadcast",
                             transport::KindName(body.which()));
    }
    if (!st.ok()) return st;
  } catch (const kj::Exception& e) {
    return Malformed("undecodable envelope: {}", e.getDescription().cStr());
  } catch (const std::exception& e) {
    return Malformed("bad envelope: {}", e.what());
  }
  return out;
}

}  // namespace troupe::broadcast::proto
