#include "unicode.h"

#include <memory>
#include <mutex>

#include <unicode/coll.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

namespace troupe::jinja::internal {
namespace {

bool IsAscii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

bool IsAsciiWord(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Decodes one code point at s[i]; advances i. Bad bytes give U+FFFD and advance by 1.
char32_t Next(std::string_view s, size_t* i) {
  auto b0 = static_cast<unsigned char>(s[*i]);
  size_t n = Utf8SeqLen(b0);
  if (n == 1 || *i + n > s.size()) {
    ++*i;
    return b0 < 0x80 ? b0 : 0xFFFD;
  }
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) {
    auto b = static_cast<unsigned char>(s[*i + k]);
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *i += n;
  return cp;
}

std::string FromIcu(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

}  // namespace

size_t Utf8SeqLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SeqLen(b0);
    if (n == 1 || b0 == 0xC0 || b0 == 0xC1 || b0 > 0xF4 || i + n > s.size()) return false;
    char32_t cp = b0 & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(Next(s, &i));
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(const std::u32string& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

int64_t Utf16Length(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) n += Next(s, &i) >= 0x10000 ? 2 : 1;
  return n;
}

bool IsJsSpace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string JsTrim(std::string_view s, bool start, bool end) {
  size_t b = 0, e = s.size();
  if (start) {
    while (b < e) {
      size_t j = b;
      if (!IsJsSpace(Next(s, &j))) break;
      b = j;
    }
  }
  if (end) {
    while (e > b) {
      size_t j = e - 1;  // back up to the lead byte of the last character
      while (j > b && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
      size_t k = j;
      if (!IsJsSpace(Next(s, &k))) break;
      e = j;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (IsJsSpace(Next(s, &j))) {
      i = j;
      continue;
    }
    if (maxsplit != -1 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.emplace_back(s.substr(i));  // the rest, trailing whitespace included
      return out;
    }
    size_t word_end = i;
    while (word_end < s.size()) {
      size_t k = word_end;
      if (IsJsSpace(Next(s, &k))) break;
      word_end = k;
    }
    out.emplace_back(s.substr(i, word_end - i));
    i = word_end;
  }
  return out;
}

std::string ToUpper(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), s.size()));
  return FromIcu(u.toUpper(icu::Locale::getRoot()));
}

std::string ToLower(std::string_view s) {
  if (IsAscii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), s.size()));
  return FromIcu(u.toLower(icu::Locale::getRoot()));
}

std::string TitleAscii(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    auto c = static_cast<unsigned char>(out[i]);
    bool boundary = i == 0 || !IsAsciiWord(static_cast<unsigned char>(out[i - 1]));
    if (boundary && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 32);
  }
  return out;
}

std::string CapitalizeFirst(std::string_view s) {
  if (s.empty()) return std::string();
  size_t n = 0;
  char32_t first = Next(s, &n);
  if (first >= 0x10000) return std::string(s);  // charAt(0) is half a surrogate pair
  std::string head;
  AppendUtf8(first, &head);
  return ToUpper(head) + std::string(s.substr(n));
}

int CompareUtf16(std::string_view a, std::string_view b) {
  if (IsAscii(a) && IsAscii(b)) {
    int c = a.compare(b);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  icu::UnicodeString ua = icu::UnicodeString::fromUTF8(icu::StringPiece(a.data(), a.size()));
  icu::UnicodeString ub = icu::UnicodeString::fromUTF8(icu::StringPiece(b.data(), b.size()));
  int8_t c = ua.compare(ub);  // code-unit order
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

int LocaleCompare(std::string_view a, std::string_view b) {
  static std::once_flag once;
  static std::unique_ptr<icu::Collator> collator;
  static std::mutex mu;
  std::call_once(once, [] {
    UErrorCode status = U_ZERO_ERROR;
    collator.reset(icu::Collator::createInstance(icu::Locale("en", "US"), status));
    if (U_FAILURE(status)) collator.reset();
  });
  if (!collator) return CompareUtf16(a, b);
  UErrorCode status = U_ZERO_ERROR;
  std::lock_guard<std::mutex> lock(mu);  // Collator::compare is not documented thread-safe
  UCollationResult r = collator->compareUTF8(icu::StringPiece(a.data(), a.size()),
                                             icu::StringPiece(b.data(), b.size()), status);
  if (U_FAILURE(status)) return CompareUtf16(a, b);
  return r == UCOL_LESS ? -1 : r == UCOL_GREATER ? 1 : 0;
}

std::string JsonQuote(std::string_view s, bool ensure_ascii) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  auto unit = [&](uint32_t u) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(u >> shift) & 0xF]);
  };
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
            unit(c);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      continue;
    }
    size_t start = i;
    char32_t cp = Next(s, &i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
    } else if (cp < 0x10000) {
      unit(cp);
    } else {
      char32_t v = cp - 0x10000;
      unit(0xD800 + (v >> 10));
      unit(0xDC00 + (v & 0x3FF));
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace troupe::jinja::internal
