#include "troupe/envs/verify.h"

#include <algorithm>
#include <vector>

namespace troupe::envs {

VerifyResult VerifyResult::Failure(std::string scorer, std::string reason) {
  VerifyResult r;
  r.reward = 0.0;
  r.scorer = std::move(scorer);
  r.failure = reason.empty() ? std::string("unspecified failure") : std::move(reason);
  return r;
}

namespace {
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
}  // namespace

std::string_view TrimAscii(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

double ExactMatch(std::string_view response, std::string_view reference) {
  return TrimAscii(response) == TrimAscii(reference) ? 1.0 : 0.0;
}

double PositionalCredit(std::string_view response, std::string_view reference) {
  std::string_view a = TrimAscii(response), b = TrimAscii(reference);
  if (a.empty() && b.empty()) return 1.0;
  size_t longest = std::max(a.size(), b.size());
  size_t shortest = std::min(a.size(), b.size());
  size_t same = 0;
  for (size_t i = 0; i < shortest; ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(longest);
}

double RightAlignedCredit(std::string_view response, std::string_view reference) {
  std::string_view a = TrimAscii(response), b = TrimAscii(reference);
  if (a.empty() && b.empty()) return 1.0;
  size_t longest = std::max(a.size(), b.size());
  size_t shortest = std::min(a.size(), b.size());
  size_t same = 0;
  for (size_t i = 1; i <= shortest; ++i) same += a[a.size() - i] == b[b.size() - i];
  return static_cast<double>(same) / static_cast<double>(longest);
}

double EditDistanceCredit(std::string_view response, std::string_view reference) {
  std::string_view a = TrimAscii(response).substr(0, kMaxEditChars);
  std::string_view b = TrimAscii(reference).substr(0, kMaxEditChars);
  if (a.empty() && b.empty()) return 1.0;
  // Two-row Levenshtein.
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({sub, prev[j] + 1, cur[j - 1] + 1});
    }
    std::swap(prev, cur);
  }
  double dist = static_cast<double>(prev[b.size()]);
  return 1.0 - dist / static_cast<double>(std::max(a.size(), b.size()));
}

}  // namespace troupe::envs
