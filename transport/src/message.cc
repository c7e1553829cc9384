// OutMessage / InMessage: building, sealing, framing and decoding.
#include "troupe/transport/message.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include <capnp/any.h>
#include <capnp/schema.h>
#include <kj/exception.h>

#include "troupe/core/check.h"
#include "troupe/core/deadline.h"
#include "troupe/core/log.h"
#include "troupe/core/text.h"
#include "troupe/transport/tensor.h"

namespace troupe::transport {

using capnp::word;

// ---------------------------------------------------------------- kinds

std::string KindName(MessageKind kind) {
  // Names come from the compiled-in schema, so kinds added later need no edit here.
  auto body = capnp::Schema::from<wire::Envelope::Body>();
  for (auto field : body.getUnionFields()) {
    if (field.getProto().getDiscriminantValue() == static_cast<uint16_t>(kind)) {
      return field.getProto().getName().cStr();
    }
  }
  return fmt::format("kind({})", static_cast<int>(kind));
}

MessageKind MaxKnownKind() {
  // The union's members, from the compiled-in schema: a kind added to the
  // schema is known without touching this file.
  static const MessageKind max_kind = [] {
    auto body = capnp::Schema::from<wire::Envelope::Body>();
    uint16_t max_value = 0;
    for (auto field : body.getUnionFields()) {
      max_value = std::max<uint16_t>(max_value, field.getProto().getDiscriminantValue());
    }
    return static_cast<MessageKind>(max_value);
  }();
  return max_kind;
}

Status DecodeLimits::Validate() const {
  if (max_message_bytes == 0 || max_message_bytes > (uint64_t{1} << 40)) {
    return InvalidArgument("limits.max_message_bytes = {}: must be in 1..2^40", max_message_bytes);
  }
  if (max_segments == 0 || max_segments > 65536) {
    return InvalidArgument("limits.max_segments = {}: must be in 1..65536", max_segments);
  }
  if (traversal_limit_words < max_message_bytes / 8) {
    return InvalidArgument(
        "limits.traversal_limit_words = {} is below max_message_bytes / 8 = {}: a message within "
        "the size limit could not be read once",
        traversal_limit_words, max_message_bytes / 8);
  }
  if (nesting_limit < 4 || nesting_limit > 1024) {
    return InvalidArgument("limits.nesting_limit = {}: must be in 4..1024", nesting_limit);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- buffer pool

struct SegmentBufferPool::Impl {
  std::mutex mu;
  size_t max_buffers, max_bytes;
  std::vector<std::pair<std::unique_ptr<uint64_t[]>, size_t>> free;
  std::atomic<size_t> reused{0};
};

SegmentBufferPool::SegmentBufferPool(size_t max_buffers, size_t max_buffer_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->max_buffers = max_buffers;
  impl_->max_bytes = max_buffer_bytes;
}
SegmentBufferPool::~SegmentBufferPool() = default;

std::unique_ptr<uint64_t[]> SegmentBufferPool::Take(size_t bytes, size_t* capacity_bytes) {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    for (size_t i = 0; i < impl_->free.size(); ++i) {
      if (impl_->free[i].second >= bytes) {
        auto buf = std::move(impl_->free[i].first);
        *capacity_bytes = impl_->free[i].second;
        impl_->free.erase(impl_->free.begin() + static_cast<std::ptrdiff_t>(i));
        impl_->reused.fetch_add(1, std::memory_order_relaxed);
        return buf;
      }
    }
  }
  // Round small requests up so a buffer serves many later messages.
  const size_t cap = std::max<size_t>(RoundUpToWord(bytes), 4096);
  *capacity_bytes = cap;
  return std::unique_ptr<uint64_t[]>(new uint64_t[cap / 8]);
}

void SegmentBufferPool::Give(std::unique_ptr<uint64_t[]> buffer, size_t capacity_bytes) {
  if (capacity_bytes > impl_->max_bytes) return;
  std::lock_guard<std::mutex> g(impl_->mu);
  if (impl_->free.size() >= impl_->max_buffers) return;
  impl_->free.emplace_back(std::move(buffer), capacity_bytes);
}

size_t SegmentBufferPool::reused() const {
  return impl_->reused.load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------- OutMessage

namespace detail {

struct OutState {
  std::unique_ptr<capnp::MallocMessageBuilder> builder;  // null for WithSeq copies
  std::shared_ptr<const OutState> parent;                // WithSeq: owns segments 1..N
  std::unique_ptr<word[]> seg0_copy;                     // WithSeq: patched segment 0
  std::vector<std::shared_ptr<const void>> keep_alive;   // tensor bytes referenced
  size_t copied_tensor_bytes = 0;

  std::mutex seal_mu;
  std::atomic<bool> sealed{false};
  // Valid once sealed:
  std::vector<kj::ArrayPtr<const word>> segments;
  std::unique_ptr<capnp::SegmentArrayMessageReader> sealed_reader;
  wire::Envelope::Reader sealed_root;
  size_t total_bytes = 0;

  void FinishSeal() {
    total_bytes = 0;
    for (auto s : segments) total_bytes += s.size() * sizeof(word);
    capnp::ReaderOptions ro;
    ro.traversalLimitInWords = std::numeric_limits<uint64_t>::max();
    ro.nestingLimit = 1 << 20;
    sealed_reader = std::make_unique<capnp::SegmentArrayMessageReader>(
        kj::ArrayPtr<const kj::ArrayPtr<const word>>(segments.data(), segments.size()), ro);
    sealed_root = sealed_reader->getRoot<wire::Envelope>();
    sealed.store(true, std::memory_order_release);
  }
};

}  // namespace detail

OutMessage::OutMessage() : OutMessage(capnp::SUGGESTED_FIRST_SEGMENT_WORDS * sizeof(word)) {}

OutMessage::OutMessage(size_t size_hint_bytes) : state_(std::make_shared<detail::OutState>()) {
  const size_t words =
      std::max<size_t>(RoundUpToWord(size_hint_bytes) / sizeof(word), 64);  // root + envelope
  state_->builder = std::make_unique<capnp::MallocMessageBuilder>(
      static_cast<unsigned>(std::min<size_t>(words, size_t{1} << 28)));
  state_->builder->initRoot<wire::Envelope>();
}

wire::Envelope::Builder OutMessage::envelope() {
  TROUPE_CHECK_MSG(!sealed(), "OutMessage::envelope() after the message was sent (sealed)");
  return state_->builder->getRoot<wire::Envelope>();
}

wire::Envelope::Reader OutMessage::reader() const {
  if (sealed()) return state_->sealed_root;
  return state_->builder->getRoot<wire::Envelope>().asReader();
}

bool OutMessage::sealed() const {
  return state_->sealed.load(std::memory_order_acquire);
}

void OutMessage::set_seq(uint64_t seq) {
  TROUPE_CHECK_MSG(!sealed(), "OutMessage::set_seq({}) after the message was sealed", seq);
  state_->builder->getRoot<wire::Envelope>().setSeq(seq);
}

namespace {

// Validates dtype/shape/size and fills dtype and shape of `tensor`.
Status FillTensorHeader(wire::Tensor::Builder tensor, wire::DType dtype, ShapeRef shape,
                        const void* data, size_t bytes) {
  const size_t item = ItemSize(dtype);
  if (item == 0) return InvalidArgument("SetTensor: unknown dtype {}", static_cast<int>(dtype));
  TROUPE_ASSIGN_OR_RETURN(int64_t numel, NumElements(shape, "SetTensor"));
  if (static_cast<uint64_t>(numel) * item != bytes) {
    return InvalidArgument("SetTensor: {} tensor with {} elements needs {} bytes, got {}",
                           DTypeName(dtype), numel, static_cast<uint64_t>(numel) * item, bytes);
  }
  if (bytes > kMaxTensorBytes) {
    return InvalidArgument(
        "SetTensor: {} bytes is over the {}-byte limit of one Cap'n Proto Data blob; split the "
        "tensor",
        bytes, kMaxTensorBytes);
  }
  if (bytes > 0 && data == nullptr)
    return InvalidArgument("SetTensor: null data for {} bytes", bytes);
  tensor.setDtype(dtype);
  auto dims = tensor.initShape(static_cast<unsigned>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) dims.set(static_cast<unsigned>(i), shape.begin()[i]);
  return Status::Ok();
}

void CopyTensorData(wire::Tensor::Builder tensor, const void* data, size_t bytes) {
  auto blob = tensor.initData(static_cast<unsigned>(bytes));
  if (bytes) std::memcpy(blob.begin(), data, bytes);
}

}  // namespace

Status OutMessage::SetTensor(wire::Tensor::Builder tensor, wire::DType dtype, ShapeRef shape,
                             TensorBytes bytes) {
  TROUPE_CHECK_MSG(!sealed(), "OutMessage::SetTensor after the message was sealed");
  TROUPE_RETURN_IF_ERROR(FillTensorHeader(tensor, dtype, shape, bytes.data, bytes.bytes));
  const bool aligned = (reinterpret_cast<uintptr_t>(bytes.data) % 8) == 0;
  const bool padded = bytes.readable >= RoundUpToWord(bytes.bytes);
  if (bytes.bytes < kZeroCopyMinBytes) {
    CopyTensorData(tensor, bytes.data, bytes.bytes);  // cheaper than a segment of its own
    return Status::Ok();
  }
  if (!aligned || !padded) {
    state_->copied_tensor_bytes += bytes.bytes;
    CopyTensorData(tensor, bytes.data, bytes.bytes);
    return Status::Ok();
  }
  auto orphan = state_->builder->getOrphanage().referenceExternalData(
      capnp::Data::Reader(static_cast<const kj::byte*>(bytes.data), bytes.bytes));
  tensor.adoptData(kj::mv(orphan));
  if (bytes.keep_alive) state_->keep_alive.push_back(std::move(bytes.keep_alive));
  return Status::Ok();
}

Status OutMessage::SetTensorCopy(wire::Tensor::Builder tensor, wire::DType dtype, ShapeRef shape,
                                 const void* data, size_t bytes) {
  TROUPE_CHECK_MSG(!sealed(), "OutMessage::SetTensorCopy after the message was sealed");
  TROUPE_RETURN_IF_ERROR(FillTensorHeader(tensor, dtype, shape, data, bytes));
  CopyTensorData(tensor, data, bytes);
  return Status::Ok();
}

void OutMessage::Seal(const SealInfo& info) const {
  auto& s = *state_;
  if (s.sealed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> g(s.seal_mu);
  if (s.sealed.load(std::memory_order_relaxed)) return;
  auto env = s.builder->getRoot<wire::Envelope>();
  env.setSchemaVersion(wire::SCHEMA_VERSION);
  if (env.getSender().size() == 0 && !info.sender.empty()) {
    env.setSender(capnp::Text::Reader(info.sender.data(), info.sender.size()));
  }
  if (env.getIncarnation() == 0) env.setIncarnation(info.incarnation);
  env.setSendTimeNs(WallTimeNs());
  auto segs = s.builder->getSegmentsForOutput();
  s.segments.assign(segs.begin(), segs.end());
  s.FinishSeal();
}

OutMessage OutMessage::WithSeq(uint64_t seq) const {
  TROUPE_CHECK_MSG(sealed(), "OutMessage::WithSeq on a message that was never sent");
  auto copy = std::make_shared<detail::OutState>();
  copy->parent = state_;
  const auto& seg0 = state_->segments[0];
  copy->seg0_copy.reset(new word[seg0.size()]);
  std::memcpy(copy->seg0_copy.get(), seg0.begin(), seg0.size() * sizeof(word));
  {
    // Patch Envelope.seq in the copy. The root struct lives in segment 0 (it is
    // allocated first), so only its data section is touched; pointers into the
    // other (shared) segments are left as they are.
    capnp::FlatMessageBuilder patch(kj::ArrayPtr<word>(copy->seg0_copy.get(), seg0.size()));
    patch.getRoot<wire::Envelope>().setSeq(seq);
  }
  copy->segments = state_->segments;
  copy->segments[0] = kj::ArrayPtr<const word>(copy->seg0_copy.get(), seg0.size());
  copy->FinishSeal();
  TROUPE_CHECK_EQ(copy->sealed_root.getSeq(), seq);
  return OutMessage(std::move(copy));
}

size_t OutMessage::ByteSize() const {
  if (sealed()) return state_->total_bytes;
  size_t n = 0;
  for (auto s : state_->builder->getSegmentsForOutput()) n += s.size() * sizeof(word);
  return n;
}

size_t OutMessage::segment_count() const {
  if (sealed()) return state_->segments.size();
  return state_->builder->getSegmentsForOutput().size();
}

size_t OutMessage::copied_tensor_bytes() const {
  return state_->copied_tensor_bytes;
}

// ---------------------------------------------------------------- framing

namespace {

template <typename T>
void PutLE(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));  // x86-64 / aarch64: little-endian
}
template <typename T>
T GetLE(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

size_t HeaderBytes(size_t segments) {
  return RoundUpToWord(kHeaderFixedBytes + 4 * segments);
}

}  // namespace

void EncodeHeader(const OutMessage& message, uint64_t ack_floor, std::string* out) {
  TROUPE_CHECK(message.sealed());
  const auto& segs = message.state()->segments;
  out->assign(HeaderBytes(segs.size()), '\0');
  char* p = out->data();
  PutLE<uint32_t>(p, kHeaderMagic);
  PutLE<uint16_t>(p + 4, kFrameFormatVersion);
  PutLE<uint16_t>(p + 6, 0);
  PutLE<uint32_t>(p + 8, static_cast<uint32_t>(segs.size()));
  PutLE<uint32_t>(p + 12, 0);
  PutLE<uint64_t>(p + 16, ack_floor);
  for (size_t i = 0; i < segs.size(); ++i) {
    PutLE<uint32_t>(p + kHeaderFixedBytes + 4 * i, static_cast<uint32_t>(segs[i].size()));
  }
}

std::vector<EncodedSegment> Segments(const OutMessage& message) {
  TROUPE_CHECK(message.sealed());
  std::vector<EncodedSegment> out;
  out.reserve(message.state()->segments.size());
  for (auto s : message.state()->segments) out.push_back({s.begin(), s.size() * sizeof(word)});
  return out;
}

// ---------------------------------------------------------------- InMessage

namespace detail {

struct InState {
  FrameSet frames;
  std::shared_ptr<SegmentBufferPool> pool;
  std::vector<std::pair<std::unique_ptr<uint64_t[]>, size_t>> copies;
  std::vector<kj::ArrayPtr<const word>> segments;
  std::unique_ptr<capnp::SegmentArrayMessageReader> reader;
  wire::Envelope::Reader root;
  uint64_t ack_floor = 0;
  size_t bytes = 0;

  ~InState() {
    reader.reset();
    if (pool) {
      for (auto& c : copies) pool->Give(std::move(c.first), c.second);
    }
  }
};

}  // namespace detail

wire::Envelope::Reader InMessage::envelope() const {
  TROUPE_CHECK_MSG(valid(), "InMessage::envelope() on an empty message");
  return state_->root;
}
std::string_view InMessage::sender() const {
  auto s = envelope().getSender();
  return std::string_view(s.cStr(), s.size());
}
uint64_t InMessage::ack_floor() const {
  return state_->ack_floor;
}
size_t InMessage::ByteSize() const {
  return state_->bytes;
}
const std::vector<FrameRef>& InMessage::frames() const {
  return state_->frames.frames;
}
size_t InMessage::copied_segments() const {
  return state_->copies.size();
}
std::shared_ptr<const void> InMessage::KeepAlive() const {
  return state_;
}

namespace {

// ---- Deep validation ----------------------------------------------------
//
// Reads every present pointer of the message the way generated accessors
// would (so any malformed pointer, list or Text throws here, inside
// DecodeMessage's try, instead of in application code) and validates every
// wire::Tensor. The walk follows a plan compiled once from the schema: per
// struct type, its pointer slots with their types, plus unions (discriminant
// offset -> member slots); groups are flattened into their parent. Reading
// through AnyStruct/AnyPointer costs a few ns per pointer, ~50x less than
// capnp's dynamic API.

struct StructPlan;

struct Slot {
  enum Kind : uint8_t { kText, kData, kStruct, kListText, kListData, kListStruct, kListPrim, kAny };
  Kind kind = kAny;
  uint32_t ptr_index = 0;
  capnp::schema::Type::Which prim = capnp::schema::Type::VOID;  // kListPrim element type
  const StructPlan* plan = nullptr;                             // kStruct / kListStruct
  std::string name;                                             // "body.rolloutBatch"
};

struct FieldsPlan;
struct UnionPlan {
  uint32_t discriminant_offset = 0;  // in 16-bit units of the data section
  std::vector<std::pair<uint16_t, std::unique_ptr<FieldsPlan>>> members;
};
struct FieldsPlan {
  std::vector<Slot> slots;
  std::vector<UnionPlan> unions;
};
struct StructPlan {
  bool is_tensor = false;
  FieldsPlan fields;
};

class PlanBuilder {
 public:
  const StructPlan* For(capnp::StructSchema schema) {
    const uint64_t id = schema.getProto().getId();
    auto it = plans_.find(id);
    if (it != plans_.end()) return it->second.get();
    auto plan = std::make_unique<StructPlan>();
    StructPlan* raw = plan.get();
    plans_.emplace(id, std::move(plan));  // before recursing: recursive types terminate
    raw->is_tensor = id == capnp::typeId<wire::Tensor>();
    if (!raw->is_tensor) AddFields(schema, "", &raw->fields);
    return raw;
  }

 private:
  void AddFields(capnp::StructSchema schema, const std::string& prefix, FieldsPlan* out) {
    for (auto field : schema.getNonUnionFields()) AddField(field, prefix, out);
    auto union_fields = schema.getUnionFields();
    if (union_fields.size() == 0) return;
    UnionPlan u;
    u.discriminant_offset = schema.getProto().getStruct().getDiscriminantOffset();
    for (auto field : union_fields) {
      auto member = std::make_unique<FieldsPlan>();
      AddField(field, prefix, member.get());
      if (!member->slots.empty() || !member->unions.empty()) {
        u.members.emplace_back(field.getProto().getDiscriminantValue(), std::move(member));
      }
    }
    if (!u.members.empty()) out->unions.push_back(std::move(u));
  }

  void AddField(capnp::StructSchema::Field field, const std::string& prefix, FieldsPlan* out) {
    const std::string name = prefix + field.getProto().getName().cStr();
    if (field.getProto().isGroup()) {
      AddFields(field.getType().asStruct(), name + ".", out);
      return;
    }
    auto type = field.getType();
    Slot slot;
    slot.name = name;
    slot.ptr_index = field.getProto().getSlot().getOffset();
    switch (type.which()) {
      case capnp::schema::Type::TEXT:
        slot.kind = Slot::kText;
        break;
      case capnp::schema::Type::DATA:
        slot.kind = Slot::kData;
        break;
      case capnp::schema::Type::STRUCT:
        slot.kind = Slot::kStruct;
        slot.plan = For(type.asStruct());
        break;
      case capnp::schema::Type::LIST: {
        auto elem = type.asList().getElementType();
        switch (elem.which()) {
          case capnp::schema::Type::TEXT:
            slot.kind = Slot::kListText;
            break;
          case capnp::schema::Type::DATA:
            slot.kind = Slot::kListData;
            break;
          case capnp::schema::Type::STRUCT:
            slot.kind = Slot::kListStruct;
            slot.plan = For(elem.asStruct());
            break;
          case capnp::schema::Type::LIST:
          case capnp::schema::Type::ANY_POINTER:
          case capnp::schema::Type::INTERFACE:
            slot.kind = Slot::kAny;
            break;
          default:
            slot.kind = Slot::kListPrim;
            slot.prim = elem.which();
            break;
        }
        break;
      }
      case capnp::schema::Type::ANY_POINTER:
      case capnp::schema::Type::INTERFACE:
        slot.kind = Slot::kAny;
        break;
      default:
        return;  // not a pointer: nothing to validate
    }
    out->slots.push_back(std::move(slot));
  }

  std::map<uint64_t, std::unique_ptr<StructPlan>> plans_;
};

const StructPlan& EnvelopePlan() {
  static const StructPlan* plan = [] {
    static PlanBuilder* builder = new PlanBuilder();  // lives for the process
    return builder->For(capnp::Schema::from<wire::Envelope>());
  }();
  return *plan;
}

class DeepValidator {
 public:
  // Ok, or the first tensor/structure error (kj exceptions propagate).
  Status Run(capnp::AnyStruct::Reader root, const StructPlan& plan) {
    Walk(root, plan);
    return std::move(error_);
  }

 private:
  // Each returns false after recording an error in error_.
  bool Walk(capnp::AnyStruct::Reader s, const StructPlan& plan) {
    if (plan.is_tensor) {
      if (ReadTensor(s.as<wire::Tensor>(), "tensor").ok()) return true;
      error_ = ReadTensor(s.as<wire::Tensor>(), Path()).status();  // again, naming the field
      return false;
    }
    return Fields(s, plan.fields);
  }

  bool Fields(capnp::AnyStruct::Reader s, const FieldsPlan& f) {
    auto ptrs = s.getPointerSection();
    const unsigned nptrs = ptrs.size();
    // The pointer words themselves: in Cap'n Proto's layout the pointer
    // section directly follows the data section (struct pointers and list
    // elements alike), and both were bounds-checked when `s` was read. A zero
    // word is a null pointer: skip it without a call into the library, which
    // is most slots of a sparse struct.
    const kj::byte* raw = s.getDataSection().end();
    for (const Slot& slot : f.slots) {
      if (slot.ptr_index >= nptrs) continue;  // older/smaller struct: default (null)
      uint64_t word_bits;
      std::memcpy(&word_bits, raw + slot.ptr_index * 8, 8);
      if (word_bits == 0) continue;
      if (!Pointer(ptrs[slot.ptr_index], slot)) return false;
    }
    if (f.unions.empty()) return true;
    auto data = s.getDataSection();
    for (const auto& u : f.unions) {
      uint16_t disc = 0;
      if ((u.discriminant_offset + 1) * 2 <= data.size()) {
        std::memcpy(&disc, data.begin() + u.discriminant_offset * 2, 2);
      }
      for (const auto& [value, member] : u.members) {
        if (value == disc) {
          if (!Fields(s, *member)) return false;
          break;
        }
      }
    }
    return true;
  }

  template <typename T>
  static void ReadAll(capnp::AnyPointer::Reader p) {
    auto list = p.getAs<capnp::List<T>>();
    for (unsigned i = 0; i < list.size(); ++i) (void)list[i];
  }

  bool Pointer(capnp::AnyPointer::Reader p, const Slot& slot) {
    using W = capnp::schema::Type;
    switch (slot.kind) {
      case Slot::kText:
        (void)p.getAs<capnp::Text>();  // throws unless NUL-terminated and in bounds
        return true;
      case Slot::kData:
        (void)p.getAs<capnp::Data>();
        return true;
      case Slot::kStruct: {
        names_.push_back(&slot.name);
        const bool ok = Walk(p.getAs<capnp::AnyStruct>(), *slot.plan);
        if (ok) names_.pop_back();
        return ok;
      }
      case Slot::kListStruct: {
        names_.push_back(&slot.name);
        auto any = p.getAs<capnp::AnyList>();
        if (any.getElementSize() == capnp::ElementSize::BIT) {
          // Generated accessors refuse to read a bit list as a struct list.
          error_ = Malformed("{}: a bit list where a list of structs was expected", Path());
          return false;
        }
        auto list = any.as<capnp::List<capnp::AnyStruct>>();
        names_.push_back(nullptr);
        index_.push_back(0);
        for (unsigned i = 0; i < list.size(); ++i) {
          index_.back() = i;
          if (!Walk(list[i], *slot.plan)) return false;
        }
        index_.pop_back();
        names_.pop_back();
        names_.pop_back();
        return true;
      }
      case Slot::kListText:
        ReadAll<capnp::Text>(p);
        return true;
      case Slot::kListData:
        ReadAll<capnp::Data>(p);
        return true;
      case Slot::kListPrim:
        switch (slot.prim) {
          case W::BOOL:
            (void)p.getAs<capnp::List<bool>>();
            break;
          case W::INT8:
          case W::UINT8:
            (void)p.getAs<capnp::List<uint8_t>>();
            break;
          case W::INT16:
          case W::UINT16:
          case W::ENUM:
            (void)p.getAs<capnp::List<uint16_t>>();
            break;
          case W::INT32:
          case W::UINT32:
          case W::FLOAT32:
            (void)p.getAs<capnp::List<uint32_t>>();
            break;
          case W::INT64:
          case W::UINT64:
          case W::FLOAT64:
            (void)p.getAs<capnp::List<uint64_t>>();
            break;
          default:
            (void)p.targetSize();
            break;
        }
        return true;
      case Slot::kAny:
        (void)p.targetSize();  // structural check of everything below
        return true;
    }
    return true;
  }

  std::string Path() const {
    std::string out;
    size_t idx = 0;
    for (const std::string* name : names_) {
      if (name == nullptr) {
        out += fmt::format("[{}]", index_[idx++]);
      } else {
        if (!out.empty()) out += '.';
        out += *name;
      }
    }
    return out;
  }

  Status error_;
  std::vector<const std::string*> names_;
  std::vector<unsigned> index_;
};

Status Reject(TransportCounters* counters, RejectReason reason, Status st) {
  if (counters) counters->Reject(reason);
  return st;
}

}  // namespace

Result<InMessage> DecodeMessage(FrameSet frames, const DecodeLimits& limits,
                                TransportCounters* counters,
                                std::shared_ptr<SegmentBufferPool> pool) {
  const auto& fr = frames.frames;
  if (fr.size() < 2) {
    return Reject(counters, RejectReason::kTruncated,
                  Malformed("message has {} frame(s); a Troupe message is a header frame plus at "
                            "least one segment frame",
                            fr.size()));
  }
  const char* h = static_cast<const char*>(fr[0].data);
  const size_t hsize = fr[0].size;
  if (hsize < 4) {
    return Reject(counters, RejectReason::kTruncated,
                  Malformed("header frame is {} bytes, shorter than the {}-byte fixed header",
                            hsize, kHeaderFixedBytes));
  }
  const uint32_t magic = GetLE<uint32_t>(h);
  if (magic != kHeaderMagic) {
    return Reject(counters, RejectReason::kBadMagic,
                  Malformed("header frame starts with 0x{:08x}, not the Troupe magic 0x{:08x}: "
                            "not a Troupe message",
                            magic, kHeaderMagic));
  }
  if (hsize < kHeaderFixedBytes) {
    return Reject(counters, RejectReason::kTruncated,
                  Malformed("header frame is {} bytes, shorter than the {}-byte fixed header",
                            hsize, kHeaderFixedBytes));
  }
  const uint16_t version = GetLE<uint16_t>(h + 4);
  if (version != kFrameFormatVersion) {
    return Reject(counters, RejectReason::kFrameVersion,
                  ProtocolError("frame format version {} is not supported (this build speaks {})",
                                version, kFrameFormatVersion));
  }
  const uint32_t nseg = GetLE<uint32_t>(h + 8);
  if (nseg == 0) {
    return Reject(counters, RejectReason::kSegmentTable,
                  Malformed("segment table lists 0 segments"));
  }
  if (nseg > limits.max_segments) {
    return Reject(counters, RejectReason::kTooManySegments,
                  ResourceExhausted("message has {} segments, over the limit of {} "
                                    "(limits.max_segments)",
                                    nseg, limits.max_segments));
  }
  if (hsize != HeaderBytes(nseg)) {
    return Reject(counters, RejectReason::kSegmentTable,
                  Malformed("header frame is {} bytes but a table of {} segments takes {} bytes",
                            hsize, nseg, HeaderBytes(nseg)));
  }
  if (fr.size() - 1 != nseg) {
    return Reject(counters, RejectReason::kSegmentTable,
                  Malformed("segment table lists {} segments but {} segment frames arrived", nseg,
                            fr.size() - 1));
  }
  uint64_t total = 0;
  for (size_t i = 1; i < fr.size(); ++i) total += fr[i].size;
  if (total > limits.max_message_bytes) {
    return Reject(counters, RejectReason::kTooLarge,
                  ResourceExhausted("message is {} bytes, over the limit of {} bytes "
                                    "(limits.max_message_bytes)",
                                    total, limits.max_message_bytes));
  }

  auto state = std::make_shared<detail::InState>();
  state->pool = std::move(pool);
  state->ack_floor = GetLE<uint64_t>(h + 16);
  state->bytes = total;
  state->segments.reserve(nseg);
  for (uint32_t i = 0; i < nseg; ++i) {
    const uint64_t words = GetLE<uint32_t>(h + kHeaderFixedBytes + 4 * i);
    const FrameRef& f = fr[i + 1];
    if (words * 8 != f.size) {
      return Reject(
          counters, RejectReason::kSegmentTable,
          Malformed("segment {}: the table says {} words ({} bytes) but its frame has {} bytes{}",
                    i, words, words * 8, f.size,
                    words * 8 > f.size ? " (points past the end)" : ""));
    }
    if (words == 0) {
      return Reject(counters, RejectReason::kSegmentTable,
                    Malformed("segment {} is empty; every segment holds at least one word", i));
    }
    const word* p = static_cast<const word*>(f.data);
    if (reinterpret_cast<uintptr_t>(f.data) % 8 != 0) {
      size_t cap = 0;
      std::unique_ptr<uint64_t[]> buf;
      if (state->pool) {
        buf = state->pool->Take(f.size, &cap);
      } else {
        cap = f.size;
        buf.reset(new uint64_t[f.size / 8]);
      }
      std::memcpy(buf.get(), f.data, f.size);
      p = reinterpret_cast<const word*>(buf.get());
      state->copies.emplace_back(std::move(buf), cap);
      if (counters) {
        Bump(counters->unaligned_copies);
        Bump(counters->unaligned_copy_bytes, f.size);
      }
    }
    state->segments.emplace_back(p, words);
  }
  state->frames = std::move(frames);

  capnp::ReaderOptions ro;
  ro.traversalLimitInWords = limits.traversal_limit_words;
  ro.nestingLimit = limits.nesting_limit;
  auto seg_array =
      kj::ArrayPtr<const kj::ArrayPtr<const word>>(state->segments.data(), state->segments.size());
  try {
    {
      // Validation pass on its own reader so the application's reader starts
      // with a full traversal budget.
      capnp::SegmentArrayMessageReader check(seg_array, ro);
      auto root = check.getRoot<wire::Envelope>();
      const uint16_t sv = root.getSchemaVersion();
      if (sv != wire::SCHEMA_VERSION) {
        return Reject(counters, RejectReason::kSchemaVersion,
                      ProtocolError("schema version {} from '{}' does not match this build's {}",
                                    sv, root.getSender().cStr(), wire::SCHEMA_VERSION));
      }
      const auto kind = root.getBody().which();
      if (static_cast<uint16_t>(kind) > static_cast<uint16_t>(MaxKnownKind())) {
        return Reject(counters, RejectReason::kUnknownKind,
                      ProtocolError("unknown message kind (union ordinal {}) from '{}'; this build "
                                    "knows kinds up to {}",
                                    static_cast<int>(kind), root.getSender().cStr(),
                                    static_cast<int>(MaxKnownKind())));
      }
      if (limits.validate_deep) {
        DeepValidator v;
        Status st = v.Run(check.getRoot<capnp::AnyStruct>(), EnvelopePlan());
        if (!st.ok()) {
          return Reject(
              counters,
              st.code() == Code::kMalformed ? RejectReason::kCapnp : RejectReason::kBadTensor,
              Status(st.code(),
                     fmt::format("{} (from '{}')", st.message(), root.getSender().cStr())));
        }
      }
    }
    state->reader = std::make_unique<capnp::SegmentArrayMessageReader>(seg_array, ro);
    state->root = state->reader->getRoot<wire::Envelope>();
  } catch (const kj::Exception& e) {
    return Reject(counters, RejectReason::kCapnp,
                  Malformed("Cap'n Proto rejected the message: {}",
                            Printable(std::string_view(e.getDescription().cStr(),
                                                       e.getDescription().size()))));
  } catch (const std::exception& e) {
    return Reject(counters, RejectReason::kCapnp,
                  Malformed("Cap'n Proto rejected the message: {}", e.what()));
  }
  if (counters) {
    Bump(counters->messages_received);
    Bump(counters->bytes_received, total);
  }
  InMessage m;
  m.state_ = std::move(state);
  return m;
}

}  // namespace troupe::transport
