// Packing, unpacking and checksums of the bucketed weight stream (layout.h).
#include "troupe/broadcast/layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>

namespace troupe::broadcast {
namespace {

constexpr uint64_t kMinBucketBytes = 4096;
constexpr uint64_t kMaxBucketBytes = uint64_t{4} << 30;
constexpr uint64_t kMinChunkBytes = 4096;
constexpr uint64_t kMaxChunkBytes = uint64_t{256} << 20;
constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxDims = 16;

uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

Result<DType> FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kDouble:
      return DType::kFloat64;
    case at::kChar:
      return DType::kInt8;
    case at::kByte:
      return DType::kUInt8;
    case at::kShort:
      return DType::kInt16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kBool:
      return DType::kBool;
    default:
      return InvalidArgument("unsupported tensor dtype {}", c10::toString(t));
  }
}

at::ScalarType ToScalarType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kInt8:
      return at::kChar;
    case DType::kUInt8:
      return at::kByte;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt64:
      return at::kLong;
    case DType::kBool:
      return at::kBool;
  }
  return at::kByte;
}

bool ValidDType(DType d) {
  return static_cast<int>(d) < kNumDTypes;
}

// Element count of `shape`, or nullopt on a negative size or overflow past `limit`.
std::optional<uint64_t> Numel(const std::vector<int64_t>& shape, uint64_t limit) {
  uint64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return std::nullopt;
    if (s != 0 && n > limit / static_cast<uint64_t>(s)) return std::nullopt;
    n *= static_cast<uint64_t>(s);
  }
  return n;
}

inline uint64_t Rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
// Odd 64-bit multipliers (arbitrary, high bit entropy).
constexpr uint64_t kM1 = 0x8EBC6AF09C88C6E3ULL;
constexpr uint64_t kM2 = 0x589965CC75374CC3ULL;
constexpr uint64_t kM3 = 0x1D8E4E27C47D124FULL;
constexpr uint64_t kM4 = 0xE7037ED1A0B428DBULL;

inline uint64_t Lane(uint64_t acc, uint64_t word) {
  return Rotl(acc ^ (word * kM1), 29) * kM2;
}
inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 31;
  h *= kM3;
  h ^= h >> 29;
  h *= kM4;
  h ^= h >> 32;
  return h;
}

}  // namespace

size_t ItemSize(DType d) {
  switch (d) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kInt8:
      return 1;
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "invalid";
}

uint64_t Layout::num_buckets() const {
  return bucket_bytes == 0 ? 0 : (total_bytes + bucket_bytes - 1) / bucket_bytes;
}
uint64_t Layout::bucket_begin(uint64_t b) const {
  return b * bucket_bytes;
}
uint64_t Layout::bucket_end(uint64_t b) const {
  return std::min(total_bytes, (b + 1) * bucket_bytes);
}
uint64_t Layout::num_chunks() const {
  return chunk_bytes == 0 ? 0 : (total_bytes + chunk_bytes - 1) / chunk_bytes;
}

bool Layout::SameTensors(const Layout& o) const {
  if (total_bytes != o.total_bytes || slots.size() != o.slots.size()) return false;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& a = slots[i];
    const Slot& b = o.slots[i];
    if (a.name != b.name || a.dtype != b.dtype || a.wire != b.wire || a.shape != b.shape ||
        a.offset != b.offset || a.bytes != b.bytes)
      return false;
  }
  return true;
}

Status Layout::ValidateReceived(uint64_t max_total_bytes) const {
  if (bucket_bytes < kMinBucketBytes || bucket_bytes > kMaxBucketBytes)
    return Malformed("manifest bucketBytes {} outside [{}, {}]", bucket_bytes, kMinBucketBytes,
                     kMaxBucketBytes);
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes)
    return Malformed("manifest chunkBytes {} outside [{}, {}]", chunk_bytes, kMinChunkBytes,
                     kMaxChunkBytes);
  if (total_bytes > max_total_bytes)
    return ResourceExhausted("manifest totalBytes {} exceeds the receiver limit {}", total_bytes,
                             max_total_bytes);
  if (!checksums.empty() && checksums.size() != num_buckets())
    return Malformed("manifest has {} bucket checksums for {} buckets", checksums.size(),
                     num_buckets());
  std::unordered_set<std::string_view> names;
  names.reserve(slots.size());
  uint64_t end_prev = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (s.name.empty() || s.name.size() > kMaxNameBytes)
      return Malformed("tensor #{} has a name of {} bytes (1..{} allowed)", i, s.name.size(),
                       kMaxNameBytes);
    if (!names.insert(s.name).second) return Malformed("tensor name '{}' appears twice", s.name);
    if (!ValidDType(s.dtype) || !ValidDType(s.wire))
      return Malformed("tensor '{}' has an unknown dtype", s.name);
    bool cast = s.wire != s.dtype;
    if (cast && !(wire_dtype == WireDtype::kBFloat16 && s.dtype == DType::kFloat32 &&
                  s.wire == DType::kBFloat16))
      return Malformed("tensor '{}' travels as {} but is stored as {}", s.name, DTypeName(s.wire),
                       DTypeName(s.dtype));
    if (s.shape.size() > kMaxDims)
      return Malformed("tensor '{}' has {} dims (max {})", s.name, s.shape.size(), kMaxDims);
    auto numel = Numel(s.shape, max_total_bytes);
    if (!numel) return Malformed("tensor '{}' has a negative or overflowing shape", s.name);
    if (*numel * ItemSize(s.wire) != s.bytes)
      return Malformed("tensor '{}': {} bytes on the wire, shape and dtype need {}", s.name,
                       s.bytes, *numel * ItemSize(s.wire));
    if (s.offset % kSlotAlignment != 0)
      return Malformed("tensor '{}' offset {} is not {}-byte aligned", s.name, s.offset,
                       kSlotAlignment);
    if (s.offset < end_prev)
      return Malformed("tensor '{}' at offset {} overlaps the previous one (ends at {})", s.name,
                       s.offset, end_prev);
    if (s.offset > total_bytes || s.bytes > total_bytes - s.offset)
      return Malformed("tensor '{}' [{}, +{}) runs past the stream end {}", s.name, s.offset,
                       s.bytes, total_bytes);
    end_prev = s.offset + s.bytes;
  }
  return Status::Ok();
}

Result<Layout> PlanLayout(const NamedTensors& named, WireDtype wire_dtype, uint64_t bucket_bytes,
                          uint64_t chunk_bytes) {
  if (bucket_bytes < kMinBucketBytes || bucket_bytes > kMaxBucketBytes)
    return InvalidArgument("bucket_bytes {} outside [{}, {}]", bucket_bytes, kMinBucketBytes,
                           kMaxBucketBytes);
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes)
    return InvalidArgument("chunk_bytes {} outside [{}, {}]", chunk_bytes, kMinChunkBytes,
                           kMaxChunkBytes);
  Layout layout;
  layout.wire_dtype = wire_dtype;
  layout.bucket_bytes = bucket_bytes;
  layout.chunk_bytes = chunk_bytes;
  layout.slots.reserve(named.size());
  std::unordered_set<std::string_view> names;
  names.reserve(named.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, t] = named[i];
    if (name.empty() || name.size() > kMaxNameBytes)
      return InvalidArgument("tensor #{} has a name of {} bytes (1..{} allowed)", i, name.size(),
                             kMaxNameBytes);
    if (!names.insert(name).second) return InvalidArgument("tensor name '{}' appears twice", name);
    if (!t.defined()) return InvalidArgument("tensor '{}' is undefined", name);
    if (!t.device().is_cpu() && !t.device().is_cuda())
      return InvalidArgument("tensor '{}' is on {}; only CPU and CUDA tensors are broadcast", name,
                             t.device().str());
    if (t.layout() != at::kStrided || t.is_quantized())
      return InvalidArgument("tensor '{}' is not a dense strided tensor", name);
    if (t.dim() > static_cast<int64_t>(kMaxDims))
      return InvalidArgument("tensor '{}' has {} dims (max {})", name, t.dim(), kMaxDims);
    auto dtype = FromScalarType(t.scalar_type());
    if (!dtype.ok()) return dtype.status().WithContext(fmt::format("tensor '{}'", name));
    Slot slot;
    slot.name = name;
    slot.dtype = *dtype;
    slot.wire = (wire_dtype == WireDtype::kBFloat16 && *dtype == DType::kFloat32) ? DType::kBFloat16
                                                                                  : *dtype;
    slot.shape.assign(t.sizes().begin(), t.sizes().end());
    slot.offset = AlignUp(offset, kSlotAlignment);
    slot.bytes = static_cast<uint64_t>(t.numel()) * ItemSize(slot.wire);
    offset = slot.offset + slot.bytes;
    layout.slots.push_back(std::move(slot));
  }
  layout.total_bytes = offset;
  return layout;
}

Status PackTensors(const NamedTensors& named, const Layout& layout, uint8_t* flat,
                   at::Device flat_device) {
  if (named.size() != layout.slots.size())
    return InvalidArgument("{} tensors for a layout of {}", named.size(), layout.slots.size());
  if (!flat_device.is_cpu() && !flat_device.is_cuda())
    return InvalidArgument("a stream on {}: only host or CUDA memory", flat_device.str());
  const bool host = flat_device.is_cpu();
  at::NoGradGuard no_grad;
  // A device stream is zeroed in one pass (padding included), then the tensors go in.
  if (!host && layout.total_bytes > 0) {
    at::from_blob(flat, {static_cast<int64_t>(layout.total_bytes)},
                  at::TensorOptions().dtype(at::kByte).device(flat_device))
        .zero_();
  }
  uint64_t written = 0;
  for (size_t i = 0; i < named.size(); ++i) {
    const Slot& slot = layout.slots[i];
    const at::Tensor& t = named[i].second;
    if (named[i].first != slot.name || !t.defined() ||
        !t.sizes().equals(c10::IntArrayRef(slot.shape)) ||
        t.scalar_type() != ToScalarType(slot.dtype) ||
        !(t.device().is_cpu() || t.device().is_cuda()))
      return InvalidArgument(
          "tensor #{} '{}' does not match the planned layout (name, shape, "
          "dtype or device changed)",
          i, named[i].first);
    if (host && slot.offset > written) std::memset(flat + written, 0, slot.offset - written);
    uint8_t* dst = flat + slot.offset;
    if (slot.bytes != 0) {
      if (host && t.device().is_cpu() && slot.wire == slot.dtype && t.is_contiguous()) {
        std::memcpy(dst, t.data_ptr(), slot.bytes);
      } else {
        // torch moves the bytes: D2H into a host stream, H2D or D2D into a device one.
        at::Tensor view =
            at::from_blob(dst, slot.shape,
                          at::TensorOptions().dtype(ToScalarType(slot.wire)).device(flat_device));
        view.copy_(t);
      }
    }
    written = slot.offset + slot.bytes;
  }
  if (host && layout.total_bytes > written)
    std::memset(flat + written, 0, layout.total_bytes - written);
  return Status::Ok();
}

uint64_t Checksum64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t a = seed ^ kM1, b = seed ^ kM2, c = seed ^ kM3, d = seed ^ kM4;
  size_t n = size;
  while (n >= 32) {
    a = Lane(a, Load64(p));
    b = Lane(b, Load64(p + 8));
    c = Lane(c, Load64(p + 16));
    d = Lane(d, Load64(p + 24));
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    a = Lane(a, Load64(p));
    std::swap(a, b);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    c = Lane(c, tail ^ (uint64_t{n} << 56));
  }
  uint64_t h = static_cast<uint64_t>(size) * kM3;
  h = Rotl(h ^ Avalanche(a), 17) * kM1;
  h = Rotl(h ^ Avalanche(b), 17) * kM2;
  h = Rotl(h ^ Avalanche(c), 17) * kM3;
  h = Rotl(h ^ Avalanche(d), 17) * kM4;
  return Avalanche(h);
}

void ComputeChecksums(Layout* layout, const uint8_t* flat) {
  layout->checksums.resize(layout->num_buckets());
  for (uint64_t b = 0; b < layout->num_buckets(); ++b)
    layout->checksums[b] = Checksum64(flat + layout->bucket_begin(b),
                                      layout->bucket_end(b) - layout->bucket_begin(b), b);
}

Status VerifyChecksums(const Layout& layout, const uint8_t* flat) {
  if (layout.checksums.empty()) return Status::Ok();
  for (uint64_t b = 0; b < layout.num_buckets(); ++b) {
    uint64_t got =
        Checksum64(flat + layout.bucket_begin(b), layout.bucket_end(b) - layout.bucket_begin(b), b);
    if (got != layout.checksums[b])
      return Malformed("bucket {} of version {} is corrupted: checksum {:016x}, expected {:016x}",
                       b, layout.version, got, layout.checksums[b]);
  }
  return Status::Ok();
}

uint64_t StreamChecksum(const Layout& layout) {
  if (layout.checksums.empty()) return 0;
  return Checksum64(layout.checksums.data(), layout.checksums.size() * sizeof(uint64_t),
                    layout.version);
}

uint64_t CastAreaBytes(const Layout& layout) {
  uint64_t bytes = 0;
  for (const Slot& s : layout.slots) {
    if (s.wire == s.dtype) continue;
    bytes = AlignUp(bytes, kSlotAlignment) + (s.bytes / ItemSize(s.wire)) * ItemSize(s.dtype);
  }
  return bytes;
}

Result<NamedTensors> UnpackTensors(const Layout& layout, const uint8_t* flat,
                                   std::shared_ptr<void> flat_owner, uint8_t* cast_area,
                                   std::shared_ptr<void> cast_owner, at::Device flat_device) {
  if (!flat_device.is_cpu() && !flat_device.is_cuda())
    return InvalidArgument("a stream on {}: only host or CUDA memory", flat_device.str());
  at::NoGradGuard no_grad;
  NamedTensors out;
  out.reserve(layout.slots.size());
  uint64_t cast_offset = 0;
  auto keep_flat = [flat_owner](void*) {};
  auto keep_cast = [cast_owner](void*) {};
  for (const Slot& s : layout.slots) {
    at::TensorOptions opts = at::TensorOptions().dtype(ToScalarType(s.dtype)).device(flat_device);
    at::Tensor t;
    if (s.bytes == 0) {
      t = at::empty(s.shape, opts);
    } else if (s.wire == s.dtype) {
      t = at::from_blob(const_cast<uint8_t*>(flat) + s.offset, s.shape, keep_flat, opts);
    } else {
      if (cast_area == nullptr) return Internal("no cast area for down-cast tensor '{}'", s.name);
      cast_offset = AlignUp(cast_offset, kSlotAlignment);
      t = at::from_blob(cast_area + cast_offset, s.shape, keep_cast, opts);
      at::Tensor src =
          at::from_blob(const_cast<uint8_t*>(flat) + s.offset, s.shape,
                        at::TensorOptions().dtype(ToScalarType(s.wire)).device(flat_device));
      t.copy_(src);
      cast_offset += static_cast<uint64_t>(t.numel()) * ItemSize(s.dtype);
    }
    out.emplace_back(s.name, std::move(t));
  }
  return out;
}

uint64_t DigestTensors(const NamedTensors& named) {
  uint64_t h = named.size();
  for (const auto& [name, t0] : named) {
    h = Checksum64(name.data(), name.size(), h);
    h = Checksum64(t0.sizes().data(), t0.sizes().size() * sizeof(int64_t),
                   h ^ static_cast<uint64_t>(t0.scalar_type()));
    at::Tensor t = t0.device().is_cpu() ? t0.contiguous() : t0.to(at::kCPU).contiguous();
    h = Checksum64(t.data_ptr(), t.nbytes(), h);
  }
  return h;
}

}  // namespace troupe::broadcast
