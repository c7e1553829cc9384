// Verification results and the scoring functions built-in tasks share.
//
// A verifier turns (prompt, response, reference, metadata) into a reward.
// Failures are values: a VerifyResult with reward 0 and a non-empty `failure`
// naming the problem, never an exception. Every reward is finite; built-in
// scoring functions return values in [0, 1]. All functions here are pure and
// thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::envs {

// What a reward actor knows about one sampled sequence (all views; the caller
// owns the bytes for the duration of the call).
struct VerifyInput {
  std::string_view prompt;     // rendered prompt text (informational for built-in tasks)
  std::string_view response;   // decoded response text, without the end-of-sequence token
  std::string_view reference;  // the task's expected answer (SequenceMeta.reference)
  std::string_view metadata;   // task-specific JSON object text, may be empty (SequenceMeta.extra)
};

struct VerifyResult {
  double reward = 0.0;  // finite; in [0, 1] for every built-in task
  std::string failure;  // non-empty when scoring failed; reward is then 0
  std::string scorer;   // verifier or service that produced the reward ("reverse", "http:math")
  std::vector<std::pair<std::string, double>> components;  // partial-credit parts, if any
  // No reward could be computed (an external service failed) and its service
  // says on_failure: drop — the sample must not be trained on.
  bool unscored = false;

  bool ok() const { return failure.empty(); }
  // A failed result: reward 0 with the reason.
  static VerifyResult Failure(std::string scorer, std::string reason);
};

// Copy of `s` without leading/trailing ASCII whitespace.
std::string_view TrimAscii(std::string_view s);

// 1 if the trimmed strings are equal, else 0.
double ExactMatch(std::string_view response, std::string_view reference);

// Left-aligned positional credit: the number of positions i where both trimmed
// strings have the same character, divided by the longer length. 1 only for an
// exact match; 0 when either is empty (both empty: 1).
double PositionalCredit(std::string_view response, std::string_view reference);

// Right-aligned positional credit for numbers: like PositionalCredit but
// aligned at the last character, so "357" vs "347" scores 2/3 and "57" vs
// "357" scores 2/3.
double RightAlignedCredit(std::string_view response, std::string_view reference);

// 1 - Levenshtein(response, reference) / max(len): free-form partial credit.
// Inputs longer than kMaxEditChars are cut to that length first (bounds the
// O(n*m) cost).
double EditDistanceCredit(std::string_view response, std::string_view reference);
inline constexpr size_t kMaxEditChars = 4096;

// The final numeric answer of a math solution, normalised: the content of the last
// `\boxed{...}` (braces balanced), else the rest of the line after the last `####` (GSM8K's
// marker). Whitespace, thousands commas, `$` / `\$` and one trailing '.' are dropped; what is
// left must be a decimal number (-?digits[.digits]); trailing fractional zeros are removed
// ("72.50" -> "72.5", "8.0" -> "8", "-0" -> "0"). nullopt when there is no marker or the
// marked text is not a number.
std::optional<std::string> FinalNumericAnswer(std::string_view text);

// 1 when the response's final numeric answer equals the reference's (its own marker, or the
// whole reference when it is a bare number), else 0. scoring: numeric.
double NumericAnswerMatch(std::string_view response, std::string_view reference);

}  // namespace troupe::envs
