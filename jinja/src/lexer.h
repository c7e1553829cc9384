// Template source -> tokens (private to troupe::jinja).
//
// Preprocessing is the one Hugging Face applies to chat templates
// (lstrip_blocks and trim_blocks on, one trailing newline dropped, the
// transformers-only {% generation %} tags removed), then the text is split
// into text, tags and the tokens inside tags. Whitespace control ({%- -%},
// {{- -}}, {#- -#}) is applied here. Every token carries the line of the
// original source it starts on, for error messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::jinja::internal {

enum class Tok {
  kText,
  kNumber,      // 12, 1.5, -3 (a sign is folded in where it can only be unary)
  kString,      // value is the unescaped text
  kIdentifier,  // names and keywords alike
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,   // {%
  kCloseStatement,  // %}
  kOpenExpression,  // {{
  kCloseExpression,  // }}
  kOpenBracket,
  kCloseBracket,
  kOpenBrace,
  kCloseBrace,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a lone + or -
  kComment,
};

struct Token {
  Tok type;
  std::string value;
  int line;
};

// Throws TemplateError (value.h) naming the line on a lexical error.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace troupe::jinja::internal
