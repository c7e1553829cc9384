// ZmqNetwork: the ZeroMQ implementation of Network (TCP, IPC, inproc).
//
// Design (docs/transport.md, "Thread model"): each socket owns one ZeroMQ
// socket behind a mutex. Send() from any thread takes the mutex, queues the
// frames with ZMQ_DONTWAIT (zero-copy for large segments) and releases it;
// Recv() on the owning thread takes the mutex only to pull frames without
// blocking and waits outside it with poll() on ZMQ_FD plus an eventfd that a
// sending thread signals when its send made input visible. No extra thread or
// queue sits on the data path, so a message costs the same hops as raw
// ZeroMQ. Blocked senders (peer queue at the high-water mark) wait outside
// the mutex in short poll slices, so they never stall the receiver.
//
// Server sockets are ROUTER with ROUTER_MANDATORY (unknown peer = error, full
// peer = wait, never a silent drop) and ROUTER_HANDOVER (a restarted client
// with the same identity takes over). "tcp://host:0" binds a free port and
// endpoint() reports it. With CURVE (curve.h) servers record refused
// handshakes in counters().handshake_failures.
//
// The destructor closes the context: every socket must be destroyed first
// (TROUPE_CHECKed). Thread-safe: Bind/Connect/NewPoller from any thread.
#pragma once

#include <memory>

#include "troupe/core/status.h"
#include "troupe/transport/curve.h"
#include "troupe/transport/socket.h"

namespace troupe::transport {

struct ZmqNetworkOptions {
  // Actor id and incarnation stamped on outgoing messages.
  NetworkIdentity identity;
  // ZeroMQ I/O threads (ZMQ_IO_THREADS). Default 1: enough for several GB/s;
  // more only helps with many busy connections.
  int io_threads = 1;
  // CURVE encryption/authentication; disabled by default.
  CurveOptions curve;

  Status Validate() const;
};

// Creates a network (one ZeroMQ context). InvalidArgument for bad options,
// kUnavailable if CURVE is requested but libzmq lacks it.
Result<std::unique_ptr<Network>> NewZmqNetwork(const ZmqNetworkOptions& options);

}  // namespace troupe::transport
