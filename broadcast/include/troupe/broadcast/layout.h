// Bucketed layout of a weight broadcast: packing, unpacking, checksums.
//
// Every broadcast moves one flat byte stream. Tensors are laid out back to back
// (each start aligned to 64 bytes) in the order given; the stream is cut into
// fixed-size buckets (the last one shorter). A bucket is the unit of a
// collective call and of a checksum, so a model with hundreds of small tensors
// costs a few large transfers, and a tensor larger than a bucket simply spans
// several. With WireDtype::kBFloat16, float32 tensors are rounded to bfloat16
// (round to nearest even) in the stream and cast back by the receiver.
//
// A Layout travels as the WeightsManifest; ValidateReceived() checks one that
// came off the wire before any byte is touched. All functions are pure and
// thread-safe on distinct data.
//
// Devices: tensors may live on the CPU or on CUDA devices, and the stream itself
// in host memory or in one CUDA device's memory (`flat_device`). torch copies
// between them: CUDA tensors into a host stream cost one device-to-host copy,
// into a device stream none through the host. Checksums need a host stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/broadcast/types.h"

namespace troupe::broadcast {

// Element types that may be broadcast; ordinals equal wire::DType's.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt16 = 6,
  kInt32 = 7,
  kInt64 = 8,
  kBool = 9,
};
inline constexpr int kNumDTypes = 10;
size_t ItemSize(DType dtype);
const char* DTypeName(DType dtype);

// Alignment of every tensor inside the stream.
inline constexpr uint64_t kSlotAlignment = 64;

struct Slot {
  std::string name;            // Hugging Face parameter name
  DType dtype;                 // dtype the receiver gets
  DType wire;                  // dtype in the stream (bfloat16 for down-cast float32)
  std::vector<int64_t> shape;  // sizes; empty = scalar
  uint64_t offset = 0;         // absolute byte offset in the stream (multiple of 64)
  uint64_t bytes = 0;          // numel * ItemSize(wire)
};

struct Layout {
  uint64_t version = 0;   // policy version
  uint64_t transfer = 0;  // group epoch, or a catch-up id (kCatchUpBit set)
  uint64_t token = 0;  // random per transfer; its chunks must carry it (the manifest's chunkToken)
  WireDtype wire_dtype = WireDtype::kAsStored;
  uint64_t bucket_bytes = 0;
  uint64_t chunk_bytes = 0;  // pipelining unit of chain paths
  uint64_t total_bytes = 0;  // stream length
  std::vector<Slot> slots;
  std::vector<uint64_t> checksums;  // one per bucket, or empty (no checksums)

  uint64_t num_buckets() const;
  uint64_t bucket_begin(uint64_t bucket) const;
  uint64_t bucket_end(uint64_t bucket) const;
  uint64_t num_chunks() const;
  // Same tensors at the same places (names, dtypes, shapes, offsets): buffers can be reused.
  bool SameTensors(const Layout& other) const;
  // Checks a layout received from the wire: sizes, bounds, overlaps, dtypes, names,
  // bucket/chunk sizes, checksum count. `max_total_bytes` bounds the memory a peer can make
  // us allocate. The error names the field, the value and the limit.
  Status ValidateReceived(uint64_t max_total_bytes) const;
};

// Top bit of Layout::transfer for a newcomer's catch-up (not a group epoch).
inline constexpr uint64_t kCatchUpBit = uint64_t{1} << 63;

// Plans the stream for `named` (tensors on the CPU or CUDA devices). Errors: empty or
// duplicate names, undefined, sparse or quantized tensors, tensors on other devices,
// unsupported dtypes, bad bucket/chunk sizes.
Result<Layout> PlanLayout(const NamedTensors& named, WireDtype wire_dtype, uint64_t bucket_bytes,
                          uint64_t chunk_bytes);

// Copies (and down-casts) `named` into `flat` (layout.total_bytes bytes of host memory, or
// of CUDA memory when `flat_device` is a CUDA device). `named` must match the layout (same
// names, dtypes and shapes, in order); padding bytes are zeroed. Into a host stream the
// copies are complete on return; into a device stream they are queued on torch's current
// stream of that device (a reader on another stream must wait for it: NcclGroup does).
Status PackTensors(const NamedTensors& named, const Layout& layout, uint8_t* flat,
                   at::Device flat_device = at::kCPU);

// 64-bit checksum (not cryptographic: detects corruption, not tampering).
uint64_t Checksum64(const void* data, size_t size, uint64_t seed = 0);
// Fills layout->checksums with one checksum per bucket of `flat`.
void ComputeChecksums(Layout* layout, const uint8_t* flat);
// Verifies layout.checksums (no-op when empty); the error names the first bad bucket.
Status VerifyChecksums(const Layout& layout, const uint8_t* flat);
// One checksum of the whole stream, from its bucket checksums (0 when it has none). Equal on
// the learner and on a receiver whose VerifyChecksums passed: both hold the same bytes.
uint64_t StreamChecksum(const Layout& layout);
// With checksums on, the learner and every receiver log the stream checksum of the first
// version they hold at or past each multiple of kChecksumTraceEvery, so their logs can be
// compared line by line (both see the same sequence of broadcast versions). True when
// `version` is such a version; `*last` is the last one traced (updated).
inline constexpr uint64_t kChecksumTraceEvery = 50;
inline bool TraceChecksum(uint64_t version, uint64_t* last) {
  if (version >= *last && version / kChecksumTraceEvery <= *last / kChecksumTraceEvery &&
      *last != 0)
    return false;
  *last = version;
  return true;
}

// Bytes of receiver memory needed to cast bfloat16 slots back to float32.
uint64_t CastAreaBytes(const Layout& layout);

// Tensors over `flat` (memory of `flat_device`; the tensors live there). Slots stored in their
// own dtype are zero-copy views that keep `flat_owner` alive; down-cast slots are cast back
// into `cast_area` (CastAreaBytes bytes on the same device, kept alive by `cast_owner`; may
// be null when CastAreaBytes is 0).
Result<NamedTensors> UnpackTensors(const Layout& layout, const uint8_t* flat,
                                   std::shared_ptr<void> flat_owner, uint8_t* cast_area,
                                   std::shared_ptr<void> cast_owner,
                                   at::Device flat_device = at::kCPU);

// Checksum over names, dtypes, shapes and bytes of a tensor set (tests and logs compare
// what a receiver holds with what the learner sent). CUDA tensors are copied to the host.
uint64_t DigestTensors(const NamedTensors& named);

}  // namespace troupe::broadcast
