// Sockets and networks: the transport interface actors are written against.
//
// A Network makes sockets of four kinds:
//   kServer      bound; receives from many peers, each with its identity, and
//                replies to a peer by identity (ZeroMQ ROUTER, mandatory
//                routing: an unknown peer is an error, never a silent drop).
//   kClient      connected to one server with a chosen identity (DEALER).
//                Reconnects by itself; a restarted client with the same
//                identity takes over the old connection.
//   kPublisher   bound; Send/SendTo(topic) to every subscriber. Hints only:
//                a slow subscriber loses messages (counted), like ZeroMQ PUB.
//   kSubscriber  connected to one or more publishers, filtered by topic prefix.
// Two real implementations: ZmqNetwork (zmq_network.h) and MemoryNetwork
// (memory_network.h, in-process, same semantics); FaultInjectingNetwork
// (fault_injection.h) decorates either.
//
// Thread model: Send/SendTo are safe from any number of threads at once.
// Recv and Poller::Wait must be called by one thread at a time per socket (the
// actor's mailbox thread). Nothing here runs callbacks. Every call that can
// block takes a Deadline and returns kTimeout when it passes; Recv and Send
// always try once without blocking, so Deadline::Now() is a valid poll.
//
// Errors never throw. A bad incoming message makes Recv return its decode
// error (kMalformed / kProtocol / kResourceExhausted, already counted and
// logged); the socket keeps serving, and the next Recv returns the next
// message. IsBadInput() tells those errors apart from kTimeout/kUnavailable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/transport/counters.h"
#include "troupe/transport/message.h"

namespace troupe::transport {

enum class SocketKind { kServer, kClient, kPublisher, kSubscriber };
const char* SocketKindName(SocketKind kind);

// Per-socket options. Every field has a working default.
struct SocketOptions {
  // Client routing identity the server sees (Incoming::peer). Required for
  // clients; 1..255 bytes, must not start with a zero byte. Ignored otherwise.
  std::string identity;
  // Messages queued per peer before Send blocks (ZMQ_SNDHWM). Default 1000;
  // lower bounds memory (each queued message may pin a large batch).
  int send_hwm = 1000;
  // Messages buffered per peer on receive (ZMQ_RCVHWM). Default 1000.
  int recv_hwm = 1000;
  // How long close waits to flush queued messages. Default 200 ms; 0 drops
  // them at once (reliable delivery retransmits anyway).
  int linger_ms = 200;
  // Reconnect interval after a lost connection, first and max (backoff).
  // Defaults 100 ms / 2000 ms.
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 2000;
  // ZMTP heartbeats: a connection silent for heartbeat_timeout_ms is closed
  // (dead peers are noticed even without TCP RST). 0 disables. Defaults
  // 1000 / 5000 ms. Turn them off on a socket whose receive queue is meant to
  // fill to recv_hwm (flow control): libzmq 4.3.4 aborts the process when a
  // heartbeat falls due on a connection whose input is stopped and whose peer
  // has gone (the broadcast's data sockets, broadcast/src/chunk_stream.cc).
  int heartbeat_ivl_ms = 1000;
  int heartbeat_timeout_ms = 5000;
  // Hard per-frame cap enforced inside ZeroMQ (ZMQ_MAXMSGSIZE): a peer sending
  // a bigger frame is disconnected without the message being seen. 0 (default)
  // leaves it to DecodeLimits, which rejects and counts oversized messages.
  int64_t hard_frame_limit_bytes = 0;
  // Subscriber topic prefixes ("" = everything). Default {""}.
  std::vector<std::string> topics = {""};
  // Limits applied to every received message.
  DecodeLimits limits;

  Status Validate(SocketKind kind) const;
};

// Who this process is; stamped on every message it sends.
struct NetworkIdentity {
  // Envelope.sender for messages that leave it empty (the actor id).
  std::string actor_id = "troupe";
  // Envelope.incarnation; 0 = pick a random one at construction.
  uint64_t incarnation = 0;
};

// A received, validated message.
struct Incoming {
  // Server: the sending client's identity (reply with SendTo(peer, ...)).
  // Subscriber: the topic. Client: empty (the server).
  std::string peer;
  InMessage message;
};

// True for errors caused by a bad incoming message (the socket keeps serving).
bool IsBadInput(const Status& status);

class Socket {
 public:
  virtual ~Socket() = default;
  virtual SocketKind kind() const = 0;
  // The bound or connected endpoint; for "tcp://host:0" binds, the actual port.
  virtual const std::string& endpoint() const = 0;
  // The identity of the network this socket belongs to.
  virtual const NetworkIdentity& identity() const = 0;

  // Client: sends to the server. Publisher: publishes under topic "".
  // Blocks while the peer's queue is full, until `deadline` (kTimeout).
  // kUnavailable if the socket is closed. Seals `message`. Any thread.
  Status Send(const OutMessage& message, Deadline deadline) {
    return DoSend(SendArgs{{}, false, 0}, message, deadline);
  }
  // Server: sends to the client with identity `peer` (kUnavailable if no such
  // peer is connected). Publisher: publishes under topic `peer`.
  Status SendTo(std::string_view peer, const OutMessage& message, Deadline deadline) {
    return DoSend(SendArgs{peer, true, 0}, message, deadline);
  }
  // Reliable delivery: Send (empty `peer`) or SendTo with the header's ack
  // floor set (see reliable.h).
  Status SendSequenced(std::string_view peer, const OutMessage& message, uint64_t ack_floor,
                       Deadline deadline) {
    return DoSend(SendArgs{peer, !peer.empty(), ack_floor}, message, deadline);
  }
  // Receives the next message (blocking until `deadline`: kTimeout). A bad
  // message returns its error (see IsBadInput). One thread at a time.
  virtual Result<Incoming> Recv(Deadline deadline) = 0;
  // Subscriber: adds a topic prefix. Others: InvalidArgument.
  virtual Status Subscribe(std::string_view topic) = 0;
  // Subscriber: connects to one more publisher. Others: InvalidArgument.
  virtual Status ConnectAlso(const std::string& endpoint) = 0;

  struct SendArgs {
    std::string_view to;  // peer identity (server) or topic (publisher)
    bool addressed;       // SendTo (true) or Send (false)
    uint64_t ack_floor;   // header ack floor (0 = unsequenced)
  };
  // Implementations: Send/SendTo/SendSequenced all land here.
  virtual Status DoSend(const SendArgs& args, const OutMessage& message, Deadline deadline) = 0;
};

// Waits on several sockets from one thread (the actor's mailbox loop).
class Poller {
 public:
  virtual ~Poller() = default;
  // Borrows `socket` (same network; must outlive the poller or be removed).
  virtual void Add(Socket* socket) = 0;
  virtual void Remove(Socket* socket) = 0;
  // Blocks until an added socket has a message to Recv, Wake() is called, or
  // the deadline passes (kTimeout). Returns the readable sockets (empty after
  // a Wake). A socket may be reported readable and then Recv finds nothing
  // (e.g. a message a fault injector filtered); callers loop.
  virtual Result<std::vector<Socket*>> Wait(Deadline deadline) = 0;
  // Makes a concurrent or the next Wait return. Any thread.
  virtual void Wake() = 0;
};

class Network {
 public:
  virtual ~Network() = default;
  // kServer or kPublisher. "tcp://host:0" picks a free port (see endpoint()).
  virtual Result<std::unique_ptr<Socket>> Bind(SocketKind kind, const std::string& endpoint,
                                               const SocketOptions& options = {}) = 0;
  // kClient or kSubscriber. Connecting never waits for the peer to exist.
  virtual Result<std::unique_ptr<Socket>> Connect(SocketKind kind, const std::string& endpoint,
                                                  const SocketOptions& options = {}) = 0;
  virtual std::unique_ptr<Poller> NewPoller() = 0;
  virtual TransportCounters& counters() = 0;
  virtual const NetworkIdentity& identity() const = 0;
};

// A random non-zero 64-bit incarnation.
uint64_t RandomIncarnation();

}  // namespace troupe::transport
