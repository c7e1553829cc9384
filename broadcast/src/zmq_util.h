// Thin RAII wrappers over the libzmq C API for the broadcast's sockets.
//
// The bulk path receives payload frames straight into buffers we own
// (zmq_recv into a preallocated stream) and sends them zero-copy from those
// buffers (the frame keeps its FlatBuffer alive until libzmq is done with it).
// Every blocking operation takes a Deadline. A socket is used by one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.h>

#include "buffer_pool.h"
#include "troupe/core/deadline.h"
#include "troupe/core/status.h"

namespace troupe::broadcast {

// Status for the last zmq error (errno), naming the operation.
Status ZmqError(std::string_view what);

class ZmqContext {
 public:
  ZmqContext();
  ~ZmqContext();
  ZmqContext(const ZmqContext&) = delete;
  ZmqContext& operator=(const ZmqContext&) = delete;
  void* get() const { return ctx_; }

 private:
  void* ctx_;
};

class ZmqSocket {
 public:
  ZmqSocket() = default;
  static Result<ZmqSocket> Create(const ZmqContext& ctx, int type);
  ~ZmqSocket() { Close(); }
  ZmqSocket(ZmqSocket&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  ZmqSocket& operator=(ZmqSocket&& o) noexcept {
    if (this != &o) {
      Close();
      s_ = o.s_;
      o.s_ = nullptr;
    }
    return *this;
  }
  ZmqSocket(const ZmqSocket&) = delete;
  ZmqSocket& operator=(const ZmqSocket&) = delete;

  void* get() const { return s_; }
  explicit operator bool() const { return s_ != nullptr; }
  void Close();

  Status SetInt(int option, int value);
  Status SetBytes(int option, std::string_view value);
  // Binds and returns the resolved endpoint (port 0 replaced by the chosen port).
  Result<std::string> Bind(const std::string& endpoint);
  Status Connect(const std::string& endpoint);

  // Sends one frame (copied). Waits for room until the deadline.
  Status Send(const void* data, size_t size, bool more, Deadline deadline);
  Status Send(std::string_view bytes, bool more, Deadline deadline) {
    return Send(bytes.data(), bytes.size(), more, deadline);
  }
  // Sends `size` bytes at `data` without copying; `keep` (the owner of the bytes) stays referenced
  // until libzmq releases the frame (which may be after this returns).
  Status SendZeroCopy(const uint8_t* data, size_t size, std::shared_ptr<void> keep, bool more,
                      Deadline deadline);
  // Receives one frame if available (non-blocking): false when none is waiting.
  Result<bool> TryRecv(std::string* frame, bool* more);
  // Receives the rest of a multipart message into nothing (drops it).
  void DrainMore();
  // True when a frame is waiting, waiting up to `timeout_ms` (0 = just check).
  bool WaitReadable(int timeout_ms);

 private:
  explicit ZmqSocket(void* s) : s_(s) {}
  void* s_ = nullptr;
};

// zmq_poll over several sockets for POLLIN: returns the readable flags (same order).
std::vector<bool> PollReadable(const std::vector<void*>& sockets, int timeout_ms);

}  // namespace troupe::broadcast
