// Check macros for internal invariants (bugs, not expected failures).
//
// TROUPE_CHECK(cond) and the comparison forms print file, line, the condition
// and the values involved, then abort. Use Status (status.h) for anything an
// input, a peer or a user can cause.
#pragma once

#include <fmt/format.h>

namespace troupe::detail {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr,
                              const std::string& detail);
}  // namespace troupe::detail

#define TROUPE_CHECK(cond)                                                     \
  do {                                                                         \
    if (!(cond)) ::troupe::detail::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define TROUPE_CHECK_MSG(cond, ...)                                                       \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::troupe::detail::CheckFailed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

#define TROUPE_CHECK_OP(a, op, b)                                                   \
  do {                                                                              \
    const auto& _troupe_a = (a);                                                    \
    const auto& _troupe_b = (b);                                                    \
    if (!(_troupe_a op _troupe_b))                                                  \
      ::troupe::detail::CheckFailed(__FILE__, __LINE__, #a " " #op " " #b,          \
                                    fmt::format("{} vs {}", _troupe_a, _troupe_b)); \
  } while (0)

#define TROUPE_CHECK_EQ(a, b) TROUPE_CHECK_OP(a, ==, b)
#define TROUPE_CHECK_NE(a, b) TROUPE_CHECK_OP(a, !=, b)
#define TROUPE_CHECK_LT(a, b) TROUPE_CHECK_OP(a, <, b)
#define TROUPE_CHECK_LE(a, b) TROUPE_CHECK_OP(a, <=, b)
#define TROUPE_CHECK_GT(a, b) TROUPE_CHECK_OP(a, >, b)
#define TROUPE_CHECK_GE(a, b) TROUPE_CHECK_OP(a, >=, b)
