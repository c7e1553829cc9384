#include "hf/unicode.h"

#include <cstring>

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

namespace troupe::engine::hf {
namespace {

// Index of the first byte >= 0x80 at or after `i` (8 bytes at a time).
size_t SkipAscii(std::string_view s, size_t i) {
  const size_t n = s.size();
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  return i;
}

const icu::Normalizer2* Instance(NormalForm form, UErrorCode* err) {
  switch (form) {
    case NormalForm::kNFC:
      return icu::Normalizer2::getNFCInstance(*err);
    case NormalForm::kNFD:
      return icu::Normalizer2::getNFDInstance(*err);
    case NormalForm::kNFKC:
      return icu::Normalizer2::getNFKCInstance(*err);
    case NormalForm::kNFKD:
      return icu::Normalizer2::getNFKDInstance(*err);
  }
  return nullptr;
}

bool AllAscii(std::string_view s) {
  return SkipAscii(s, 0) == s.size();
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  for (size_t i = SkipAscii(s, 0); i < s.size(); i = SkipAscii(s, i)) {
    int32_t j = static_cast<int32_t>(i);
    UChar32 c;
    U8_NEXT(p, j, n, c);
    if (c < 0) return false;
    i = static_cast<size_t>(j);
  }
  return true;
}

void AppendValidUtf8(std::string_view s, std::string* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  out->reserve(out->size() + s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t ascii_end = SkipAscii(s, i);
    out->append(s.data() + i, ascii_end - i);
    if (ascii_end == s.size()) break;
    int32_t j = static_cast<int32_t>(ascii_end);
    UChar32 c;
    U8_NEXT(p, j, n, c);  // on an ill-formed sequence: c < 0, j past its maximal subpart
    if (c < 0) {
      out->append("\xEF\xBF\xBD");
    } else {
      out->append(s.data() + ascii_end, static_cast<size_t>(j) - ascii_end);
    }
    i = static_cast<size_t>(j);
  }
}

char32_t NextCodePoint(std::string_view s, size_t* i) {
  auto c0 = static_cast<unsigned char>(s[*i]);
  if (c0 < 0x80) {
    ++*i;
    return c0;
  }
  int32_t j = static_cast<int32_t>(*i);
  UChar32 c;
  U8_NEXT_UNSAFE(reinterpret_cast<const uint8_t*>(s.data()), j, c);
  *i = static_cast<size_t>(j);
  return static_cast<char32_t>(c);
}

char32_t PrevCodePoint(std::string_view s, size_t end) {
  int32_t j = static_cast<int32_t>(end);
  UChar32 c;
  U8_PREV_UNSAFE(reinterpret_cast<const uint8_t*>(s.data()), j, c);
  return static_cast<char32_t>(c);
}

void AppendCodePoint(char32_t c, std::string* out) {
  uint8_t buf[4];
  int32_t len = 0;
  U8_APPEND_UNSAFE(buf, len, static_cast<UChar32>(c));
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
}

size_t Utf16Length(std::string_view s) {
  size_t units = 0;
  for (size_t i = 0; i < s.size();) units += NextCodePoint(s, &i) > 0xFFFF ? 2 : 1;
  return units;
}

bool IsJsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0xFEFF || c == 0x2028 || c == 0x2029 ||
         u_charType(static_cast<UChar32>(c)) == U_SPACE_SEPARATOR;
}

std::string_view TrimJsStart(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!IsJsWhitespace(NextCodePoint(s, &next))) break;
    i = next;
  }
  return s.substr(i);
}

std::string_view TrimJsEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!IsJsWhitespace(NextCodePoint(s, &probe))) break;
    end = start;
  }
  return s.substr(0, end);
}

bool IsWordChar(char32_t c) {
  auto u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL))
    return true;
  int8_t type = u_charType(u);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

const char* NormalFormName(NormalForm form) {
  switch (form) {
    case NormalForm::kNFC:
      return "NFC";
    case NormalForm::kNFD:
      return "NFD";
    case NormalForm::kNFKC:
      return "NFKC";
    case NormalForm::kNFKD:
      return "NFKD";
  }
  return "?";
}

bool IsNormalized(NormalForm form, std::string_view s) {
  if (AllAscii(s)) return true;  // ASCII is fixed by all four forms
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = Instance(form, &err);
  if (U_FAILURE(err)) return false;
  UBool yes =
      norm->isNormalizedUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), err);
  return U_SUCCESS(err) && yes;
}

Status AppendNormalized(NormalForm form, std::string_view s, std::string* out) {
  if (IsNormalized(form, s)) {
    out->append(s);
    return Status::Ok();
  }
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = Instance(form, &err);
  icu::StringByteSink<std::string> sink(out);
  if (U_SUCCESS(err))
    norm->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink,
                        nullptr, err);
  if (U_FAILURE(err))
    return Internal("ICU {} normalization failed: {}", NormalFormName(form), u_errorName(err));
  return Status::Ok();
}

Status AppendLowercase(std::string_view s, std::string* out) {
  UErrorCode err = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(out);
  icu::CaseMap::utf8ToLower("", 0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink,
                            nullptr, err);
  if (U_FAILURE(err)) return Internal("ICU lowercasing failed: {}", u_errorName(err));
  return Status::Ok();
}

}  // namespace troupe::engine::hf
