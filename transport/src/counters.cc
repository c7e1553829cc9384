#include "troupe/transport/counters.h"

namespace troupe::transport {

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kTruncated:
      return "truncated";
    case RejectReason::kBadMagic:
      return "bad_magic";
    case RejectReason::kFrameVersion:
      return "frame_version";
    case RejectReason::kSegmentTable:
      return "segment_table";
    case RejectReason::kTooLarge:
      return "too_large";
    case RejectReason::kTooManySegments:
      return "too_many_segments";
    case RejectReason::kCapnp:
      return "capnp";
    case RejectReason::kSchemaVersion:
      return "schema_version";
    case RejectReason::kUnknownKind:
      return "unknown_kind";
    case RejectReason::kBadTensor:
      return "bad_tensor";
    case RejectReason::kUnexpected:
      return "unexpected";
    case RejectReason::kCount:
      break;
  }
  return "unknown";
}

uint64_t TransportCounters::rejected_total() const {
  uint64_t n = 0;
  for (const auto& c : rejected) n += c.load(std::memory_order_relaxed);
  return n;
}

std::vector<std::pair<std::string, uint64_t>> TransportCounters::ToStats(
    std::string_view prefix) const {
  std::vector<std::pair<std::string, uint64_t>> out;
  const std::string p(prefix);
  auto add = [&](const char* name, const std::atomic<uint64_t>& v) {
    out.emplace_back(p + name, v.load(std::memory_order_relaxed));
  };
  add("messages_sent", messages_sent);
  add("bytes_sent", bytes_sent);
  add("messages_received", messages_received);
  add("bytes_received", bytes_received);
  add("send_failures", send_failures);
  add("unaligned_copies", unaligned_copies);
  add("unaligned_copy_bytes", unaligned_copy_bytes);
  add("handshake_failures", handshake_failures);
  add("auth_denied", auth_denied);
  add("publisher_dropped", publisher_dropped);
  out.emplace_back(p + "rejected", rejected_total());
  for (int i = 0; i < kRejectReasonCount; ++i) {
    out.emplace_back(p + "rejected." + RejectReasonName(static_cast<RejectReason>(i)),
                     rejected[i].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace troupe::transport
