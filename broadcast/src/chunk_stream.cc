// The chunk stream over transport sockets (chunk_stream.h).
#include "chunk_stream.h"

#include <algorithm>
#include <cstring>

#include "troupe/core/log.h"

namespace troupe::broadcast {
namespace {

spdlog::logger& Log() {
  return log::Get("broadcast");
}

transport::SocketOptions DataSocketOptions(int hwm, const std::string& identity) {
  transport::SocketOptions o;
  o.identity = identity;
  o.send_hwm = hwm;
  o.recv_hwm = hwm;
  o.linger_ms = 0;  // a transfer that is over or abandoned needs nothing flushed
  // No ZMTP heartbeats: a data socket's receive queue fills to its HWM (that is its flow
  // control), and libzmq 4.3.4 (Debian 12) aborts the process ("Assertion failed: !_io_error
  // (stream_engine_base.cpp:331)") when a heartbeat falls due on a connection whose input is
  // stopped and whose peer has gone. Liveness here is the protocol's (member_timeout_ms,
  // learner_timeout_ms). ChunkStreamZmq.APeerThatFillsTheQueueAndGoesAwayKillsNothing.
  o.heartbeat_ivl_ms = 0;
  o.limits.max_message_bytes = kMaxDataMessageBytes;
  o.limits.max_segments = 8;  // header struct + payload
  o.hard_frame_limit_bytes = static_cast<int64_t>(kMaxDataMessageBytes);
  return o;
}

}  // namespace

transport::SocketOptions ControlSocketOptions(const std::string& identity) {
  transport::SocketOptions o;
  o.identity = identity;
  o.send_hwm = 10000;
  o.recv_hwm = 10000;
  o.linger_ms = 200;  // goodbyes get out
  o.reconnect_ivl_ms = 50;
  o.reconnect_ivl_max_ms = 500;
  o.limits.max_message_bytes = proto::kMaxControlMessageBytes;
  o.hard_frame_limit_bytes = static_cast<int64_t>(proto::kMaxControlMessageBytes);
  return o;
}

Result<std::unique_ptr<transport::Socket>> ConnectDataSocket(transport::Network* network,
                                                             const std::string& endpoint,
                                                             const std::string& actor_id,
                                                             int hwm_chunks) {
  return network->Connect(transport::SocketKind::kClient, endpoint,
                          DataSocketOptions(hwm_chunks, UnguessableIdentity(actor_id)));
}

// ----------------------------------------------------------------- sender

ChunkSender::ChunkSender(transport::Network* network, proto::Header header, int hwm_chunks,
                         std::chrono::milliseconds step_timeout)
    : network_(network),
      header_(std::move(header)),
      hwm_(hwm_chunks),
      step_timeout_(step_timeout) {}

Result<transport::Socket*> ChunkSender::SocketFor(const std::string& endpoint) {
  auto it = sockets_.find(endpoint);
  if (it != sockets_.end()) return it->second.get();
  TROUPE_ASSIGN_OR_RETURN(auto s, ConnectDataSocket(network_, endpoint, header_.sender, hwm_));
  auto [pos, _] = sockets_.emplace(endpoint, std::move(s));
  return pos->second.get();
}

void ChunkSender::Retain(const std::set<std::string>& keep) {
  for (auto it = sockets_.begin(); it != sockets_.end();)
    it = keep.count(it->first) ? std::next(it) : sockets_.erase(it);
}

Status ChunkSender::Send(const std::vector<std::string>& endpoints, const Layout& layout,
                         const uint8_t* data, const std::shared_ptr<void>& owner, Deadline deadline,
                         const Interrupt& interrupt, uint64_t* bytes_sent) {
  std::vector<transport::Socket*> sockets;
  for (const auto& ep : endpoints) {
    TROUPE_ASSIGN_OR_RETURN(transport::Socket * s, SocketFor(ep));
    sockets.push_back(s);
  }
  const uint64_t chunks = std::max<uint64_t>(1, layout.num_chunks());
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = std::min(layout.total_bytes, c * layout.chunk_bytes);
    const uint64_t end = std::min(layout.total_bytes, begin + layout.chunk_bytes);
    proto::ChunkMsg chunk;
    chunk.version = layout.version;
    chunk.transfer = layout.transfer;
    chunk.bucket = static_cast<uint32_t>(begin / layout.bucket_bytes);
    chunk.bucket_offset = begin % layout.bucket_bytes;
    chunk.last = c + 1 == chunks;
    chunk.token = layout.token;
    // The stream buffer is page-aligned and padded past total_bytes, chunks start at multiples
    // of chunk_bytes (a multiple of 8): the payload goes out without a copy.
    TROUPE_ASSIGN_OR_RETURN(
        transport::OutMessage msg,
        proto::EncodeChunk(header_, chunk,
                           transport::TensorBytes::Borrow(data + begin, end - begin, owner,
                                                          transport::RoundUpToWord(end - begin))));
    for (size_t i = 0; i < sockets.size(); ++i) {
      Status st = sockets[i]->Send(msg, deadline.min(Deadline::In(step_timeout_)));
      if (!st.ok())
        return st.WithContext(
            fmt::format("sending chunk {} of version {} to {}", c, layout.version, endpoints[i]));
      *bytes_sent += end - begin;
    }
    if ((c & 15) == 15 && interrupt && interrupt())
      return Cancelled("transfer of version {} interrupted", layout.version);
  }
  return Status::Ok();
}

// ----------------------------------------------------------------- receiver

Result<std::unique_ptr<ChunkReceiver>> ChunkReceiver::Bind(transport::Network* network,
                                                           const std::string& endpoint,
                                                           int hwm_chunks,
                                                           std::function<void()> on_refused) {
  TROUPE_ASSIGN_OR_RETURN(auto s, network->Bind(transport::SocketKind::kServer, endpoint,
                                                DataSocketOptions(hwm_chunks, "")));
  return std::unique_ptr<ChunkReceiver>(
      new ChunkReceiver(network, std::move(s), std::move(on_refused)));
}

void ChunkReceiver::Refuse(const std::string& peer, const std::string& sender,
                           const std::string& why) {
  network_->counters().Reject(transport::RejectReason::kUnexpected);
  if (on_refused_) on_refused_();
  TROUPE_LOG_EVERY_MS(Log(), spdlog::level::warn, 2000,
                      "weights data socket {}: refused a message from '{}' (sender '{}'): {}",
                      socket_->endpoint(), peer, sender, why);
}

Status ChunkReceiver::Receive(const Layout& layout, const std::string& from, uint8_t* dst,
                              Relay* relay, std::chrono::milliseconds stall_window,
                              const Interrupt& interrupt, const Progress& progress,
                              uint64_t* received) {
  Deadline stall = Deadline::In(stall_window);
  uint64_t expected = 0;
  *received = 0;
  bool relaying = relay != nullptr && relay->next != nullptr;
  while (true) {
    if (interrupt && interrupt())
      return Cancelled("transfer of version {} superseded", layout.version);
    if (stall.expired())
      return Timeout("no data for version {} for {} ms ({} of {} bytes received)", layout.version,
                     stall_window.count(), expected, layout.total_bytes);
    auto in = Next(Deadline::InMs(20));
    if (!in.ok()) {
      if (in.status().code() == Code::kTimeout || transport::IsBadInput(in.status())) continue;
      return in.status();  // the socket is gone
    }
    auto msg = proto::Decode(in->message);
    if (!msg.ok()) {
      Refuse(in->peer, std::string(in->message.sender()), msg.status().ToString());
      continue;
    }
    if (msg->kind != proto::Kind::kChunk) {
      Refuse(in->peer, msg->sender, fmt::format("a {} on a data socket", KindName(msg->kind)));
      continue;
    }
    if (msg->sender != from) {
      Refuse(in->peer, msg->sender,
             fmt::format("chunks of version {} come from '{}' only", layout.version, from));
      continue;
    }
    const proto::ChunkMsg& chunk = msg->chunk;
    if (chunk.version != layout.version || chunk.transfer != layout.transfer) continue;  // stale
    if (chunk.token != layout.token) {
      Refuse(in->peer, msg->sender,
             fmt::format("a chunk of version {} without its transfer's token", layout.version));
      continue;
    }
    uint64_t offset = 0;
    if (!chunk.Absolute(layout.bucket_bytes, &offset) || offset != expected)
      return ProtocolError("chunk of version {} at offset {} (expected {})", layout.version, offset,
                           expected);
    const uint64_t n = chunk.payload.bytes;
    if (n > layout.total_bytes - expected)
      return Malformed("chunk at offset {} of {} bytes runs past the stream end {}", expected, n,
                       layout.total_bytes);
    if (n > 0) std::memcpy(dst + expected, chunk.payload.data, n);
    if (relaying) {
      // Forward the frame we got (no copy): it stays alive until the successor's send is done.
      auto fwd = proto::EncodeChunk(
          relay->header, chunk,
          transport::TensorBytes::FromView(chunk.payload, in->message.KeepAlive()));
      Status st = fwd.ok() ? relay->next->Send(*fwd, Deadline::In(stall_window)) : fwd.status();
      if (!st.ok()) {
        relaying = false;  // keep receiving our own copy; the learner re-forms the chain
        Log().warn("relaying version {} to {} failed: {}", layout.version, relay->next_endpoint,
                   st.ToString());
      }
    }
    expected += n;
    *received = expected;
    stall = Deadline::In(stall_window);
    if (progress) progress(expected, layout.total_bytes);
    if (chunk.last) {
      if (expected != layout.total_bytes)
        return Malformed("last chunk of version {} after {} of {} bytes", layout.version, expected,
                         layout.total_bytes);
      return Status::Ok();
    }
  }
}

Result<transport::Incoming> ChunkReceiver::Next(Deadline deadline) {
  if (!early_.empty()) {
    transport::Incoming in = std::move(early_.front());
    early_.pop_front();
    return in;
  }
  return socket_->Recv(deadline);
}

void ChunkReceiver::Idle(const std::function<bool(const std::string&)>& is_peer) {
  constexpr size_t kMaxEarly = 64;
  const auto now = Clock::now();
  if (now - last_idle_ < std::chrono::milliseconds(100)) return;
  last_idle_ = now;
  auto readable = probe_->Wait(Deadline::Now());
  if (readable.ok() && !readable->empty()) return;  // chunks waiting for their manifest
  auto in = socket_->Recv(Deadline::Now());         // finds nothing (usually): counts handshakes
  if (!in.ok()) return;  // nothing, or bad input (counted and logged by the transport)
  auto msg = proto::Decode(in->message);
  if (!msg.ok()) {
    Refuse(in->peer, std::string(in->message.sender()), msg.status().ToString());
  } else if (msg->kind != proto::Kind::kChunk) {
    Refuse(in->peer, msg->sender, fmt::format("a {} on a data socket", KindName(msg->kind)));
  } else if (!is_peer(msg->sender)) {
    Refuse(in->peer, msg->sender, "not the learner or a member of this receiver's group");
  } else {
    if (early_.size() >= kMaxEarly) early_.pop_front();  // bounded: a stale one goes first
    early_.push_back(std::move(in).value());
  }
}

}  // namespace troupe::broadcast
