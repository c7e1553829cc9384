// MemoryNetwork: an in-process Network with ZeroMQ's semantics, no sockets.
//
// Several actors in one test process share one MemoryFabric (the "wire"); each
// actor gets its own MemoryNetwork (its identity) on that fabric. Messages
// travel as the same frames ZmqNetwork sends (header + segments, decoded with
// the same limits), by reference: a received TensorView points at the
// sender's bytes. Semantics mirrored from ZeroMQ:
//   * client -> server: per-client FIFO, bounded by send_hwm (Send blocks
//     until the deadline); while no server is bound at the endpoint, up to
//     send_hwm messages wait in the client and are delivered when one binds.
//   * server -> client: by identity; unknown identity = kUnavailable; a newer
//     client with the same identity takes over (ROUTER_HANDOVER).
//   * publisher -> subscribers: topic-prefix filter; a full subscriber queue
//     drops the message (counted in publisher_dropped).
// Faults: Crash(network) makes every socket of that actor disappear at once,
// losing whatever sat in its queues (like SIGKILL); Unbind(endpoint) closes
// one server. "tcp://host:0" endpoints get a unique fake port, so actor code
// that binds port 0 runs unchanged.
//
// Thread-safe: all methods from any thread; Recv/Wait one thread per socket.
#pragma once

#include <memory>
#include <string>

#include "troupe/transport/socket.h"

namespace troupe::transport {

namespace detail {
class MemoryFabricImpl;
}

class MemoryFabric {
 public:
  MemoryFabric();
  ~MemoryFabric();
  MemoryFabric(const MemoryFabric&) = delete;
  MemoryFabric& operator=(const MemoryFabric&) = delete;

  // A network for one actor on this fabric. The fabric must outlive it.
  std::unique_ptr<Network> NewNetwork(const NetworkIdentity& identity);
  // Closes the server or publisher bound at `endpoint` as if its process died:
  // its queued messages are lost. kNotFound if nothing is bound there.
  Status Unbind(const std::string& endpoint);
  // Every socket of networks with this actor id dies (queues lost, later
  // sends fail with kUnavailable). Returns how many sockets died.
  size_t Crash(const std::string& actor_id);
  // Number of live sockets (for leak checks in tests).
  size_t live_sockets() const;

  detail::MemoryFabricImpl& impl() { return *impl_; }

 private:
  std::shared_ptr<detail::MemoryFabricImpl> impl_;
};

}  // namespace troupe::transport
