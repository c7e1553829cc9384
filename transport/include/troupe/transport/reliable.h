// Reliable delivery between actors: at-least-once with acks, per-sender FIFO,
// a bounded outbox, retransmits, re-routing away from dead peers, and
// receiver-side dedupe.
//
//   rollout ──ReliableSender──▶ reward ──ReliableSender──▶ learner
//             (outbox, seq)     ReliableReceiver            ReliableReceiver
//                                (dedupe, FIFO, acks)        (+ Snapshot in checkpoint)
//
// Protocol (docs/transport.md, "Reliable delivery"): a sender keeps one
// stream per peer; each message gets the stream's next seq (Envelope.seq) and
// every transmission carries the stream's ack floor (lowest unacked seq) in
// the header frame. The receiver keys streams by (Envelope.sender,
// Envelope.incarnation), delivers seqs in order (buffering bounded
// out-of-order arrivals), drops duplicates, and answers with wire::Ack:
// `seqs` processed, `rejected` processed-but-invalid (never retried),
// `deliveredThrough` (everything below was handed to the application) and
// its own incarnation. Acks mean "processed": the application calls Ack()
// after it is done with a message, so a receiver that persists Snapshot()
// with its state gets exactly-once across its own restarts.
//
// The sender retransmits unacknowledged, undelivered messages after a
// timeout (exponential backoff), probes a silent peer with its oldest unacked
// message, retransmits everything at once when the receiver's incarnation
// changes (it restarted), and re-routes a peer's unacked messages (with new
// seqs) to the live peer with the fewest in flight when the caller or
// repeated silent timeouts declare it dead. Nothing is dropped silently: when
// the outbox is full Send blocks until its deadline, then returns
// kResourceExhausted; messages still unacked at destruction are logged.
//
// Thread-safety: ReliableSender is fully thread-safe; it owns one thread that
// receives acks and runs timers (callbacks run there). ReliableReceiver::Recv
// is for one thread (the mailbox loop); Ack/Reject/FlushAcks/Snapshot/stats
// from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/transport/socket.h"

namespace troupe::transport {

struct ReliableSenderOptions {
  // Messages in the outbox (queued + unacked) before Send blocks. Default 256.
  size_t max_outbox_messages = 256;
  // Bytes in the outbox before Send blocks. Default 1 GiB. A single message
  // larger than this is still accepted when the outbox is empty.
  uint64_t max_outbox_bytes = uint64_t{1} << 30;
  // First retransmit timeout; doubles per silent round up to the max, resets
  // on progress. Defaults 1000 / 8000 ms. Lower recovers faster from loss but
  // duplicates more under load.
  int64_t retransmit_timeout_ms = 1000;
  int64_t max_retransmit_timeout_ms = 8000;
  // Consecutive timeouts without any reply before a peer is declared dead and
  // its messages re-routed (only while another live peer exists; the last
  // peer keeps being retried). 0 = only the caller declares peers dead.
  // Default 4.
  int dead_after_timeouts = 4;
  // Options of the client sockets ConnectPeer creates; identity defaults to
  // the network's actor id; send_hwm is raised to exceed the outbox.
  SocketOptions peer_socket;

  Status Validate() const;
};

struct ReliableSenderStats {
  uint64_t sent = 0;          // messages accepted by Send
  uint64_t queued = 0;        // now: waiting for a live peer
  uint64_t in_flight = 0;     // now: transmitted, not acked
  uint64_t outbox_bytes = 0;  // now
  uint64_t acked = 0;
  uint64_t rejected = 0;
  uint64_t retransmits = 0;  // transmissions after the first
  uint64_t rerouted = 0;     // messages moved to another peer
  uint64_t peers_declared_dead = 0;
  uint64_t receiver_restarts = 0;  // receiver incarnation changes seen
  uint64_t send_blocked = 0;       // Send calls that had to wait for space
  uint64_t foreign_acks = 0;       // acks for a previous incarnation of this sender (ignored)
};

// Final outcome of one message, reported once.
struct DeliveryOutcome {
  std::string peer;
  uint64_t seq = 0;
  bool accepted = true;  // false: the receiver rejected it (reason set)
  std::string reason;
  OutMessage message;
};

namespace detail {
class ReliableSenderImpl;
}

class ReliableSender {
 public:
  // Borrows `network` (must outlive this). Starts the ack/timer thread.
  ReliableSender(Network* network, ReliableSenderOptions options);
  // Stops the thread and closes peer sockets; logs unacked messages left.
  ~ReliableSender();
  ReliableSender(const ReliableSender&) = delete;
  ReliableSender& operator=(const ReliableSender&) = delete;

  // Connects a client socket to `endpoint` and adds it as peer `name`.
  // AlreadyExists if the name is taken; errors from Connect. Non-blocking.
  Status ConnectPeer(const std::string& name, const std::string& endpoint);
  // Adds a peer over a connected client socket (ownership moves here; only
  // this sender may use it afterwards).
  Status AddPeer(const std::string& name, std::unique_ptr<Socket> client);
  // Removes a peer; its unacked messages are re-routed. kNotFound if unknown.
  Status RemovePeer(const std::string& name);
  // Declares a peer dead (re-routes its unacked messages) or alive again.
  // Unknown names are ignored (the directory may race with removal).
  void MarkPeerDead(const std::string& name);
  void MarkPeerAlive(const std::string& name);
  std::vector<std::string> live_peers() const;

  // Takes `message` into the outbox and transmits it to a live peer (or keeps
  // it queued until one exists). Blocks while the outbox is full; at the
  // deadline returns kResourceExhausted naming the limit. Any thread.
  Status Send(OutMessage message, Deadline deadline);
  // Blocks until every message is acked or rejected; kTimeout at the deadline.
  Status Flush(Deadline deadline);

  // Called once per message when it is acked or rejected, on the sender's
  // thread (keep it short; do not call back into this sender). Set before
  // sending.
  void SetOutcomeCallback(std::function<void(const DeliveryOutcome&)> callback);
  ReliableSenderStats stats() const;

 private:
  std::unique_ptr<detail::ReliableSenderImpl> impl_;
};

struct ReliableReceiverOptions {
  // Out-of-order messages held per stream while waiting for a gap to fill;
  // more are dropped (the sender retransmits them). Default 1024.
  size_t max_reorder_messages = 1024;
  // Pending acks that force a flush even while messages keep arriving.
  // Default 64.
  size_t ack_batch = 64;
  // Delayed acks: when no message is waiting, pending acks go out once the
  // oldest is this old (or at ack_batch). Default 2 ms: one ack message per
  // burst instead of one per message while streaming; 0 = flush whenever
  // the receiver would block. Keep well below the sender's retransmit timeout.
  int64_t ack_delay_ms = 2;
  // Streams (sender, incarnation) remembered; the least recently active is
  // forgotten beyond this. Default 4096.
  size_t max_streams = 4096;

  Status Validate() const;
};

struct ReliableReceiverStats {
  uint64_t delivered = 0;         // sequenced messages handed to the application
  uint64_t unsequenced = 0;       // seq 0 messages passed through
  uint64_t duplicates = 0;        // dropped as already delivered
  uint64_t out_of_order = 0;      // buffered until a gap filled
  uint64_t reorder_overflow = 0;  // dropped because the reorder buffer was full
  uint64_t skipped = 0;           // buffered messages the sender's floor made moot
  uint64_t acked = 0;
  uint64_t rejected = 0;
  uint64_t ack_messages = 0;  // wire::Ack messages sent
  uint64_t streams = 0;       // now
};

// One received message and where to acknowledge it.
struct Delivery {
  std::string peer;  // socket identity of the sender
  InMessage message;
  bool sequenced() const { return message.seq() != 0; }
};

// Dedupe state of one stream, for checkpoints.
struct StreamState {
  std::string sender;
  uint64_t incarnation = 0;
  uint64_t next_expected = 1;  // every seq below was processed
};

namespace detail {
class ReliableReceiverImpl;
}

class ReliableReceiver {
 public:
  // Borrows `server` (a kServer socket that must outlive this).
  explicit ReliableReceiver(Socket* server, ReliableReceiverOptions options = {});
  ~ReliableReceiver();
  ReliableReceiver(const ReliableReceiver&) = delete;
  ReliableReceiver& operator=(const ReliableReceiver&) = delete;

  // Next message: in seq order per stream, never a duplicate within this
  // object's lifetime; unsequenced (seq 0) messages pass straight through.
  // Sends pending acks before blocking. Errors as Socket::Recv (kTimeout at
  // the deadline; bad input returned, counted, and skipped). One thread.
  Result<Delivery> Recv(Deadline deadline);
  // The application processed `delivery` successfully / found it invalid
  // (it will not be retried). Ignored for unsequenced messages. Any thread;
  // from a thread other than Recv's the ack is sent at once.
  void Ack(const Delivery& delivery);
  void Reject(const Delivery& delivery, std::string reason);
  // Sends pending acks now. Any thread.
  Status FlushAcks(Deadline deadline);

  // Per-stream dedupe state covering everything acked so far (persist it with
  // the application's state; Restore after a restart).
  std::vector<StreamState> Snapshot() const;
  void Restore(const std::vector<StreamState>& streams);
  ReliableReceiverStats stats() const;

 private:
  std::unique_ptr<detail::ReliableReceiverImpl> impl_;
};

}  // namespace troupe::transport
