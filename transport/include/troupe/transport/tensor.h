// Tensors on the wire: (dtype, shape, raw bytes), without copies.
//
// Sending: a TensorBytes names bytes the caller owns plus a keep-alive handle;
// OutMessage::SetTensor references them from the message (they become their
// own Cap'n Proto segment and their own ZeroMQ frame) and releases the
// keep-alive when the transport is done with them. Zero-copy needs the bytes
// 8-byte aligned and readable up to the next multiple of 8 (Cap'n Proto pads
// every segment to whole words); TensorBytes::FromVector and AlignedBuffer
// arrange both, anything else is copied once into the message (and counted).
//
// Receiving: ReadTensor validates a wire::Tensor (known dtype, non-negative
// shape, data size == numel * itemsize) and returns a TensorView: a const
// pointer into the received frame, valid while the InMessage (or a handle from
// InMessage::KeepAlive()) lives. No copy is made.
//
// Thread-safety: TensorView and TensorBytes are plain values; AlignedBuffer is
// not synchronised (fill it before handing it to a message).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "troupe/core/check.h"
#include "troupe/core/status.h"
#include "troupe/wire/troupe.capnp.h"

namespace troupe::transport {

// Bytes per element of `dtype`; 0 for a dtype this build does not know.
size_t ItemSize(wire::DType dtype);
// "float32", "int64", ...; "dtype(<n>)" for unknown values.
std::string DTypeName(wire::DType dtype);
// The largest Data blob Cap'n Proto can hold (2^29 - 1 bytes).
inline constexpr size_t kMaxTensorBytes = (size_t{1} << 29) - 1;
// Rounds up to a multiple of 8 (one Cap'n Proto word).
inline constexpr size_t RoundUpToWord(size_t n) {
  return (n + 7) & ~size_t{7};
}

// The wire dtype of a C++ element type (compile-time), e.g. WireDType<int32_t>().
template <typename T>
constexpr wire::DType WireDType() {
  if constexpr (std::is_same_v<T, float>) return wire::DType::FLOAT32;
  if constexpr (std::is_same_v<T, double>) return wire::DType::FLOAT64;
  if constexpr (std::is_same_v<T, int8_t>) return wire::DType::INT8;
  if constexpr (std::is_same_v<T, uint8_t>) return wire::DType::UINT8;
  if constexpr (std::is_same_v<T, int16_t>) return wire::DType::INT16;
  if constexpr (std::is_same_v<T, int32_t>) return wire::DType::INT32;
  if constexpr (std::is_same_v<T, int64_t>) return wire::DType::INT64;
  if constexpr (std::is_same_v<T, bool>) return wire::DType::BOOL;
  static_assert(std::is_arithmetic_v<T>, "no wire dtype for this type");
  return wire::DType::UINT8;
}

// A validated, read-only view of a received tensor. Valid while the message
// it came from lives.
struct TensorView {
  wire::DType dtype = wire::DType::FLOAT32;
  std::vector<int64_t> shape;  // empty = scalar (numel 1)
  const void* data = nullptr;  // into the received frame (8-byte aligned)
  size_t bytes = 0;            // == numel * ItemSize(dtype)
  int64_t numel = 0;

  size_t rank() const { return shape.size(); }
  // Typed pointer; TROUPE_CHECKs that T matches the dtype's item size and kind.
  template <typename T>
  const T* as() const {
    TROUPE_CHECK_MSG(WireDType<T>() == dtype, "TensorView::as<{}> on a {} tensor",
                     DTypeName(WireDType<T>()), DTypeName(dtype));
    return static_cast<const T*>(data);
  }
  // InvalidArgument naming `what` unless the dtype is `expected` and, when
  // rank >= 0, the rank is `rank`.
  Status Expect(std::string_view what, wire::DType expected, int rank = -1) const;
};

// Validates `reader` and returns a view over its bytes (no copy). Errors name
// `what` (e.g. "rolloutBatch.responseTokens"), the dtype, shape and sizes.
Result<TensorView> ReadTensor(wire::Tensor::Reader reader, std::string_view what = "tensor");

// A heap buffer that is 64-byte aligned and whose capacity is rounded up to a
// whole word with zeroed padding, so it can be sent without a copy. Fill it,
// then hand it to TensorBytes::FromBuffer.
class AlignedBuffer {
 public:
  // Allocates `bytes` (contents uninitialised, padding zeroed). Never null.
  static std::shared_ptr<AlignedBuffer> Make(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }

 private:
  AlignedBuffer(void* data, size_t size, size_t capacity)
      : data_(data), size_(size), capacity_(capacity) {}
  void* data_;
  size_t size_;
  size_t capacity_;
};

// Bytes an outgoing message references, plus what keeps them alive.
struct TensorBytes {
  const void* data = nullptr;
  size_t bytes = 0;
  // Bytes readable from `data` (>= bytes). Zero-copy needs data 8-aligned and
  // readable >= RoundUpToWord(bytes); the padding bytes go on the wire, so they
  // must hold no secrets.
  size_t readable = 0;
  // Released (on a transport thread) once no send needs the bytes any more.
  std::shared_ptr<const void> keep_alive;

  // Borrows `data` kept alive by `keep_alive`; `readable` defaults to `bytes`.
  static TensorBytes Borrow(const void* data, size_t bytes, std::shared_ptr<const void> keep_alive,
                            size_t readable = 0);
  // Takes a filled AlignedBuffer (zero-copy).
  static TensorBytes FromBuffer(std::shared_ptr<AlignedBuffer> buffer);
  // Forwards a received tensor without copying (e.g. reward -> learner):
  // `keep_alive` is the source message's InMessage::KeepAlive(). A received
  // view is 8-aligned and its word padding lies inside the received segment.
  static TensorBytes FromView(const TensorView& view, std::shared_ptr<const void> keep_alive) {
    return Borrow(view.data, view.bytes, std::move(keep_alive), RoundUpToWord(view.bytes));
  }
  // Copies `bytes` from `data` into a fresh AlignedBuffer (for small or
  // short-lived data).
  static TensorBytes Copy(const void* data, size_t bytes);
  // Takes ownership of a vector; pads it (zero elements past size(), possibly
  // one reallocation) so it can be sent without a copy.
  template <typename T>
  static TensorBytes FromVector(std::vector<T> v) {
    static_assert(std::is_trivially_copyable_v<T> && 8 % sizeof(T) == 0,
                  "element size must divide 8");
    const size_t bytes = v.size() * sizeof(T);
    v.resize(RoundUpToWord(bytes) / sizeof(T));
    auto owned = std::make_shared<std::vector<T>>(std::move(v));
    const void* p = owned->data();
    return Borrow(p, bytes, std::move(owned), RoundUpToWord(bytes));
  }
};

// Shape argument: a vector or a braced list, e.g. {batch, seq} (up to 8 dims
// for braced lists; vectors of any rank).
class ShapeRef {
 public:
  ShapeRef(std::initializer_list<int64_t> dims) : size_(dims.size()) {
    TROUPE_CHECK_MSG(dims.size() <= inline_.size(),
                     "ShapeRef: {} dims in a braced list; pass a "
                     "std::vector for rank > 8",
                     dims.size());
    size_t i = 0;
    for (int64_t d : dims) inline_[i++] = d;
    begin_ = inline_.data();
  }
  ShapeRef(const std::vector<int64_t>& dims) : begin_(dims.data()), size_(dims.size()) {}
  ShapeRef(const ShapeRef& o) : inline_(o.inline_), size_(o.size_) {
    begin_ = o.begin_ == o.inline_.data() ? inline_.data() : o.begin_;
  }
  ShapeRef& operator=(const ShapeRef&) = delete;
  const int64_t* begin() const { return begin_; }
  const int64_t* end() const { return begin_ + size_; }
  size_t size() const { return size_; }

 private:
  std::array<int64_t, 8> inline_{};
  const int64_t* begin_;
  size_t size_;
};

// numel of `shape`, or InvalidArgument if a dimension is negative or the
// product overflows.
Result<int64_t> NumElements(ShapeRef shape, std::string_view what);

}  // namespace troupe::transport
