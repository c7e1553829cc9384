// libzmq wrappers (zmq_util.h).
#include "zmq_util.h"

#include <algorithm>
#include <cerrno>

#include "troupe/core/check.h"

namespace troupe::broadcast {
namespace {

// Longest single zmq_poll slice while waiting on a deadline (keeps deadlines precise).
constexpr int64_t kSliceMs = 200;

int SliceMs(Deadline d) {
  int64_t ms = d.remaining_ms_or_minus1();
  if (ms < 0) return static_cast<int>(kSliceMs);
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(ms, 1), kSliceMs));
}

void FreeKeep(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<void>*>(hint);
}

}  // namespace

Status ZmqError(std::string_view what) {
  int e = zmq_errno();
  if (e == EAGAIN) return Timeout("{}: timed out", what);
  if (e == EHOSTUNREACH) return Unavailable("{}: peer not connected", what);
  if (e == ETERM) return Cancelled("{}: context terminated", what);
  return Unavailable("{}: {}", what, zmq_strerror(e));
}

ZmqContext::ZmqContext() : ctx_(zmq_ctx_new()) {
  TROUPE_CHECK_MSG(ctx_ != nullptr, "zmq_ctx_new failed: {}", zmq_strerror(zmq_errno()));
  zmq_ctx_set(ctx_, ZMQ_BLOCKY, 0);  // sockets close with their own linger, not forever
}

ZmqContext::~ZmqContext() {
  zmq_ctx_term(ctx_);
}

Result<ZmqSocket> ZmqSocket::Create(const ZmqContext& ctx, int type) {
  void* s = zmq_socket(ctx.get(), type);
  if (s == nullptr) return ZmqError("zmq_socket");
  ZmqSocket sock(s);
  TROUPE_RETURN_IF_ERROR(sock.SetInt(ZMQ_LINGER, 0));
  return sock;
}

void ZmqSocket::Close() {
  if (s_ != nullptr) zmq_close(s_);
  s_ = nullptr;
}

Status ZmqSocket::SetInt(int option, int value) {
  if (zmq_setsockopt(s_, option, &value, sizeof(value)) != 0)
    return ZmqError(fmt::format("zmq_setsockopt({})", option));
  return Status::Ok();
}

Status ZmqSocket::SetBytes(int option, std::string_view value) {
  if (zmq_setsockopt(s_, option, value.data(), value.size()) != 0)
    return ZmqError(fmt::format("zmq_setsockopt({})", option));
  return Status::Ok();
}

Result<std::string> ZmqSocket::Bind(const std::string& endpoint) {
  if (zmq_bind(s_, endpoint.c_str()) != 0) return ZmqError(fmt::format("bind {}", endpoint));
  char buf[512];
  size_t len = sizeof(buf);
  if (zmq_getsockopt(s_, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return ZmqError("ZMQ_LAST_ENDPOINT");
  return std::string(buf, len > 0 && buf[len - 1] == '\0' ? len - 1 : len);
}

Status ZmqSocket::Connect(const std::string& endpoint) {
  if (zmq_connect(s_, endpoint.c_str()) != 0) return ZmqError(fmt::format("connect {}", endpoint));
  return Status::Ok();
}

Status ZmqSocket::Send(const void* data, size_t size, bool more, Deadline deadline) {
  int flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0);
  while (true) {
    if (zmq_send(s_, data, size, flags) >= 0) return Status::Ok();
    if (zmq_errno() != EAGAIN) return ZmqError("send");
    if (deadline.expired()) return Timeout("send: no room on the socket before the deadline");
    zmq_pollitem_t item{s_, 0, ZMQ_POLLOUT, 0};
    zmq_poll(&item, 1, SliceMs(deadline));
  }
}

Status ZmqSocket::SendZeroCopy(const uint8_t* data, size_t size, std::shared_ptr<void> keep,
                               bool more, Deadline deadline) {
  zmq_msg_t msg;
  auto* hint = new std::shared_ptr<void>(std::move(keep));
  if (zmq_msg_init_data(&msg, const_cast<uint8_t*>(data), size, FreeKeep, hint) != 0) {
    delete hint;
    return ZmqError("zmq_msg_init_data");
  }
  int flags = ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0);
  while (true) {
    if (zmq_msg_send(&msg, s_, flags) >= 0) return Status::Ok();  // libzmq owns msg now
    Status err = ZmqError("send");
    if (zmq_errno() != EAGAIN || deadline.expired()) {
      zmq_msg_close(&msg);  // releases `hint`
      return zmq_errno() == EAGAIN ? Timeout("send: no room on the socket before the deadline")
                                   : err;
    }
    zmq_pollitem_t item{s_, 0, ZMQ_POLLOUT, 0};
    zmq_poll(&item, 1, SliceMs(deadline));
  }
}

Result<bool> ZmqSocket::TryRecv(std::string* frame, bool* more) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  int n = zmq_msg_recv(&msg, s_, ZMQ_DONTWAIT);
  if (n < 0) {
    zmq_msg_close(&msg);
    if (zmq_errno() == EAGAIN) return false;
    return ZmqError("recv");
  }
  frame->assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
  *more = zmq_msg_more(&msg) != 0;
  zmq_msg_close(&msg);
  return true;
}

void ZmqSocket::DrainMore() {
  int more = 1;
  size_t len = sizeof(more);
  while (zmq_getsockopt(s_, ZMQ_RCVMORE, &more, &len) == 0 && more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    int n = zmq_msg_recv(&msg, s_, ZMQ_DONTWAIT);
    zmq_msg_close(&msg);
    if (n < 0) break;
  }
}

bool ZmqSocket::WaitReadable(int timeout_ms) {
  zmq_pollitem_t item{s_, 0, ZMQ_POLLIN, 0};
  return zmq_poll(&item, 1, timeout_ms) > 0 && (item.revents & ZMQ_POLLIN);
}

std::vector<bool> PollReadable(const std::vector<void*>& sockets, int timeout_ms) {
  std::vector<zmq_pollitem_t> items;
  items.reserve(sockets.size());
  for (void* s : sockets) items.push_back(zmq_pollitem_t{s, 0, ZMQ_POLLIN, 0});
  std::vector<bool> out(sockets.size(), false);
  if (zmq_poll(items.data(), static_cast<int>(items.size()), timeout_ms) > 0)
    for (size_t i = 0; i < items.size(); ++i) out[i] = (items[i].revents & ZMQ_POLLIN) != 0;
  return out;
}

}  // namespace troupe::broadcast
