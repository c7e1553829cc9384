// Regular expressions of the HF tokenizer (private to engine/): PCRE2 (UTF + UCP,
// JIT-compiled), and the translation of a tokenizer.json pattern into PCRE2.
//
// Hugging Face writes patterns for Oniguruma; tokenizers.js (the reference) rewrites
// them into JavaScript regexes with definite Unicode meanings (\s is White_Space, \w
// is Unicode word, (?i:...) folds ASCII letters only, `x{n,m}+` nests quantifiers as
// Oniguruma does, `++`/`*+` lose their possessiveness). TranslatePattern produces a
// PCRE2 pattern with the same meaning; a construct it cannot translate faithfully is
// an error naming it, never a guess.
//
// A Regex is immutable after Compile and safe to use from any number of threads
// (match scratch space is per thread).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "troupe/core/status.h"

struct pcre2_real_code_8;

namespace troupe::engine::hf {

class Regex {
 public:
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Compiles a PCRE2 pattern (UTF, UCP, LF newlines). `what` names it in errors.
  static Result<std::unique_ptr<Regex>> Compile(const std::string& pattern, std::string_view what);

  // Finds the first match at or after byte `from` of well-formed UTF-8 `s`. Returns
  // false when there is none; fails on a PCRE2 resource error (match/JIT stack limit).
  Result<bool> Find(std::string_view s, size_t from, size_t* begin, size_t* end) const;

  // Calls fn(begin, end) for every match, left to right, as JavaScript's global
  // matching (String.prototype.matchAll with the u flag) visits them: after an empty
  // match the search resumes one code point later.
  template <typename Fn>
  Status ForEach(std::string_view s, Fn&& fn) const {
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t b = 0, e = 0;
      Result<bool> found = Find(s, pos, &b, &e);
      if (!found.ok()) return found.status();
      if (!*found) break;
      fn(b, e);
      if (e > b) {
        pos = e;
      } else {  // empty match: step one code point
        if (e >= s.size()) break;
        pos = e + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
    return Status::Ok();
  }

  const std::string& pattern() const { return pattern_; }
  int capture_count() const;
  bool can_match_empty() const;

 private:
  Regex(pcre2_real_code_8* code, std::string pattern, bool jit);
  pcre2_real_code_8* code_;
  std::string pattern_;
  bool jit_;
};

// tokenizer.json "Regex" pattern -> PCRE2 pattern with tokenizers.js's meaning.
Result<std::string> TranslatePattern(std::string_view pattern);
// tokenizer.json "String" pattern (a literal) -> PCRE2 pattern matching exactly it.
std::string QuoteLiteral(std::string_view literal);
// PCRE2 class body of JavaScript's \s (the ByteLevel pre-tokenizer's built-in
// pattern is a plain JavaScript regex in the reference, so it uses this \s).
extern const char kJsWhitespaceClass[];

}  // namespace troupe::engine::hf
