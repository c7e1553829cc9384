// The weight stream in chunks over transport sockets: the zmq backend's data
// path (chain and star), every newcomer's catch-up, and shm members on other
// nodes.
//
//   learner ChunkSender ──WeightsChunk──▶ ChunkReceiver (receiver's data socket)
//                                            └─relay─▶ next member's ChunkReceiver (chain)
//
// Each chunk is one transport message: a WeightsChunk header whose `payload`
// tensor references the stream bytes (sent without a copy; it is its own
// frame). Receivers copy each payload into their stream buffer at its offset
// and, on a chain, forward the received frame to their successor without a
// copy. Sockets come from the owner's transport::Network, so CURVE, size
// limits, counters and deadlines are the transport's. A receiver takes chunks
// only from the peer the protocol names (the learner, or its predecessor on a
// chain) and only with the transfer's token (Layout::token, random per
// transfer, sent in the manifest on the control socket): anything else is
// dropped and counted (rejected.unexpected), so a peer that can reach a data
// socket but not the control channel cannot inject weights.
//
// Threading: each object belongs to one thread (its WeightSender's or
// WeightReceiver's).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "data_path.h"
#include "protocol.h"
#include "troupe/broadcast/layout.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/transport/socket.h"

namespace troupe::broadcast {

// Largest transport message a data socket accepts: the largest chunk plus its header.
inline constexpr uint64_t kMaxDataMessageBytes = (uint64_t{256} << 20) + (uint64_t{1} << 20);

class ChunkSender {
 public:
  // `hwm_chunks`: chunks queued per destination before Send waits; `step_timeout`: how long
  // one chunk may wait for room (a stalled destination fails the transfer then).
  ChunkSender(transport::Network* network, proto::Header header, int hwm_chunks,
              std::chrono::milliseconds step_timeout);

  // Sends every chunk of the stream (`layout`, bytes at `data` kept alive by `owner`) to each
  // endpoint, in order. Calls `interrupt` every few chunks (true: Cancelled). Adds the
  // payload bytes sent to *bytes_sent.
  Status Send(const std::vector<std::string>& endpoints, const Layout& layout, const uint8_t* data,
              const std::shared_ptr<void>& owner, Deadline deadline, const Interrupt& interrupt,
              uint64_t* bytes_sent);
  // Closes the sockets to endpoints not in `keep`.
  void Retain(const std::set<std::string>& keep);

 private:
  Result<transport::Socket*> SocketFor(const std::string& endpoint);

  transport::Network* network_;
  proto::Header header_;
  int hwm_;
  std::chrono::milliseconds step_timeout_;
  std::map<std::string, std::unique_ptr<transport::Socket>> sockets_;
};

class ChunkReceiver {
 public:
  // Binds the data socket at `endpoint` (port 0 = any). `on_refused` is called for every
  // message refused (after it was counted in the network's counters).
  static Result<std::unique_ptr<ChunkReceiver>> Bind(transport::Network* network,
                                                     const std::string& endpoint, int hwm_chunks,
                                                     std::function<void()> on_refused = nullptr);

  const std::string& endpoint() const { return socket_->endpoint(); }
  transport::Socket* socket() { return socket_.get(); }

  // Where a chain member forwards what it receives.
  struct Relay {
    transport::Socket* next = nullptr;  // client socket to the successor's data socket
    proto::Header header;               // this receiver (the successor expects it as sender)
    std::string next_endpoint;          // for logs
  };

  // Receives every chunk of `layout` sent by `from` (an actor id) into `dst`, in order,
  // forwarding each to `relay` when given (a failed relay is logged and stops relaying; the
  // learner re-forms the chain). Chunks of other transfers are dropped. Fails after `stall`
  // without a chunk (Timeout), on a gap or an overrun (kProtocol/kMalformed), or when
  // `interrupt` returns true (Cancelled). *received = bytes landed.
  Status Receive(const Layout& layout, const std::string& from, uint8_t* dst, Relay* relay,
                 std::chrono::milliseconds stall, const Interrupt& interrupt,
                 const Progress& progress, uint64_t* received);

  // Between transfers (called often; acts at most every 100 ms): when nothing is waiting,
  // one Recv lets the socket count refused handshakes. Chunks that are waiting stay there
  // for the transfer they belong to (their manifest may not have been read yet); one that
  // arrives during the check is kept for it. A message from a sender `is_peer` does not
  // know, or of another kind, is refused: counted as rejected.unexpected and logged.
  void Idle(const std::function<bool(const std::string&)>& is_peer);

 private:
  ChunkReceiver(transport::Network* network, std::unique_ptr<transport::Socket> socket,
                std::function<void()> on_refused)
      : network_(network),
        socket_(std::move(socket)),
        probe_(network->NewPoller()),
        on_refused_(std::move(on_refused)) {
    probe_->Add(socket_.get());
  }
  // Counts and logs a message this socket does not take.
  void Refuse(const std::string& peer, const std::string& sender, const std::string& why);
  // The next message: one kept by Idle, else from the socket.
  Result<transport::Incoming> Next(Deadline deadline);

  transport::Network* network_;
  std::unique_ptr<transport::Socket> socket_;
  std::unique_ptr<transport::Poller> probe_;  // readability without consuming
  std::function<void()> on_refused_;
  std::deque<transport::Incoming> early_;  // chunks that came before their manifest
  Clock::time_point last_idle_{};
};

// Socket options of the broadcast's control sockets (sender server, receiver client, the
// gloo rendezvous): bounded queues, a 64 MiB message limit, goodbyes flushed on close.
transport::SocketOptions ControlSocketOptions(const std::string& identity = "");
// A client socket to a receiver's data socket (a chain member's relay to its successor).
Result<std::unique_ptr<transport::Socket>> ConnectDataSocket(transport::Network* network,
                                                             const std::string& endpoint,
                                                             const std::string& actor_id,
                                                             int hwm_chunks);

}  // namespace troupe::broadcast
