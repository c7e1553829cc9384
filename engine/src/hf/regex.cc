#include "hf/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <utility>
#include <vector>

#include "hf/unicode.h"

namespace troupe::engine::hf {

const char kJsWhitespaceClass[] = "\\t\\n\\x0B\\f\\r\\p{Zs}\\x{2028}\\x{2029}\\x{FEFF}";

namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match scratch: match data with one ovector pair (only the whole match is
// read), a match context and a JIT stack that may grow to 8 MiB (long whitespace runs).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

// ---- translation of tokenizer.json patterns (Oniguruma syntax) into PCRE2 ----

constexpr char kWordClassBody[] =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr char kLineStart[] = "(?:(?<![\\s\\S])|(?<=\\n))";
constexpr char kLineEnd[] = "(?:(?=\\n)|(?![\\s\\S]))";

bool IsGeneralCategory(std::string_view n) {
  static const char* const kCats[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "L&", "M",  "Mn",
                                      "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps",
                                      "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",
                                      "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn"};
  for (const char* c : kCats)
    if (n == c) return true;
  return false;
}

bool IsHex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}
bool IsAsciiLetter(char32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A literal code point as PCRE2 source (inside or outside a class).
std::string Literal(char32_t c) {
  if (c < 0x80) {
    auto ch = static_cast<char>(c);
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == ' ' || ch == '_' || ch == '\'' ||
        ch == '"' || ch == ',' || ch == ';' || ch == ':' || ch == '<' || ch == '>' || ch == '=' ||
        ch == '@' || ch == '%' || ch == '&' || ch == '~' || ch == '`' || ch == '!')
      return std::string(1, ch);
    if (ch < 0x20 || ch == 0x7F) return fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(c));
    return std::string{'\\', ch};
  }
  std::string s;
  AppendCodePoint(c, &s);
  return s;
}

// Both cases of an ASCII letter as a class body ("aA").
std::string BothCases(char32_t c) {
  auto lo = static_cast<char>(std::tolower(static_cast<int>(c)));
  auto up = static_cast<char>(std::toupper(static_cast<int>(c)));
  return std::string{lo, up};
}

class Translator {
 public:
  explicit Translator(std::string_view in) : in_(in) {}

  Result<std::string> Run() {
    while (i_ < in_.size()) TROUPE_RETURN_IF_ERROR(Step());
    if (!groups_.empty()) return Error("unclosed group");
    return out_;
  }

 private:
  template <typename... Args>
  Status Error(fmt::format_string<Args...> f, Args&&... args) const {
    return InvalidArgument("regex /{}/ at offset {}: {}", in_, i_,
                           fmt::format(f, std::forward<Args>(args)...));
  }

  char32_t Peek(size_t at) const {
    size_t j = at;
    return NextCodePoint(in_, &j);
  }
  char32_t Take() { return NextCodePoint(in_, &i_); }
  bool Starts(std::string_view s) const { return in_.substr(i_, s.size()) == s; }

  void EmitAtom(const std::string& text) {
    atom_start_ = static_cast<int64_t>(out_.size());
    out_ += text;
    last_quantifier_ = false;
  }

  // Reads `{...}` after \p, \P or \x; i_ is at '{'.
  Result<std::string> Braced() {
    size_t close = in_.find('}', i_);
    if (close == std::string_view::npos) return Error("unterminated '{{'");
    std::string body(in_.substr(i_ + 1, close - i_ - 1));
    i_ = close + 1;
    return body;
  }

  // \p{name} / \P{name} in PCRE2 with JavaScript's meaning (a bare script name is the
  // Script property, as JS's Script=Name; PCRE2's bare name would mean Script_Extensions).
  std::string Property(bool negated, const std::string& name) const {
    std::string n = name;
    if (n.rfind("Script=", 0) == 0 || n.rfind("sc=", 0) == 0)
      n = "sc:" + n.substr(n.find('=') + 1);
    else if (!IsGeneralCategory(n) && n != "White_Space" && n != "Alphabetic" && n != "Lowercase" &&
             n != "Uppercase" && n != "Any" && n.find(':') == std::string::npos)
      n = "sc:" + n;
    return fmt::format("\\{}{{{}}}", negated ? 'P' : 'p', n);
  }

  // A code point given in hex (\x{..}, \xHH, \uHHHH).
  Result<char32_t> HexValue(const std::string& hex) const {
    if (hex.empty() || hex.size() > 6) return Error("bad hex escape '{}'", hex);
    for (char c : hex)
      if (!IsHex(c)) return Error("bad hex escape '{}'", hex);
    auto v = static_cast<char32_t>(std::stoul(hex, nullptr, 16));
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return Error("bad code point '{}'", hex);
    return v;
  }

  // Reads a hex escape after the backslash (i_ at 'x' or 'u'); -1 when it is not one.
  Result<int64_t> MaybeHexEscape() {
    char c = in_[i_];
    if (c == 'x' && i_ + 1 < in_.size() && in_[i_ + 1] == '{') {
      ++i_;
      TROUPE_ASSIGN_OR_RETURN(std::string body, Braced());
      TROUPE_ASSIGN_OR_RETURN(char32_t v, HexValue(body));
      return static_cast<int64_t>(v);
    }
    size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 0;
    if (digits == 0 || i_ + digits >= in_.size()) return -1;
    std::string hex(in_.substr(i_ + 1, digits));
    for (char h : hex)
      if (!IsHex(h)) return -1;
    i_ += 1 + digits;
    TROUPE_ASSIGN_OR_RETURN(char32_t v, HexValue(hex));
    return static_cast<int64_t>(v);
  }

  // An escape outside a class (i_ at the backslash).
  Status Escape() {
    ++i_;  // the backslash
    if (i_ >= in_.size()) return Error("pattern ends with a backslash");
    char32_t c = Peek(i_);
    if (c == 'p' || c == 'P') {
      ++i_;
      if (i_ >= in_.size() || in_[i_] != '{')
        return Error("\\{} without {{name}}", static_cast<char>(c));
      TROUPE_ASSIGN_OR_RETURN(std::string name, Braced());
      if (name == "Word") {
        EmitAtom(fmt::format(c == 'p' ? "[{}]" : "[^{}]", kWordClassBody));
      } else {
        EmitAtom(Property(c == 'P', name));
      }
      return Status::Ok();
    }
    TROUPE_ASSIGN_OR_RETURN(int64_t hex, MaybeHexEscape());
    if (hex >= 0) {
      auto v = static_cast<char32_t>(hex);
      EmitAtom(fold_ && IsAsciiLetter(v) ? "[" + BothCases(v) + "]" : Literal(v));
      return Status::Ok();
    }
    Take();
    switch (c) {
      case 'G':
        return Status::Ok();  // dropped, as the reference does
      case 'A':
        EmitAtom("(?<![\\s\\S])");
        return Status::Ok();
      case 'z':
        EmitAtom("(?![\\s\\S])");
        return Status::Ok();
      case 'Z':
        EmitAtom("(?=\\n?(?![\\s\\S]))");
        return Status::Ok();
      case 'h':
        EmitAtom("[0-9A-Fa-f]");
        return Status::Ok();
      case 'H':
        EmitAtom("[^0-9A-Fa-f]");
        return Status::Ok();
      case 'w':
        EmitAtom(fmt::format("[{}]", kWordClassBody));
        return Status::Ok();
      case 'W':
        EmitAtom(fmt::format("[^{}]", kWordClassBody));
        return Status::Ok();
      case 'd':
        EmitAtom("\\p{Nd}");
        return Status::Ok();
      case 'D':
        EmitAtom("\\P{Nd}");
        return Status::Ok();
      case 's':
        EmitAtom("\\p{White_Space}");
        return Status::Ok();
      case 'S':
        EmitAtom("\\P{White_Space}");
        return Status::Ok();
      case 'b':
        EmitAtom(fmt::format("(?:(?<![{0}])(?=[{0}])|(?<=[{0}])(?![{0}]))", kWordClassBody));
        return Status::Ok();
      case 'B':
        EmitAtom(fmt::format("(?:(?<![{0}])(?![{0}])|(?<=[{0}])(?=[{0}]))", kWordClassBody));
        return Status::Ok();
      case 'a':
        EmitAtom("\\x07");
        return Status::Ok();
      case 'e':
        EmitAtom("\\x1B");
        return Status::Ok();
      case 'n':
      case '\n':
        EmitAtom("\\n");
        return Status::Ok();
      case 'r':
      case '\r':
        EmitAtom("\\r");
        return Status::Ok();
      case 't':
      case '\t':
        EmitAtom("\\t");
        return Status::Ok();
      case 'f':
      case '\f':
        EmitAtom("\\f");
        return Status::Ok();
      case 'v':
      case '\v':
        EmitAtom("\\x0B");
        return Status::Ok();
      case '0':
        if (i_ < in_.size() && std::isdigit(static_cast<unsigned char>(in_[i_])))
          return Error("octal escapes are not supported");
        EmitAtom("\\x00");
        return Status::Ok();
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      EmitAtom(std::string{'\\', static_cast<char>(c)});  // back-reference
      return Status::Ok();
    }
    if (c < 0x80 && std::isalpha(static_cast<int>(c)))
      return Error("escape \\{} is not supported", static_cast<char>(c));
    EmitAtom(Literal(c));
    return Status::Ok();
  }

  // One member of a character class; appends its PCRE2 form to *body. Sets *single to
  // the code point when it is one (a possible range end), else to -1.
  Status ClassMember(std::string* body, int64_t* single) {
    *single = -1;
    char32_t c = Peek(i_);
    if (c == '[') return Error("nested classes and POSIX brackets are not supported");
    if (c == '&' && Starts("&&")) return Error("class intersection '&&' is not supported");
    if (c != '\\') {
      Take();
      *single = c;
      return Status::Ok();
    }
    ++i_;
    if (i_ >= in_.size()) return Error("pattern ends with a backslash");
    c = Peek(i_);
    if (c == 'p' || c == 'P') {
      ++i_;
      if (i_ >= in_.size() || in_[i_] != '{')
        return Error("\\{} without {{name}}", static_cast<char>(c));
      TROUPE_ASSIGN_OR_RETURN(std::string name, Braced());
      if (name == "Word") {
        if (c == 'P') return Error("\\P{{Word}} inside a class is not supported");
        *body += kWordClassBody;
      } else {
        *body += Property(c == 'P', name);
      }
      return Status::Ok();
    }
    TROUPE_ASSIGN_OR_RETURN(int64_t hex, MaybeHexEscape());
    if (hex >= 0) {
      *single = hex;
      return Status::Ok();
    }
    Take();
    switch (c) {
      case 's':
        *body += "\\p{White_Space}";
        return Status::Ok();
      case 'S':
        *body += "\\P{White_Space}";
        return Status::Ok();
      case 'd':
        *body += "\\p{Nd}";
        return Status::Ok();
      case 'D':
        *body += "\\P{Nd}";
        return Status::Ok();
      case 'w':
        *body += kWordClassBody;
        return Status::Ok();
      case 'h':
        *body += "0-9A-Fa-f";
        return Status::Ok();
      case 'W':
      case 'H':
        return Error("\\{} inside a class is not supported", static_cast<char>(c));
      case 'n':
        *single = '\n';
        return Status::Ok();
      case 'r':
        *single = '\r';
        return Status::Ok();
      case 't':
        *single = '\t';
        return Status::Ok();
      case 'f':
        *single = '\f';
        return Status::Ok();
      case 'v':
        *single = '\v';
        return Status::Ok();
      case 'a':
        *single = 0x07;
        return Status::Ok();
      case 'e':
        *single = 0x1B;
        return Status::Ok();
      case '0':
        *single = 0;
        return Status::Ok();
      default:
        break;
    }
    if (c < 0x80 && std::isalnum(static_cast<int>(c)))
      return Error("escape \\{} inside a class is not supported", static_cast<char>(c));
    *single = c;
    return Status::Ok();
  }

  // Appends a single code point or a range lo-hi to a class body, adding the other case
  // of ASCII letters inside (?i:...) as the reference does.
  Status ClassRange(char32_t lo, char32_t hi, std::string* body) {
    if (hi < lo) return Error("class range out of order");
    *body += Literal(lo);
    if (hi != lo) *body += "-" + Literal(hi);
    if (!fold_) return Status::Ok();
    bool lower = lo >= 'a' && hi <= 'z', upper = lo >= 'A' && hi <= 'Z';
    if (lower || upper) {
      auto flip = [&](char32_t x) {
        return static_cast<char32_t>(lower ? std::toupper(static_cast<int>(x))
                                           : std::tolower(static_cast<int>(x)));
      };
      *body += Literal(flip(lo));
      if (hi != lo) *body += "-" + Literal(flip(hi));
      return Status::Ok();
    }
    bool touches_letters = !(hi < 'A' || lo > 'z' || (lo > 'Z' && hi < 'a'));
    if (touches_letters)
      return Error("case-insensitive class range mixing letters is not supported");
    return Status::Ok();
  }

  Status Class() {
    ++i_;  // '['
    std::string body;
    bool negated = false;
    if (i_ < in_.size() && in_[i_] == '^') {
      negated = true;
      ++i_;
    }
    if (i_ < in_.size() && in_[i_] == ']')
      return Error("empty class or leading ']' is not supported");
    while (true) {
      if (i_ >= in_.size()) return Error("unterminated class");
      if (in_[i_] == ']') {
        ++i_;
        break;
      }
      int64_t lo = -1;
      TROUPE_RETURN_IF_ERROR(ClassMember(&body, &lo));
      if (lo < 0) continue;
      bool range = i_ + 1 < in_.size() && in_[i_] == '-' && in_[i_ + 1] != ']';
      if (!range) {
        TROUPE_RETURN_IF_ERROR(
            ClassRange(static_cast<char32_t>(lo), static_cast<char32_t>(lo), &body));
        continue;
      }
      ++i_;  // '-'
      int64_t hi = -1;
      TROUPE_RETURN_IF_ERROR(ClassMember(&body, &hi));
      if (hi < 0) return Error("class range ends in a set");
      TROUPE_RETURN_IF_ERROR(
          ClassRange(static_cast<char32_t>(lo), static_cast<char32_t>(hi), &body));
    }
    EmitAtom(std::string(negated ? "[^" : "[") + body + "]");
    return Status::Ok();
  }

  Status Group() {
    std::string prefix = "(";
    bool fold = fold_;
    if (Starts("(?i:")) {
      prefix = "(?:";
      fold = true;
      i_ += 4;
    } else if (Starts("(?:") || Starts("(?=") || Starts("(?!")) {
      prefix = std::string(in_.substr(i_, 3));
      i_ += 3;
    } else if (Starts("(?>")) {
      prefix = "(?:";  // atomic groups become plain ones, as in the reference
      i_ += 3;
    } else if (Starts("(?<=") || Starts("(?<!")) {
      prefix = std::string(in_.substr(i_, 4));
      i_ += 4;
    } else if (Starts("(?<")) {
      size_t close = in_.find('>', i_);
      if (close == std::string_view::npos) return Error("unterminated group name");
      prefix = std::string(in_.substr(i_, close + 1 - i_));
      i_ = close + 1;
    } else if (Starts("(?")) {
      return Error("group '{}' is not supported", in_.substr(i_, 4));
    } else {
      ++i_;
    }
    groups_.emplace_back(static_cast<int64_t>(out_.size()), fold_);
    fold_ = fold;
    out_ += prefix;
    last_quantifier_ = false;
    return Status::Ok();
  }

  // `{n}`, `{n,}`, `{n,m}` or `{,m}` at i_; false when it is a literal brace.
  bool Quantifier() {
    size_t j = i_ + 1;
    std::string body;
    while (j < in_.size() && (std::isdigit(static_cast<unsigned char>(in_[j])) || in_[j] == ','))
      body += in_[j++];
    if (j >= in_.size() || in_[j] != '}' || body.empty() || atom_start_ < 0) return false;
    size_t comma = body.find(',');
    if (comma != std::string::npos && body.find(',', comma + 1) != std::string::npos) return false;
    if (comma == 0) {  // `{,m}` is `{0,m}`; `{,}` is literal
      if (body.size() == 1) return false;
      body = "0" + body;
    }
    i_ = j + 1;
    if (i_ < in_.size() && (in_[i_] == '+' || in_[i_] == '*')) {
      // Oniguruma reads `x{n,m}+` as a quantified interval, not a possessive one.
      auto start = static_cast<size_t>(atom_start_);
      out_ = out_.substr(0, start) + "(?:" + out_.substr(start) + "{" + body + "})" + in_[i_];
      ++i_;
    } else {
      out_ += "{" + body + "}";
    }
    last_quantifier_ = true;
    return true;
  }

  Status Step() {
    char32_t c = Peek(i_);
    switch (c) {
      case '\\':
        return Escape();
      case '[':
        return Class();
      case '(':
        return Group();
      case ')':
        if (groups_.empty()) return Error("unbalanced ')'");
        ++i_;
        out_ += ')';
        atom_start_ = groups_.back().first;
        fold_ = groups_.back().second;
        groups_.pop_back();
        last_quantifier_ = false;
        return Status::Ok();
      case ']':
        ++i_;
        EmitAtom("\\]");
        return Status::Ok();
      case '}':
        ++i_;
        EmitAtom("\\}");
        return Status::Ok();
      case '.':
        ++i_;
        EmitAtom("[^\\n]");
        return Status::Ok();
      case '^':
        ++i_;
        EmitAtom(kLineStart);
        return Status::Ok();
      case '$':
        ++i_;
        EmitAtom(kLineEnd);
        return Status::Ok();
      case '|':
        ++i_;
        out_ += '|';
        atom_start_ = -1;
        last_quantifier_ = false;
        return Status::Ok();
      case '{':
        if (!Quantifier()) {
          ++i_;
          EmitAtom("\\{");
        }
        return Status::Ok();
      case '+':
        ++i_;
        if (last_quantifier_) return Status::Ok();  // possessive '+' dropped, as in the reference
        out_ += '+';
        last_quantifier_ = true;
        return Status::Ok();
      case '*':
      case '?':
        ++i_;
        out_ += static_cast<char>(c);
        last_quantifier_ = true;
        return Status::Ok();
      default:
        Take();
        EmitAtom(fold_ && IsAsciiLetter(c) ? "[" + BothCases(c) + "]" : Literal(c));
        return Status::Ok();
    }
  }

  std::string_view in_;
  size_t i_ = 0;
  std::string out_;
  int64_t atom_start_ = -1;
  bool last_quantifier_ = false;
  bool fold_ = false;
  std::vector<std::pair<int64_t, bool>> groups_;  // output offset, fold state outside
};

}  // namespace

Regex::Regex(pcre2_code* code, std::string pattern, bool jit)
    : code_(code), pattern_(std::move(pattern)), jit_(jit) {}

Regex::~Regex() {
  pcre2_code_free(code_);
}

Result<std::unique_ptr<Regex>> Regex::Compile(const std::string& pattern, std::string_view what) {
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, ctx);
  pcre2_compile_context_free(ctx);
  if (!code)
    return InvalidArgument("{}: PCRE2 cannot compile /{}/ (offset {}): {}", what, pattern, offset,
                           Pcre2Message(err));
  bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Regex>(new Regex(code, pattern, jit));
}

Result<bool> Regex::Find(std::string_view s, size_t from, size_t* begin, size_t* end) const {
  MatchScratch& scratch = Scratch();
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), from, 0, scratch.data, scratch.context)
                : pcre2_match(code_, subject, s.size(), from, PCRE2_NO_UTF_CHECK, scratch.data,
                              scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    return ResourceExhausted("regex /{}/ failed on a {}-byte text: {}", pattern_, s.size(),
                             Pcre2Message(rc));
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

int Regex::capture_count() const {
  uint32_t n = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &n);
  return static_cast<int>(n);
}

bool Regex::can_match_empty() const {
  uint32_t min_length = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_MINLENGTH, &min_length);
  return min_length == 0;
}

Result<std::string> TranslatePattern(std::string_view pattern) {
  return Translator(pattern).Run();
}

std::string QuoteLiteral(std::string_view literal) {
  std::string out;
  for (size_t i = 0; i < literal.size();) out += Literal(NextCodePoint(literal, &i));
  return out;
}

}  // namespace troupe::engine::hf
