// UTF-8 text with JavaScript string semantics (private to troupe::jinja).
//
// The reference implementation of chat templates (@huggingface/jinja) runs on
// JavaScript strings: UTF-16 code units for length and indexing, code points
// for slicing and join, JavaScript's whitespace set for trim/split, Unicode
// default case mapping for upper/lower. Templates here keep text as UTF-8 and
// these helpers reproduce those semantics exactly. Case mapping and collation
// use ICU (Debian's libicu); everything else is table-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::jinja::internal {

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);
// Code points of valid UTF-8 (behaviour on invalid input: each bad byte is U+FFFD).
std::u32string DecodeUtf8(std::string_view s);
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(const std::u32string& cps);
// Byte length of the UTF-8 sequence that starts with `lead` (1 for bad bytes).
size_t Utf8SeqLen(unsigned char lead);

// JavaScript String.length: UTF-16 code units.
int64_t Utf16Length(std::string_view s);

// JavaScript's WhiteSpace + LineTerminator set (String.prototype.trim, /\s/).
bool IsJsSpace(char32_t cp);
// trim / trimStart / trimEnd.
std::string JsTrim(std::string_view s, bool start, bool end);
// Splits on runs of JS whitespace (Python's str.split() with no separator,
// as the reference implements it with /\S+/g); maxsplit == -1: no limit,
// otherwise the rest of the text becomes one piece once `maxsplit` are found.
std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit);

// String.prototype.toUpperCase / toLowerCase (Unicode default full case mapping).
std::string ToUpper(std::string_view s);
std::string ToLower(std::string_view s);
// The reference's title(): an ASCII word character after a non-word
// character (or at the start) is upper-cased; nothing else changes.
std::string TitleAscii(std::string_view s);
// charAt(0).toUpperCase() + slice(1): only the first UTF-16 unit changes.
std::string CapitalizeFirst(std::string_view s);

// a < b in UTF-16 code-unit order (JavaScript's string comparison): -1, 0, 1.
int CompareUtf16(std::string_view a, std::string_view b);
// String.prototype.localeCompare under the en-US collation: -1, 0, 1.
int LocaleCompare(std::string_view a, std::string_view b);

// JSON.stringify of a string (quotes included); ensure_ascii additionally
// escapes every UTF-16 unit in [0x7f, 0xffff] as \uXXXX (lower-case hex),
// as the reference does.
std::string JsonQuote(std::string_view s, bool ensure_ascii);

}  // namespace troupe::jinja::internal
