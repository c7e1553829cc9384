#include "troupe/core/status.h"

#include <cstdio>
#include <cstdlib>

#include "troupe/core/check.h"

namespace troupe {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kMalformed:
      return "malformed";
    case Code::kProtocol:
      return "protocol error";
    case Code::kStale:
      return "stale";
    case Code::kNotFound:
      return "not found";
    case Code::kAlreadyExists:
      return "already exists";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kResourceExhausted:
      return "resource exhausted";
    case Code::kCancelled:
      return "cancelled";
    case Code::kIo:
      return "i/o error";
    case Code::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

namespace detail {
void CheckFailed(const char* file, int line, const char* expr, const std::string& detail) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s%s%s\n", file, line, expr,
               detail.empty() ? "" : " (", detail.empty() ? "" : (detail + ")").c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace troupe
