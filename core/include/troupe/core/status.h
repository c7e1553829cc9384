// Status and Result: expected failures as values.
//
// A peer that is gone, a malformed message, a stale batch, a bad config key:
// functions return a [[nodiscard]] Status (or Result<T>) whose message names
// the problem. Broken internal invariants are bugs and use TROUPE_CHECK
// (check.h) instead. Both types are cheap to move and not thread-safe to share
// mutably (like any value type).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace troupe {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // bad config, bad CLI argument, bad tool argument
  kMalformed,        // undecodable bytes on the wire or on disk
  kProtocol,         // well-formed but violates the protocol (future version, wrong kind)
  kStale,            // data too old to use (policy lag)
  kNotFound,         // unknown actor, run, tensor name, file
  kAlreadyExists,
  kTimeout,            // a deadline passed
  kUnavailable,        // peer gone, socket closed, head unreachable
  kResourceExhausted,  // outbox full, message over the size limit, cache full
  kCancelled,          // stop requested
  kIo,                 // filesystem / OS error
  kInternal,           // should not happen, but is recoverable
};

// Short lowercase name of a code ("timeout", "malformed", ...).
const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  template <typename... Args>
  static Status Make(Code code, fmt::format_string<Args...> f, Args&&... args) {
    return Status(code, fmt::format(f, std::forward<Args>(args)...));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>", or "ok".
  std::string ToString() const;

  // Returns a copy with `context` prepended: "context: message".
  Status WithContext(std::string_view context) const;

  // Explicitly drop a status (documents that ignoring it is intended).
  void IgnoreError() const {}

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

#define TROUPE_DEFINE_STATUS_MAKER(Name, CodeValue)                        \
  template <typename... Args>                                              \
  inline Status Name(fmt::format_string<Args...> f, Args&&... args) {      \
    return Status(CodeValue, fmt::format(f, std::forward<Args>(args)...)); \
  }
TROUPE_DEFINE_STATUS_MAKER(InvalidArgument, Code::kInvalidArgument)
TROUPE_DEFINE_STATUS_MAKER(Malformed, Code::kMalformed)
TROUPE_DEFINE_STATUS_MAKER(ProtocolError, Code::kProtocol)
TROUPE_DEFINE_STATUS_MAKER(Stale, Code::kStale)
TROUPE_DEFINE_STATUS_MAKER(NotFound, Code::kNotFound)
TROUPE_DEFINE_STATUS_MAKER(AlreadyExists, Code::kAlreadyExists)
TROUPE_DEFINE_STATUS_MAKER(Timeout, Code::kTimeout)
TROUPE_DEFINE_STATUS_MAKER(Unavailable, Code::kUnavailable)
TROUPE_DEFINE_STATUS_MAKER(ResourceExhausted, Code::kResourceExhausted)
TROUPE_DEFINE_STATUS_MAKER(Cancelled, Code::kCancelled)
TROUPE_DEFINE_STATUS_MAKER(IoError, Code::kIo)
TROUPE_DEFINE_STATUS_MAKER(Internal, Code::kInternal)
#undef TROUPE_DEFINE_STATUS_MAKER

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(implicit)
    if (std::get<Status>(v_).ok()) v_ = Status(Code::kInternal, "Result built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace troupe

// Return early on a non-ok Status.
#define TROUPE_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::troupe::Status _troupe_st = (expr);    \
    if (!_troupe_st.ok()) return _troupe_st; \
  } while (0)

#define TROUPE_CONCAT_INNER(a, b) a##b
#define TROUPE_CONCAT(a, b) TROUPE_CONCAT_INNER(a, b)
// TROUPE_ASSIGN_OR_RETURN(auto x, MakeX()); returns the status on error.
#define TROUPE_ASSIGN_OR_RETURN(lhs, expr) \
  TROUPE_ASSIGN_OR_RETURN_IMPL(TROUPE_CONCAT(_troupe_res_, __LINE__), lhs, expr)
#define TROUPE_ASSIGN_OR_RETURN_IMPL(res, lhs, expr) \
  auto res = (expr);                                 \
  if (!res.ok()) return res.status();                \
  lhs = std::move(res).value()
