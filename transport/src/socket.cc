#include "troupe/transport/socket.h"

#include <random>

namespace troupe::transport {

const char* SocketKindName(SocketKind kind) {
  switch (kind) {
    case SocketKind::kServer:
      return "server";
    case SocketKind::kClient:
      return "client";
    case SocketKind::kPublisher:
      return "publisher";
    case SocketKind::kSubscriber:
      return "subscriber";
  }
  return "unknown";
}

bool IsBadInput(const Status& status) {
  return status.code() == Code::kMalformed || status.code() == Code::kProtocol ||
         status.code() == Code::kResourceExhausted;
}

Status SocketOptions::Validate(SocketKind kind) const {
  if (kind == SocketKind::kClient) {
    if (identity.empty() || identity.size() > 255) {
      return InvalidArgument("client identity must be 1..255 bytes; got {} bytes", identity.size());
    }
    if (identity[0] == '\0') {
      return InvalidArgument("client identity must not start with a zero byte");
    }
  }
  if (send_hwm < 1) return InvalidArgument("send_hwm = {}: must be >= 1", send_hwm);
  if (recv_hwm < 1) return InvalidArgument("recv_hwm = {}: must be >= 1", recv_hwm);
  if (linger_ms < 0) return InvalidArgument("linger_ms = {}: must be >= 0", linger_ms);
  if (reconnect_ivl_ms < 1 || reconnect_ivl_max_ms < reconnect_ivl_ms) {
    return InvalidArgument(
        "reconnect_ivl_ms = {} / reconnect_ivl_max_ms = {}: need 1 <= ivl <= max", reconnect_ivl_ms,
        reconnect_ivl_max_ms);
  }
  if (heartbeat_ivl_ms < 0 || heartbeat_timeout_ms < 0 ||
      (heartbeat_ivl_ms > 0 && heartbeat_timeout_ms < heartbeat_ivl_ms)) {
    return InvalidArgument(
        "heartbeat_ivl_ms = {} / heartbeat_timeout_ms = {}: need 0 (off) or ivl <= timeout",
        heartbeat_ivl_ms, heartbeat_timeout_ms);
  }
  if (hard_frame_limit_bytes < 0) {
    return InvalidArgument("hard_frame_limit_bytes = {}: must be >= 0", hard_frame_limit_bytes);
  }
  if (kind == SocketKind::kSubscriber && topics.empty()) {
    return InvalidArgument("a subscriber needs at least one topic (\"\" = everything)");
  }
  return limits.Validate().WithContext("limits");
}

uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v;
}

}  // namespace troupe::transport
