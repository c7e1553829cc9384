// The key-value store gloo groups form through, served over the broadcast's
// transport instead of c10d's TCPStore.
//
//   receivers' RemoteStore ──StoreRequest──▶ RendezvousServer (learner, one per epoch)
//   learner's LocalStore ─────────────────▶ the same map, in process
//
// c10d's TCPStore listens on every interface and authenticates nobody; this
// store is a transport server socket on the learner's network, so it binds
// only the learner's address, speaks CURVE when the job does, and counts what
// it refuses. Each epoch gets a fresh server on a fresh port (tcp://host:0)
// with a random key prefix; both travel only in the epoch's BroadcastGroup on
// the control socket, and the server answers only the epoch's members and only
// keys under that prefix (others are refused and counted as
// rejected.unexpected). The learner closes it once every member acknowledged
// a transfer of the epoch (each formed its group by then), or at the next epoch.
//
// Semantics follow c10d::Store: get and wait hold the request until the keys
// exist or the timeout passes (then the caller's c10d call throws a timeout).
//
// Threading: the server runs one thread; LocalStore may be used from any
// thread; a RemoteStore belongs to the thread that forms the group.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "data_path.h"
#include "protocol.h"
#include "troupe/core/status.h"
#include "troupe/transport/socket.h"

namespace troupe::broadcast {

class RendezvousServer {
 public:
  // Binds tcp://<host>:0 on `network` and starts serving `members` (actor ids) under `prefix`.
  static Result<std::unique_ptr<RendezvousServer>> Start(transport::Network* network,
                                                         const std::string& host,
                                                         proto::Header header, std::string prefix,
                                                         std::vector<std::string> members);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  const std::string& endpoint() const;
  const std::string& prefix() const;
  // Requests refused so far (unknown sender, key outside the prefix, limits).
  uint64_t refused() const;
  // The learner's own view of the store. Blocking calls wait in short slices and call
  // `interrupt` between them (true: the call throws, abandoning the formation).
  c10::intrusive_ptr<c10d::Store> LocalStore(std::chrono::milliseconds timeout,
                                             Interrupt interrupt);

  struct State;

 private:
  RendezvousServer() = default;
  std::shared_ptr<State> state_;
};

// A member's store: request/reply over a client socket to `endpoint`. Blocking calls call
// `interrupt` while they wait (true: the call throws).
c10::intrusive_ptr<c10d::Store> ConnectRendezvous(transport::Network* network,
                                                  const std::string& endpoint, proto::Header header,
                                                  std::chrono::milliseconds timeout,
                                                  Interrupt interrupt);

// What c10d::Store::clone() returns for a store made above (torch 2.7+ calls it; older
// torch has no such method, hence this function for tests): a store on the same map, usable
// from another thread, without the original's interrupt.
c10::intrusive_ptr<c10d::Store> CloneRendezvousStore(c10d::Store& store);

}  // namespace troupe::broadcast
