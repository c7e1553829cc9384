// Transport counters: messages, bytes, copies and rejected input by reason.
//
// Every Network owns one TransportCounters that all its sockets update; actors
// report them in heartbeats via ToStats(). All members are relaxed atomics:
// safe to read and update from any thread, values are eventually consistent.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::transport {

// Why an incoming message was rejected (one counter each): by the decoder, or (kUnexpected)
// by the component that received a well-formed message it does not take.
enum class RejectReason : int {
  kTruncated = 0,    // too few frames, or a header frame shorter than its fixed part
  kBadMagic,         // the header frame does not start with the Troupe magic (random bytes)
  kFrameVersion,     // header frame format version this build does not know
  kSegmentTable,     // segment table disagrees with the frames (count, or sizes past the end)
  kTooLarge,         // total size over DecodeLimits::max_message_bytes
  kTooManySegments,  // more segments than DecodeLimits::max_segments
  kCapnp,            // Cap'n Proto rejected the structure (bad pointer, limits, text)
  kSchemaVersion,    // Envelope.schemaVersion differs from wire::SCHEMA_VERSION
  kUnknownKind,      // Envelope.body is a union member this build does not know
  kBadTensor,        // a Tensor field fails validation (dtype, shape, size)
  kUnexpected,       // well-formed, but refused by its receiver: a kind that socket does not
                     // take, or a sender that is not who the protocol expects there
  kCount
};
inline constexpr int kRejectReasonCount = static_cast<int>(RejectReason::kCount);
// Short snake_case name ("segment_table", "schema_version", ...).
const char* RejectReasonName(RejectReason reason);

struct TransportCounters {
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> messages_received{0};  // decoded successfully
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> send_failures{0};         // Send/SendTo returned an error
  std::atomic<uint64_t> unaligned_copies{0};      // received segments copied to align them
  std::atomic<uint64_t> unaligned_copy_bytes{0};  // bytes copied for alignment
  std::atomic<uint64_t> handshake_failures{0};    // CURVE/ZAP handshakes a server refused
  std::atomic<uint64_t> auth_denied{0};           // ZAP denials (unknown client key)
  std::atomic<uint64_t> publisher_dropped{0};     // hints dropped at a full subscriber (PUB)
  std::array<std::atomic<uint64_t>, kRejectReasonCount> rejected{};

  void Reject(RejectReason r) {
    rejected[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t rejected_count(RejectReason r) const {
    return rejected[static_cast<int>(r)].load(std::memory_order_relaxed);
  }
  uint64_t rejected_total() const;
  // ("<prefix>messages_sent", value), ... including "<prefix>rejected.<reason>".
  std::vector<std::pair<std::string, uint64_t>> ToStats(
      std::string_view prefix = "transport.") const;
};

inline void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) {
  c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace troupe::transport
