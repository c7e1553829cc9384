// UTF-8 and Unicode helpers of the HF tokenizer (private to engine/), on ICU.
//
// Text inside the tokenizer is always well-formed UTF-8: input is made so first
// (ill-formed bytes become U+FFFD exactly as the WHATWG TextDecoder does, which is
// how the reference, tokenizers.js, receives bytes), so every other helper may
// assume it. All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/core/status.h"

namespace troupe::engine::hf {

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Appends `s` to `out` with each maximal ill-formed subpart replaced by U+FFFD
// (Unicode's recommended practice, as TextDecoder and Rust's from_utf8_lossy do).
void AppendValidUtf8(std::string_view s, std::string* out);

// The code point at byte offset `*i` of well-formed `s`; advances `*i` past it.
char32_t NextCodePoint(std::string_view s, size_t* i);
// The code point that ends at byte offset `end` of well-formed `s` (end > 0).
char32_t PrevCodePoint(std::string_view s, size_t end);
// Appends the UTF-8 encoding of `c` (a Unicode scalar value).
void AppendCodePoint(char32_t c, std::string* out);
// Length in UTF-16 code units (what JavaScript's String.length counts).
size_t Utf16Length(std::string_view s);

// JavaScript's whitespace (what String.prototype.trim removes and /\s/ matches):
// TAB, VT, FF, ZWNBSP, LF, CR, LS, PS and every Zs character.
bool IsJsWhitespace(char32_t c);
std::string_view TrimJsStart(std::string_view s);
std::string_view TrimJsEnd(std::string_view s);

// A word character of Rust's regex \w (Alphabetic, M, Nd, Pc, Join_Control): the
// test Hugging Face applies for added tokens with single_word.
bool IsWordChar(char32_t c);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
const char* NormalFormName(NormalForm form);
// Appends the normalization of `s` to `out`.
Status AppendNormalized(NormalForm form, std::string_view s, std::string* out);
// True when normalizing `s` would not change it (a fast check first).
bool IsNormalized(NormalForm form, std::string_view s);
// Appends `s` lowercased with Unicode's default (root locale) full case mapping,
// as JavaScript's toLowerCase does.
Status AppendLowercase(std::string_view s, std::string* out);

}  // namespace troupe::engine::hf
