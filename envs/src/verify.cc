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

namespace {

// Normalises a number as FinalNumericAnswer documents; nullopt when it is not one.
std::optional<std::string> NormaliseNumber(std::string_view text) {
  std::string t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '$') continue;
    if (c == '\\' && i + 1 < text.size() && text[i + 1] == '$') continue;
    t.push_back(c);
  }
  if (!t.empty() && t.back() == '.') t.pop_back();
  size_t i = 0;
  const bool negative = !t.empty() && t[0] == '-';
  if (negative || (!t.empty() && t[0] == '+')) i = 1;
  const size_t int_begin = i;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  if (i == int_begin || i - int_begin > 30) return std::nullopt;
  std::string whole = t.substr(int_begin, i - int_begin), frac;
  if (i < t.size() && t[i] == '.') {
    const size_t f = ++i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
    if (i == f) return std::nullopt;
    frac = t.substr(f, i - f);
  }
  if (i != t.size()) return std::nullopt;
  whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size() - 1));
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  std::string out = frac.empty() ? whole : whole + "." + frac;
  if (negative && out != "0") out = "-" + out;
  return out;
}

}  // namespace

std::optional<std::string> FinalNumericAnswer(std::string_view text) {
  const size_t boxed = text.rfind("\\boxed{");
  if (boxed != std::string_view::npos) {
    const size_t begin = boxed + 7;
    int depth = 1;
    for (size_t i = begin; i < text.size(); ++i) {
      if (text[i] == '{') ++depth;
      if (text[i] == '}' && --depth == 0) return NormaliseNumber(text.substr(begin, i - begin));
    }
    return std::nullopt;  // unbalanced
  }
  const size_t mark = text.rfind("####");
  if (mark == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(mark + 4);
  return NormaliseNumber(rest.substr(0, rest.find('\n')));
}

double NumericAnswerMatch(std::string_view response, std::string_view reference) {
  std::optional<std::string> want = FinalNumericAnswer(reference);
  if (!want) want = NormaliseNumber(reference);
  if (!want) return 0.0;
  const std::optional<std::string> got = FinalNumericAnswer(response);
  return got && *got == *want ? 1.0 : 0.0;
}

}  // namespace troupe::envs
