// FaultInjectingNetwork: a decorator that drops, delays, duplicates or fails
// messages and "kills" peers, for testing error paths (LevelDB's SpecialEnv
// style: named hooks plus a few ready-made rules).
//
// Wraps any Network (ZeroMQ or memory). Faults act on the send path of the
// wrapped sockets, plus peer kills on both paths:
//   * hooks: SetHook(name, fn) installs a function that sees every outgoing
//     message (socket kind, destination, envelope) and returns an action;
//     hooks run in name order, the first non-kPass action wins.
//   * rules: DropNext / DuplicateNext / DelayNext / FailNext for the next n
//     messages matching a filter.
//   * KillPeer(id): messages to that peer (server identity, client endpoint,
//     or Envelope.sender on receive) vanish both ways until RevivePeer.
// Delayed messages are sent by one timer thread, in due-time order (so delays
// also reorder). The destructor sends nothing more and joins the thread.
//
// Thread-safe: configure from any thread while traffic flows. Hooks run on
// the sending thread and must not call back into this network.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/transport/socket.h"

namespace troupe::transport {

struct SendEvent {
  SocketKind socket_kind;
  std::string_view endpoint;  // of the sending socket
  std::string_view to;        // SendTo peer/topic; empty for Send
  wire::Envelope::Reader envelope;
};

struct FaultAction {
  enum Kind { kPass, kDrop, kDuplicate, kDelay, kFail };
  Kind kind = kPass;
  int64_t delay_ms = 0;  // kDelay
  static FaultAction Pass() { return {}; }
  static FaultAction Drop() { return {kDrop, 0}; }
  static FaultAction Duplicate() { return {kDuplicate, 0}; }
  static FaultAction Delay(int64_t ms) { return {kDelay, ms}; }
  static FaultAction Fail() { return {kFail, 0}; }  // Send returns kUnavailable
};

using SendHook = std::function<FaultAction(const SendEvent&)>;
using SendFilter = std::function<bool(const SendEvent&)>;

struct FaultStats {
  uint64_t dropped = 0, duplicated = 0, delayed = 0, failed = 0, killed_in = 0, killed_out = 0;
};

namespace detail {
class FaultState;
}

class FaultInjectingNetwork : public Network {
 public:
  // Borrows `inner`, which must outlive this object and its sockets.
  explicit FaultInjectingNetwork(Network* inner);
  ~FaultInjectingNetwork() override;

  void SetHook(const std::string& name, SendHook hook);
  void RemoveHook(const std::string& name);
  // The next `n` sends matching `filter` (null = all) are affected.
  void DropNext(int n, SendFilter filter = nullptr);
  void DuplicateNext(int n, SendFilter filter = nullptr);
  void DelayNext(int n, int64_t delay_ms, SendFilter filter = nullptr);
  void FailNext(int n, SendFilter filter = nullptr);
  void KillPeer(const std::string& peer);
  void RevivePeer(const std::string& peer);
  FaultStats stats() const;

  Result<std::unique_ptr<Socket>> Bind(SocketKind kind, const std::string& endpoint,
                                       const SocketOptions& options = {}) override;
  Result<std::unique_ptr<Socket>> Connect(SocketKind kind, const std::string& endpoint,
                                          const SocketOptions& options = {}) override;
  std::unique_ptr<Poller> NewPoller() override;
  TransportCounters& counters() override { return inner_->counters(); }
  const NetworkIdentity& identity() const override { return inner_->identity(); }

 private:
  Network* inner_;
  std::shared_ptr<detail::FaultState> state_;
};

}  // namespace troupe::transport
