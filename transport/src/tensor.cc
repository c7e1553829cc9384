#include "troupe/transport/tensor.h"

#include <cstdlib>
#include <limits>

namespace troupe::transport {

size_t ItemSize(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::FLOAT32:
      return 4;
    case wire::DType::FLOAT16:
      return 2;
    case wire::DType::BFLOAT16:
      return 2;
    case wire::DType::FLOAT64:
      return 8;
    case wire::DType::INT8:
      return 1;
    case wire::DType::UINT8:
      return 1;
    case wire::DType::INT16:
      return 2;
    case wire::DType::INT32:
      return 4;
    case wire::DType::INT64:
      return 8;
    case wire::DType::BOOL:
      return 1;
  }
  return 0;
}

std::string DTypeName(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::FLOAT32:
      return "float32";
    case wire::DType::FLOAT16:
      return "float16";
    case wire::DType::BFLOAT16:
      return "bfloat16";
    case wire::DType::FLOAT64:
      return "float64";
    case wire::DType::INT8:
      return "int8";
    case wire::DType::UINT8:
      return "uint8";
    case wire::DType::INT16:
      return "int16";
    case wire::DType::INT32:
      return "int32";
    case wire::DType::INT64:
      return "int64";
    case wire::DType::BOOL:
      return "bool";
  }
  return fmt::format("dtype({})", static_cast<int>(dtype));
}

Result<int64_t> NumElements(ShapeRef shape, std::string_view what) {
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape.begin()[i];
    if (d < 0) {
      return InvalidArgument("{}: dimension {} is {}; dimensions must be non-negative", what, i, d);
    }
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / d) {
      return InvalidArgument("{}: the element count of the shape overflows int64", what);
    }
    numel *= d;
  }
  return numel;
}

namespace {
std::string ShapeString(ShapeRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape.begin()[i]);
  }
  return s + "]";
}
}  // namespace

Status TensorView::Expect(std::string_view what, wire::DType expected, int want_rank) const {
  if (dtype != expected) {
    return InvalidArgument("{}: expected dtype {}, got {}", what, DTypeName(expected),
                           DTypeName(dtype));
  }
  if (want_rank >= 0 && rank() != static_cast<size_t>(want_rank)) {
    return InvalidArgument("{}: expected rank {}, got rank {} (shape {})", what, want_rank, rank(),
                           ShapeString(shape));
  }
  return Status::Ok();
}

Result<TensorView> ReadTensor(wire::Tensor::Reader reader, std::string_view what) {
  TensorView v;
  v.dtype = reader.getDtype();
  const size_t item = ItemSize(v.dtype);
  if (item == 0) {
    return ProtocolError("{}: unknown dtype {}", what, static_cast<int>(v.dtype));
  }
  auto shape = reader.getShape();
  v.shape.reserve(shape.size());
  for (int64_t d : shape) v.shape.push_back(d);
  auto numel = NumElements(ShapeRef(v.shape), what);
  if (!numel.ok()) return Status(Code::kProtocol, numel.status().message());
  v.numel = *numel;
  auto data = reader.getData();
  v.data = data.begin();
  v.bytes = data.size();
  const uint64_t expected = static_cast<uint64_t>(v.numel);
  if (expected > std::numeric_limits<uint64_t>::max() / item || expected * item != v.bytes) {
    return ProtocolError("{}: {} tensor of shape {} needs {} x {} bytes but carries {} bytes", what,
                         DTypeName(v.dtype), ShapeString(ShapeRef(v.shape)), v.numel, item,
                         v.bytes);
  }
  return v;
}

std::shared_ptr<AlignedBuffer> AlignedBuffer::Make(size_t bytes) {
  const size_t capacity = std::max<size_t>(64, (bytes + 63) & ~size_t{63});
  void* p = std::aligned_alloc(64, capacity);
  TROUPE_CHECK_MSG(p != nullptr, "aligned_alloc of {} bytes failed", capacity);
  // Zero the padding: it goes on the wire.
  std::memset(static_cast<char*>(p) + bytes, 0, capacity - bytes);
  return std::shared_ptr<AlignedBuffer>(new AlignedBuffer(p, bytes, capacity));
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

TensorBytes TensorBytes::Borrow(const void* data, size_t bytes,
                                std::shared_ptr<const void> keep_alive, size_t readable) {
  TensorBytes t;
  t.data = data;
  t.bytes = bytes;
  t.readable = std::max(readable, bytes);
  t.keep_alive = std::move(keep_alive);
  return t;
}

TensorBytes TensorBytes::FromBuffer(std::shared_ptr<AlignedBuffer> buffer) {
  const void* p = buffer->data();
  const size_t size = buffer->size();
  const size_t cap = buffer->capacity();
  return Borrow(p, size, std::move(buffer), cap);
}

TensorBytes TensorBytes::Copy(const void* data, size_t bytes) {
  auto buf = AlignedBuffer::Make(bytes);
  if (bytes) std::memcpy(buf->data(), data, bytes);
  return FromBuffer(std::move(buf));
}

}  // namespace troupe::transport
