// Messages: an outgoing Envelope builder and a validated incoming Envelope.
//
// Framing (docs/transport.md has the byte layout): one Troupe message is one
// multipart ZeroMQ message
//     [header frame][segment 0][segment 1]...[segment N-1]
// The header frame carries a magic, a format version, the per-transmission
// ack floor of reliable delivery and the segment table (sizes in words). Each
// Cap'n Proto segment is its own frame; a tensor referenced with SetTensor is
// its own segment, so its bytes go out without a copy and arrive as a frame of
// their own that TensorView points into.
//
// OutMessage owns a capnp MallocMessageBuilder whose root is wire::Envelope.
// The transport fills schemaVersion, sender, incarnation and sendTimeNs on the
// first send ("sealing"); reliable delivery fills seq. After sealing the
// builder is read-only: a message can be sent again (retransmits, several
// peers) and every in-flight send keeps the segments alive until ZeroMQ is
// done with them. OutMessage is a cheap shared handle; copies share the same
// message. Not thread-safe while building; after sealing, Send() of the same
// message from several threads is safe.
//
// InMessage owns the received frames and a capnp reader built with explicit
// DecodeLimits. DecodeMessage validates everything up front (frames, segment
// table, every pointer, every Text, every Tensor, schema version and kind), so
// reading any field of a decoded message cannot throw. Copyable handle; safe
// to read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <capnp/message.h>

#include "troupe/core/status.h"
#include "troupe/transport/counters.h"
#include "troupe/transport/tensor.h"
#include "troupe/wire/troupe.capnp.h"

namespace troupe::transport {

using MessageKind = wire::Envelope::Body::Which;
// "rolloutBatch", "ack", ...; "kind(<n>)" for values this build does not know.
std::string KindName(MessageKind kind);
// Highest union ordinal this build knows (anything above is "unknown kind").
MessageKind MaxKnownKind();

// Limits applied to every received message (capnp ReaderOptions plus ours).
struct DecodeLimits {
  // Largest accepted message (all segment frames together). Default 256 MiB;
  // larger lets bigger batches through but lets a peer pin more memory.
  uint64_t max_message_bytes = uint64_t{256} << 20;
  // Most segments per message. Default 512 (a batch with 10 tensors needs ~12).
  uint32_t max_segments = 512;
  // capnp traversal limit in 8-byte words, per reader. Must be >=
  // max_message_bytes / 8 (validation reads everything once). Default 64 Mi
  // words (512 MiB of reads): re-reading large lists many times can hit it.
  uint64_t traversal_limit_words = uint64_t{64} << 20;
  // capnp nesting limit (struct/list depth). Default 64.
  int nesting_limit = 64;
  // Walk every field at decode time (Text NUL termination, all tensors). Default
  // true; false makes decode O(1) in the message size but lets a malformed
  // field throw kj::Exception when the application reads it.
  bool validate_deep = true;

  Status Validate() const;
};

// One received frame: a view plus the object that owns its memory.
struct FrameRef {
  const void* data = nullptr;
  size_t size = 0;
};
struct FrameSet {
  std::vector<FrameRef> frames;       // header first, then segments
  std::shared_ptr<const void> owner;  // keeps every frame's memory alive
};

class OutMessage;

// Reused 8-byte-aligned buffers for received segments whose frame data is not
// aligned (ZeroMQ carves small messages out of a shared receive buffer at any
// offset). Each socket owns one; an InMessage returns its buffers when it
// dies. Thread-safe.
class SegmentBufferPool {
 public:
  // Keeps at most `max_buffers` free buffers of at most `max_buffer_bytes`.
  explicit SegmentBufferPool(size_t max_buffers = 16, size_t max_buffer_bytes = size_t{1} << 20);
  ~SegmentBufferPool();
  // A buffer of at least `bytes` (8-byte aligned).
  std::unique_ptr<uint64_t[]> Take(size_t bytes, size_t* capacity_bytes);
  void Give(std::unique_ptr<uint64_t[]> buffer, size_t capacity_bytes);
  size_t reused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
struct OutState;
struct InState;
}  // namespace detail

// Fields the layer stamps on a message at its first send.
struct SealInfo {
  std::string_view sender;  // Envelope.sender when the caller left it empty
  uint64_t incarnation = 0;
};

class OutMessage {
 public:
  // An empty Envelope (body defaults to `register`; set one). The first
  // segment holds 8 KiB; what does not fit goes to further segments.
  OutMessage();
  // Same, with a first segment of at least `size_hint_bytes`. Give a hint when
  // a message carries a lot of non-tensor data (e.g. one SequenceMeta per
  // sequence): everything outside segment 0 is reached through far pointers,
  // and Cap'n Proto 0.9's reader takes a mutex for each of those reads on the
  // receiving side. Tensors referenced with SetTensor are separate segments
  // anyway and need no room here.
  explicit OutMessage(size_t size_hint_bytes);

  // The root builder. TROUPE_CHECKs that the message is not sealed yet.
  wire::Envelope::Builder envelope();
  // Read-only view (valid before and after sealing).
  wire::Envelope::Reader reader() const;
  MessageKind kind() const { return reader().getBody().which(); }

  // Fills `tensor` with dtype, shape and a Data blob referencing `bytes`
  // without copying (when aligned and padded; otherwise one copy into the
  // message, counted in copied_tensor_bytes()). InvalidArgument if the dtype
  // is unknown, a dimension negative, bytes != numel * itemsize, or over
  // kMaxTensorBytes. Must be called before sealing.
  Status SetTensor(wire::Tensor::Builder tensor, wire::DType dtype, ShapeRef shape,
                   TensorBytes bytes);
  // Copies `bytes` into the message (small tensors).
  Status SetTensorCopy(wire::Tensor::Builder tensor, wire::DType dtype, ShapeRef shape,
                       const void* data, size_t bytes);

  // Sets Envelope.seq (reliable delivery does this). Before sealing only.
  void set_seq(uint64_t seq);
  uint64_t seq() const { return reader().getSeq(); }

  // Stamps schemaVersion, sender (if empty), incarnation, sendTimeNs; then the
  // message is read-only. Idempotent and thread-safe; the first call wins.
  void Seal(const SealInfo& info) const;
  bool sealed() const;

  // A sealed copy whose Envelope.seq is `seq`: segment 0 is copied and
  // patched, every other segment (tensors) is shared. Used to re-sequence a
  // message that is re-routed to another peer. Requires sealed().
  OutMessage WithSeq(uint64_t seq) const;

  // Total bytes of all segments once sealed (what goes on the wire, minus the header).
  size_t ByteSize() const;
  size_t segment_count() const;
  // Bytes SetTensor had to copy because they were unaligned or unpadded.
  size_t copied_tensor_bytes() const;

  // Internal: the shared state the framing layer reads.
  const std::shared_ptr<detail::OutState>& state() const { return state_; }

 private:
  explicit OutMessage(std::shared_ptr<detail::OutState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::OutState> state_;
};

class InMessage {
 public:
  InMessage() = default;  // empty; only valid() is callable

  bool valid() const { return state_ != nullptr; }
  wire::Envelope::Reader envelope() const;
  MessageKind kind() const { return envelope().getBody().which(); }
  std::string_view sender() const;
  uint64_t seq() const { return envelope().getSeq(); }
  uint64_t incarnation() const { return envelope().getIncarnation(); }
  // Reliable delivery's ack floor from the header frame (0 when unsequenced).
  uint64_t ack_floor() const;
  // Sum of segment sizes (bytes).
  size_t ByteSize() const;
  // Frames as received (header first), for inspection and tests.
  const std::vector<FrameRef>& frames() const;
  // Number of segments that had to be copied to align them.
  size_t copied_segments() const;
  // Keeps the frames (and so every TensorView into them) alive, e.g. for a
  // torch::from_blob deleter. Thread-safe.
  std::shared_ptr<const void> KeepAlive() const;

  // Same as transport::ReadTensor.
  Result<TensorView> ReadTensor(wire::Tensor::Reader reader,
                                std::string_view what = "tensor") const {
    return transport::ReadTensor(reader, what);
  }

 private:
  friend Result<InMessage> DecodeMessage(FrameSet, const DecodeLimits&, TransportCounters*,
                                         std::shared_ptr<SegmentBufferPool>);
  std::shared_ptr<const detail::InState> state_;
};

// Encoded form of one transmission of `message` (sealed on the way).
struct EncodedSegment {
  const void* data;
  size_t size;
};
// The header frame for `message` with `ack_floor`; `out` is overwritten.
void EncodeHeader(const OutMessage& message, uint64_t ack_floor, std::string* out);
// The segments of a sealed message (pointers stay valid while the message lives).
std::vector<EncodedSegment> Segments(const OutMessage& message);

// Validates `frames` (header + segments) against `limits` and builds the
// reader. Errors: kMalformed (truncated, bad magic, segment table, capnp),
// kProtocol (schema version, unknown kind, bad tensor), kResourceExhausted
// (over a size limit); each names the problem and the values involved. When
// `counters` is given, the rejection reason / received bytes are counted
// there. Never throws.
// `pool` (optional) supplies reused buffers for unaligned segments.
Result<InMessage> DecodeMessage(FrameSet frames, const DecodeLimits& limits,
                                TransportCounters* counters = nullptr,
                                std::shared_ptr<SegmentBufferPool> pool = nullptr);

// Header frame constants (see docs/transport.md).
inline constexpr uint32_t kHeaderMagic = 0x31505254;  // "TRP1" little-endian
inline constexpr uint16_t kFrameFormatVersion = 1;
inline constexpr size_t kHeaderFixedBytes = 24;
// Segments smaller than this are copied into the frame instead of referenced
// (ZeroMQ's zero-copy frames cost a refcount and an allocation each).
inline constexpr size_t kZeroCopyMinBytes = 8 * 1024;

}  // namespace troupe::transport
