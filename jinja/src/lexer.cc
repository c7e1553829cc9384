#include "lexer.h"

#include <fmt/format.h>

#include "unicode.h"
#include "value.h"

namespace troupe::jinja::internal {
namespace {

// Source as code points, each with the line it came from.
struct Source {
  std::u32string text;
  std::vector<int> line;
  void Push(char32_t c, int l) {
    text.push_back(c);
    line.push_back(l);
  }
};

bool IsLineStart(const Source& s, size_t i) {
  if (i == 0) return true;
  char32_t p = s.text[i - 1];
  return p == '\n' || p == '\r' || p == 0x2028 || p == 0x2029;
}

// The reference's preprocess(): same order, same patterns.
Source Preprocess(std::string_view utf8) {
  Source src;
  int line = 1;
  for (char32_t c : DecodeUtf8(utf8)) {
    src.Push(c, line);
    if (c == '\n') ++line;
  }
  if (!src.text.empty() && src.text.back() == '\n') {
    src.text.pop_back();
    src.line.pop_back();
  }
  // lstrip_blocks: ^[ \t]*({[#%-]) -> $1 at every line start.
  Source a;
  for (size_t i = 0; i < src.text.size();) {
    if (IsLineStart(src, i)) {
      size_t j = i;
      while (j < src.text.size() && (src.text[j] == ' ' || src.text[j] == '\t')) ++j;
      if (j + 1 < src.text.size() && src.text[j] == '{' &&
          (src.text[j + 1] == '#' || src.text[j + 1] == '%' || src.text[j + 1] == '-'))
        i = j;
    }
    a.Push(src.text[i], src.line[i]);
    ++i;
  }
  // trim_blocks: ([#%-]})\n -> $1.
  Source b;
  for (size_t i = 0; i < a.text.size(); ++i) {
    char32_t c = a.text[i];
    b.Push(c, a.line[i]);
    if ((c == '#' || c == '%' || c == '-') && i + 2 < a.text.size() && a.text[i + 1] == '}' &&
        a.text[i + 2] == '\n') {
      b.Push('}', a.line[i + 1]);
      i += 2;
    }
  }
  // (\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*) -> before/after unless stripped.
  Source out;
  size_t i = 0;
  const std::u32string kGen = U"generation", kEnd = U"end";
  while (i < b.text.size()) {
    size_t ws = i;
    while (ws < b.text.size() && IsJsSpace(b.text[ws])) ++ws;
    bool matched = false;
    if (ws + 1 < b.text.size() && b.text[ws] == '{' && b.text[ws + 1] == '%') {
      size_t j = ws + 2;
      bool lstrip = j < b.text.size() && b.text[j] == '-';
      if (lstrip) ++j;
      while (j < b.text.size() && IsJsSpace(b.text[j])) ++j;
      if (b.text.compare(j, kEnd.size(), kEnd) == 0 &&
          b.text.compare(j + kEnd.size(), kGen.size(), kGen) == 0)
        j += kEnd.size();
      if (b.text.compare(j, kGen.size(), kGen) == 0) {
        j += kGen.size();
        while (j < b.text.size() && IsJsSpace(b.text[j])) ++j;
        bool rstrip = j < b.text.size() && b.text[j] == '-';
        if (rstrip) ++j;
        if (j + 1 < b.text.size() && b.text[j] == '%' && b.text[j + 1] == '}') {
          j += 2;
          size_t after = j;
          while (after < b.text.size() && IsJsSpace(b.text[after])) ++after;
          if (!lstrip)
            for (size_t k = i; k < ws; ++k) out.Push(b.text[k], b.line[k]);
          if (!rstrip)
            for (size_t k = j; k < after; ++k) out.Push(b.text[k], b.line[k]);
          i = after;
          matched = true;
        }
      }
    }
    if (!matched) {
      // No tag after this whitespace run: emit the run (or one character) and go on.
      size_t end = ws > i ? ws : i + 1;
      for (size_t k = i; k < end; ++k) out.Push(b.text[k], b.line[k]);
      i = end;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(Source src) : s_(std::move(src)) {}

  std::vector<Token> Run() {
    while (pos_ < size()) {
      if (AtTextStart()) {
        size_t begin = pos_;
        while (pos_ < size() && !AtTagOpen(pos_)) ++pos_;
        if (pos_ > begin) {
          Push(Tok::kText, Slice(begin, pos_), begin);
          continue;
        }
      }
      if (At(pos_, U"{#")) {
        LexComment();
        continue;
      }
      if (At(pos_, U"{%-") || At(pos_, U"{{-")) {
        StripTrailingWhitespace();
        bool statement = s_.text[pos_ + 1] == '%';
        Push(statement ? Tok::kOpenStatement : Tok::kOpenExpression, statement ? "{%" : "{{", pos_);
        if (!statement) brace_depth_ = 0;
        pos_ += 3;
        continue;
      }
      ConsumeWhile([](char32_t c) { return IsJsSpace(c); });
      if (At(pos_, U"-%}") || At(pos_, U"-}}")) {
        bool statement = s_.text[pos_ + 1] == '%';
        Push(statement ? Tok::kCloseStatement : Tok::kCloseExpression, statement ? "%}" : "}}",
             pos_);
        pos_ += 3;
        while (pos_ < size() && IsJsSpace(s_.text[pos_])) ++pos_;
        continue;
      }
      LexInTag();
    }
    return std::move(tokens_);
  }

 private:
  size_t size() const { return s_.text.size(); }
  int LineAt(size_t i) const { return s_.line.empty() ? 1 : s_.line[std::min(i, size() - 1)]; }
  bool At(size_t i, std::u32string_view lit) const {
    return s_.text.compare(i, lit.size(), lit.data(), lit.size()) == 0 && i + lit.size() <= size();
  }
  bool AtTagOpen(size_t i) const {
    return s_.text[i] == '{' && i + 1 < size() &&
           (s_.text[i + 1] == '%' || s_.text[i + 1] == '{' || s_.text[i + 1] == '#');
  }
  bool AtTextStart() const {
    if (tokens_.empty()) return true;
    Tok t = tokens_.back().type;
    return t == Tok::kCloseStatement || t == Tok::kCloseExpression || t == Tok::kComment;
  }
  std::string Slice(size_t b, size_t e) const { return EncodeUtf8(s_.text.substr(b, e - b)); }
  [[noreturn]] void Fail(size_t at, const std::string& why) const {
    throw TemplateError(LineAt(at), why);
  }
  void Push(Tok t, std::string v, size_t at) { tokens_.push_back(Token{t, std::move(v), LineAt(at)}); }

  void StripTrailingWhitespace() {
    if (tokens_.empty() || tokens_.back().type != Tok::kText) return;
    tokens_.back().value = JsTrim(tokens_.back().value, false, true);
    if (tokens_.back().value.empty()) tokens_.pop_back();
  }

  // The reference's consumeWhile: handles backslash escapes (string literals)
  // and fails when the input ends while the predicate still holds.
  template <typename Pred>
  std::u32string ConsumeWhile(Pred pred) {
    std::u32string out;
    while (pos_ < size() && pred(s_.text[pos_])) {
      if (s_.text[pos_] == '\\') {
        size_t at = pos_++;
        if (pos_ >= size()) Fail(at, "unexpected end of input after '\\'");
        char32_t e = s_.text[pos_++];
        if (e == 'x' || e == 'u') {
          size_t n = e == 'x' ? 2 : 4;
          uint32_t v = 0;
          for (size_t k = 0; k < n; ++k) {
            char32_t h = pos_ + k < size() ? s_.text[pos_ + k] : 0;
            int d = (h >= '0' && h <= '9')   ? int(h - '0')
                    : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                    : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                             : -1;
            if (d < 0) Fail(at, fmt::format("invalid escape sequence \\{}", char(e)));
            v = v * 16 + uint32_t(d);
          }
          pos_ += n;
          AppendUnit(v, &out, at);
          continue;
        }
        switch (e) {
          case 'n': out.push_back('\n'); break;
          case 't': out.push_back('\t'); break;
          case 'r': out.push_back('\r'); break;
          case 'b': out.push_back('\b'); break;
          case 'f': out.push_back('\f'); break;
          case 'v': out.push_back('\v'); break;
          case '\'': out.push_back('\''); break;
          case '"': out.push_back('"'); break;
          case '\\': out.push_back('\\'); break;
          default: {
            std::string shown;
            AppendUtf8(e, &shown);
            Fail(at, fmt::format("unexpected escaped character '{}'", shown));
          }
        }
        continue;
      }
      out.push_back(s_.text[pos_++]);
      if (pos_ >= size()) Fail(pos_ - 1, "unexpected end of input inside a tag");
    }
    if (high_surrogate_) Fail(pos_, "a \\u escape leaves half a surrogate pair");
    return out;
  }

  // A \u escape is a UTF-16 unit: pairs combine, halves alone are refused.
  void AppendUnit(uint32_t u, std::u32string* out, size_t at) {
    if (high_surrogate_) {
      if (u < 0xDC00 || u > 0xDFFF) Fail(at, "a \\u escape leaves half a surrogate pair");
      out->push_back(0x10000 + ((high_surrogate_ - 0xD800) << 10) + (u - 0xDC00));
      high_surrogate_ = 0;
      return;
    }
    if (u >= 0xD800 && u <= 0xDBFF) {
      high_surrogate_ = u;
      return;
    }
    if (u >= 0xDC00 && u <= 0xDFFF) Fail(at, "a \\u escape leaves half a surrogate pair");
    out->push_back(u);
  }

  void LexComment() {
    size_t at = pos_;
    pos_ += 2;
    bool strip_before = pos_ < size() && s_.text[pos_] == '-';
    if (strip_before) ++pos_;
    size_t begin = pos_;
    while (!(pos_ + 1 < size() && s_.text[pos_] == '#' && s_.text[pos_ + 1] == '}')) {
      if (pos_ + 2 >= size()) Fail(at, "missing end of comment tag '#}'");
      ++pos_;
    }
    std::u32string body = s_.text.substr(begin, pos_ - begin);
    bool strip_after = !body.empty() && body.back() == '-';
    if (strip_before) StripTrailingWhitespace();
    Push(Tok::kComment, EncodeUtf8(body), at);
    pos_ += 2;
    if (strip_after)
      while (pos_ < size() && IsJsSpace(s_.text[pos_])) ++pos_;
  }

  void LexInTag() {
    size_t at = pos_;
    char32_t c = s_.text[pos_];
    if (c == '-' || c == '+') {
      Tok last = tokens_.empty() ? Tok::kText : tokens_.back().type;
      if (tokens_.empty() || last == Tok::kText) Fail(at, fmt::format("unexpected character '{}'", char(c)));
      bool binary = last == Tok::kIdentifier || last == Tok::kNumber || last == Tok::kString ||
                    last == Tok::kCloseParen || last == Tok::kCloseBracket;
      if (!binary) {
        ++pos_;
        std::u32string num = ConsumeWhile([](char32_t d) { return d >= '0' && d <= '9'; });
        if (!num.empty() && pos_ + 1 < size() && s_.text[pos_] == '.' && IsDigit(s_.text[pos_ + 1])) {
          ++pos_;
          num.push_back('.');
          num += ConsumeWhile([](char32_t d) { return d >= '0' && d <= '9'; });
        }
        Push(num.empty() ? Tok::kUnary : Tok::kNumber, std::string(1, char(c)) + EncodeUtf8(num), at);
        return;
      }
    }
    static const struct {
      std::u32string_view text;
      Tok type;
    } kTable[] = {
        {U"{%", Tok::kOpenStatement}, {U"%}", Tok::kCloseStatement},
        {U"{{", Tok::kOpenExpression}, {U"}}", Tok::kCloseExpression},
        {U"(", Tok::kOpenParen},       {U")", Tok::kCloseParen},
        {U"{", Tok::kOpenBrace},       {U"}", Tok::kCloseBrace},
        {U"[", Tok::kOpenBracket},     {U"]", Tok::kCloseBracket},
        {U",", Tok::kComma},           {U".", Tok::kDot},
        {U":", Tok::kColon},           {U"|", Tok::kPipe},
        {U"<=", Tok::kComparison},     {U">=", Tok::kComparison},
        {U"==", Tok::kComparison},     {U"!=", Tok::kComparison},
        {U"<", Tok::kComparison},      {U">", Tok::kComparison},
        {U"+", Tok::kAdditive},        {U"-", Tok::kAdditive},
        {U"~", Tok::kAdditive},        {U"**", Tok::kPower},
        {U"*", Tok::kMultiplicative},  {U"//", Tok::kMultiplicative},
        {U"/", Tok::kMultiplicative},  {U"%", Tok::kMultiplicative},
        {U"=", Tok::kEquals},
    };
    for (const auto& e : kTable) {
      if (e.text == U"}}" && brace_depth_ > 0) continue;  // inside a dict literal
      if (!At(pos_, e.text)) continue;
      Push(e.type, EncodeUtf8(std::u32string(e.text)), at);
      if (e.type == Tok::kOpenExpression) brace_depth_ = 0;
      if (e.type == Tok::kOpenBrace) ++brace_depth_;
      if (e.type == Tok::kCloseBrace) --brace_depth_;
      pos_ += e.text.size();
      return;
    }
    if (c == '\'' || c == '"') {
      ++pos_;
      std::u32string str = ConsumeWhile([c](char32_t d) { return d != c; });
      Push(Tok::kString, EncodeUtf8(str), at);
      ++pos_;
      return;
    }
    if (IsDigit(c)) {
      std::u32string num = ConsumeWhile([](char32_t d) { return d >= '0' && d <= '9'; });
      bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::kDot;
      if (!after_dot && pos_ + 1 < size() && s_.text[pos_] == '.' && IsDigit(s_.text[pos_ + 1])) {
        ++pos_;
        num.push_back('.');
          num += ConsumeWhile([](char32_t d) { return d >= '0' && d <= '9'; });
      }
      Push(Tok::kNumber, EncodeUtf8(num), at);
      return;
    }
    if (IsWord(c)) {
      std::u32string word = ConsumeWhile([](char32_t d) { return IsWord(d); });
      Push(Tok::kIdentifier, EncodeUtf8(word), at);
      return;
    }
    std::string shown;
    AppendUtf8(c, &shown);
    Fail(at, fmt::format("unexpected character '{}' inside a tag", shown));
  }

  static bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }
  static bool IsWord(char32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || IsDigit(c) || c == '_';
  }

  Source s_;
  size_t pos_ = 0;
  int brace_depth_ = 0;
  uint32_t high_surrogate_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(std::string_view source) {
  return Lexer(Preprocess(source)).Run();
}

}  // namespace troupe::jinja::internal
