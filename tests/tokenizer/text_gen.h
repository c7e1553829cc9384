// Seeded generator of tokenizer test texts (header-only; tests and bench/tokenizer).
//
// Each text is drawn from one family: English prose with contractions, code, CJK,
// emoji sequences, numbers in several scripts, whitespace runs (every kind JavaScript
// and Unicode disagree on), the tokenizer's own special-token texts and near misses,
// ill-formed UTF-8, random assigned code points with combining marks and compatibility
// characters (NFC/NFKC), or a mix of several. Code points are limited to those assigned
// in Unicode 14.0 or earlier (PCRE2 10.42's tables; ICU says which): a character added
// later may be classified differently by a reference with newer tables.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <unicode/uchar.h>

namespace troupe::testing {

class TextGen {
 public:
  enum Family {
    kProse,
    kCode,
    kCjk,
    kEmoji,
    kNumbers,
    kWhitespace,
    kSpecial,
    kInvalid,
    kUnicode,
    kMixed,
    kFamilies
  };

  // `specials`: texts of the tokenizer's added tokens (for the special family).
  TextGen(uint64_t seed, std::vector<std::string> specials)
      : rng_(seed), specials_(std::move(specials)) {}

  std::string Next() {
    static const int kWeights[kFamilies] = {20, 12, 10, 8, 8, 8, 10, 6, 10, 8};
    std::discrete_distribution<int> pick(std::begin(kWeights), std::end(kWeights));
    return Make(static_cast<Family>(pick(rng_)));
  }

  std::string Make(Family f) {
    switch (f) {
      case kProse:
        return Prose(Int(1, 12));
      case kCode:
        return Code(Int(1, 3));
      case kCjk:
        return Cjk(Int(1, 16));
      case kEmoji:
        return Emoji(Int(1, 6));
      case kNumbers:
        return Numbers(Int(1, 5));
      case kWhitespace:
        return Whitespace(Int(1, 4));
      case kSpecial:
        return Special(Int(1, 5));
      case kInvalid:
        return Invalid(Int(1, 8));
      case kUnicode:
        return Unicode(Int(1, 16));
      default: {
        std::string s;
        for (int k = Int(2, 3); k > 0; --k) s += Make(static_cast<Family>(Int(0, kMixed - 1)));
        return s;
      }
    }
  }

  // Prose of `words` words (also used by benchmarks for realistic text).
  std::string Prose(int words) {
    static const char* const kWords[] = {"the",
                                         "of",
                                         "and",
                                         "a",
                                         "to",
                                         "in",
                                         "is",
                                         "you",
                                         "that",
                                         "it",
                                         "he",
                                         "was",
                                         "for",
                                         "on",
                                         "are",
                                         "as",
                                         "with",
                                         "his",
                                         "they",
                                         "I",
                                         "at",
                                         "be",
                                         "this",
                                         "have",
                                         "from",
                                         "or",
                                         "one",
                                         "had",
                                         "by",
                                         "word",
                                         "but",
                                         "not",
                                         "what",
                                         "all",
                                         "were",
                                         "we",
                                         "when",
                                         "your",
                                         "can",
                                         "said",
                                         "there",
                                         "use",
                                         "an",
                                         "each",
                                         "which",
                                         "she",
                                         "do",
                                         "how",
                                         "their",
                                         "if",
                                         "will",
                                         "up",
                                         "other",
                                         "about",
                                         "out",
                                         "many",
                                         "then",
                                         "them",
                                         "these",
                                         "so",
                                         "some",
                                         "her",
                                         "would",
                                         "make",
                                         "like",
                                         "him",
                                         "into",
                                         "time",
                                         "has",
                                         "look",
                                         "two",
                                         "more",
                                         "write",
                                         "go",
                                         "see",
                                         "number",
                                         "no",
                                         "way",
                                         "could",
                                         "people",
                                         "my",
                                         "than",
                                         "first",
                                         "water",
                                         "been",
                                         "call",
                                         "who",
                                         "oil",
                                         "its",
                                         "now",
                                         "find",
                                         "long",
                                         "down",
                                         "day",
                                         "did",
                                         "get",
                                         "come",
                                         "made",
                                         "may",
                                         "part",
                                         "reinforcement",
                                         "learning",
                                         "policy",
                                         "gradient",
                                         "tokenizer",
                                         "asynchronous",
                                         "actor",
                                         "reward",
                                         "Hello",
                                         "World",
                                         "Troupe",
                                         "GRPO",
                                         "naïve",
                                         "café",
                                         "résumé",
                                         "Zürich",
                                         "coöperate",
                                         "façade",
                                         "HTTPServer",
                                         "iPhone",
                                         "don't",
                                         "it's",
                                         "we're",
                                         "they've",
                                         "I'm",
                                         "you'll",
                                         "he'd",
                                         "IT'S",
                                         "WE'LL",
                                         "O'Neil"};
    static const char* const kPunct[] = {".",  ",", "!", "?", ";",  ":",    " -", " —", "...",
                                         "\"", "'", "(", ")", " (", "...)", "’s", "“",  "”"};
    std::string s;
    for (int w = 0; w < words; ++w) {
      if (w > 0) s += Chance(0.05) ? "  " : " ";
      std::string word = kWords[Int(0, static_cast<int>(std::size(kWords)) - 1)];
      if (Chance(0.1))
        word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      if (Chance(0.03))
        for (auto& c : word) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      s += word;
      if (Chance(0.15)) s += kPunct[Int(0, static_cast<int>(std::size(kPunct)) - 1)];
      if (Chance(0.03)) s += Chance(0.5) ? "\n" : "\n\n";
    }
    return s;
  }

  std::string Code(int lines) {
    static const char* const kLines[] = {"def f(x, y=2):",
                                         "return x ** 2 + y",
                                         "for i in range(10):",
                                         "if (a != b && c >= 0) {",
                                         "}",
                                         "int main(int argc, char** argv) {",
                                         "printf(\"%d\\n\", argc);",
                                         "x += 1;  // count",
                                         "#include <vector>",
                                         "const auto& [k, v] : map",
                                         "{\"key\": [1, 2.5e-3, null, true]}",
                                         "SELECT * FROM t WHERE id = 42;",
                                         "<div class=\"a\">&nbsp;</div>",
                                         "let s = `${a}${b}`;",
                                         "fn main() -> Result<(), Box<dyn Error>> {",
                                         "x=[i*i for i in xs if i%2==0]",
                                         "    raise ValueError(f\"bad {x!r}\")",
                                         "a<<=3; b>>>=1; c ||= d ?? e;",
                                         "@dataclass",
                                         "class Foo(Bar):",
                                         "\"\"\"Docstring.\"\"\"",
                                         "else:",
                                         "try { throw new Error('x'); }"};
    static const char* const kIndent[] = {"", "  ", "    ", "\t", "\t\t", "        ", "   "};
    static const char* const kEol[] = {"\n", "\n", "\n", "\r\n", "\n\n", " \n", "\t\n"};
    std::string s;
    for (int l = 0; l < lines; ++l) {
      s += kIndent[Int(0, 6)];
      s += kLines[Int(0, static_cast<int>(std::size(kLines)) - 1)];
      if (l + 1 < lines || Chance(0.5)) s += kEol[Int(0, 6)];
    }
    return s;
  }

  std::string Cjk(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      switch (Int(0, 9)) {
        case 0:
        case 1:
        case 2:
          Append(Int(0x4E00, 0x9FFF), &s);
          break;
        case 3:
          Append(Int(0x3041, 0x3096), &s);
          break;
        case 4:
          Append(Int(0x30A1, 0x30FA), &s);
          break;
        case 5:
          Append(Int(0xAC00, 0xD7A3), &s);
          break;
        case 6:
          Append(Pick({0x3001, 0x3002, 0x300C, 0x300D, 0xFF0C, 0xFF01, 0xFF1F, 0x30FC}), &s);
          break;
        case 7:
          Append(Int(0xFF01, 0xFF5E), &s);
          break;
        case 8:
          s += Chance(0.5) ? " " : "Tokyo";
          break;
        default:
          Append(Int(0x3400, 0x4DBF), &s);
          break;
      }
    }
    return s;
  }

  std::string Emoji(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      switch (Int(0, 7)) {
        case 0:
          Append(Int(0x1F600, 0x1F64F), &s);
          break;
        case 1:
          Append(Int(0x1F300, 0x1F5FF), &s);
          break;
        case 2:
          Append(Int(0x1F680, 0x1F6C5), &s);
          break;
        case 3:  // family: ZWJ sequence
          Append(0x1F468, &s), Append(0x200D, &s), Append(0x1F469, &s), Append(0x200D, &s),
              Append(0x1F467, &s);
          break;
        case 4:
          Append(Pick({0x1F44D, 0x1F44B, 0x270B}), &s), Append(Int(0x1F3FB, 0x1F3FF), &s);
          break;
        case 5:
          Append(Int(0x1F1E6, 0x1F1FF), &s), Append(Int(0x1F1E6, 0x1F1FF), &s);
          break;  // flag
        case 6:
          Append(Pick({0x2764, 0x2600, 0x2614, 0x26A1}), &s), Append(0xFE0F, &s);
          break;
        default:
          s += Chance(0.5) ? " " : " ok";
          break;
      }
    }
    return s;
  }

  std::string Numbers(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      if (i > 0) s += Chance(0.7) ? " " : "";
      switch (Int(0, 8)) {
        case 0:
          s += Digits(Int(1, 25));
          break;
        case 1:
          s += Digits(Int(1, 6)) + "." + Digits(Int(1, 6));
          break;
        case 2:
          s += Digits(Int(1, 3)) + "," + Digits(3) + "," + Digits(3);
          break;
        case 3:
          s += "-" + Digits(Int(1, 4)) + "e" + (Chance(0.5) ? "-" : "+") + Digits(2);
          break;
        case 4:
          for (int k = Int(1, 6); k > 0; --k) Append(Int(0x0660, 0x0669), &s);
          break;
        case 5:
          for (int k = Int(1, 6); k > 0; --k) Append(Int(0x0966, 0x096F), &s);
          break;
        case 6:
          for (int k = Int(1, 6); k > 0; --k) Append(Int(0xFF10, 0xFF19), &s);
          break;
        case 7:
          Append(Pick({0x00B2, 0x00B3, 0x00B9, 0x00BD, 0x2153, 0x216B, 0x2460, 0x2070}), &s);
          break;
        default:
          s += "$" + Digits(Int(1, 5)) + "%";
          break;
      }
    }
    return s;
  }

  std::string Whitespace(int n) {
    static const char32_t kSpaces[] = {' ',    '\t',   '\n',   '\r',   0x0B,   0x0C,
                                       0x00A0, 0x1680, 0x2000, 0x2003, 0x2009, 0x200A,
                                       0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0x0085,
                                       0xFEFF, 0x200B, 0x180E, 0x001C, 0x001F};
    std::string s;
    for (int i = 0; i < n; ++i) {
      int run = Chance(0.05) ? Int(10, 80) : Int(1, 4);
      bool same = Chance(0.5);
      char32_t c = kSpaces[Int(0, static_cast<int>(std::size(kSpaces)) - 1)];
      for (int k = 0; k < run; ++k) {
        Append(same ? c : kSpaces[Int(0, static_cast<int>(std::size(kSpaces)) - 1)], &s);
        if (Chance(0.1)) s += "\r\n";
      }
      if (Chance(0.7)) s += Prose(Int(1, 3));
    }
    return s;
  }

  std::string Special(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      int kind = Int(0, 5);
      if (specials_.empty() || kind == 5) {
        s += Prose(Int(1, 4));
        continue;
      }
      std::string t =
          specials_[static_cast<size_t>(Int(0, static_cast<int>(specials_.size()) - 1))];
      if (kind == 3 && t.size() > 2)
        t = t.substr(0, static_cast<size_t>(Int(1, static_cast<int>(t.size()) - 1)));
      if (kind == 4)
        for (auto& c : t) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (Chance(0.3)) s += Chance(0.5) ? " " : "\n";
      s += t;
      if (Chance(0.3)) s += Chance(0.5) ? " " : "  ";
      if (Chance(0.5)) s += Prose(Int(1, 3));
    }
    return s;
  }

  std::string Invalid(int n) {
    static const char* const kBad[] = {"\x80",         "\xBF",
                                       "\xC0\xAF",     "\xC1\xBF",
                                       "\xE0\x80\xAF", "\xED\xA0\x80",
                                       "\xED\xBF\xBF", "\xF4\x90\x80\x80",
                                       "\xF5\x80",     "\xFE",
                                       "\xFF",         "\xE6\x97",
                                       "\xF0\x9F\x98", "\xC3",
                                       "\xE2\x82",     "\x80\x80\x80",
                                       "\xEF\xBB\xBF", "\xF8\x88\x80\x80\x80"};
    std::string s;
    for (int i = 0; i < n; ++i) {
      if (Chance(0.5))
        s += kBad[Int(0, static_cast<int>(std::size(kBad)) - 1)];
      else if (Chance(0.3))
        for (int k = Int(1, 6); k > 0; --k) s.push_back(static_cast<char>(Int(0x80, 0xFF)));
      else if (Chance(0.3))
        for (int k = Int(1, 6); k > 0; --k) s.push_back(static_cast<char>(Int(0, 255)));
      else
        s += Chance(0.5) ? Prose(Int(1, 3)) : Cjk(Int(1, 3));
    }
    return s;
  }

  std::string Unicode(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
      switch (Int(0, 7)) {
        case 0:
          Append(AnyAssigned(0x20, 0xFFFF), &s);
          break;
        case 1:
          Append(AnyAssigned(0x10000, 0x10FFFF), &s);
          break;
        case 2:  // base + combining marks: NFC composes some
          Append(Pick({'e', 'a', 'o', 'n', 'A', 'u', 0x3B1, 0x438}), &s);
          for (int k = Int(1, 3); k > 0; --k) Append(Int(0x0300, 0x036F), &s);
          break;
        case 3:  // conjoining Hangul jamo (NFC makes syllables)
          Append(Int(0x1100, 0x1112), &s), Append(Int(0x1161, 0x1175), &s);
          if (Chance(0.5)) Append(Int(0x11A8, 0x11C2), &s);
          break;
        case 4:  // compatibility characters (NFKC changes them)
          Append(Pick({0xFB01, 0xFB02, 0x2460, 0xFF21, 0x3300, 0x2126, 0x212B, 0x1E9B, 0x00BD,
                       0x2162, 0x33A1, 0xFE64, 0x2024, 0x00A8}),
                 &s);
          break;
        case 5:  // case-mapping oddities
          Append(Pick({0x130, 0x131, 0x17F, 0x212A, 0x3A3, 0x3C2, 0xDF, 0x1E9E, 0x149}), &s);
          break;
        case 6:
          Append(AnyAssigned(0x0370, 0x2FFF), &s);
          break;
        default:
          s += Chance(0.5) ? " " : Prose(1);
          break;
      }
    }
    return s;
  }

  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

 private:
  static void Append(int c, std::string* s) { Append(static_cast<char32_t>(c), s); }
  static void Append(char32_t c, std::string* s) {
    if (c < 0x80) {
      s->push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (c >> 6)));
      s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (c >> 12)));
      s->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (c >> 18)));
      s->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  // Assigned in Unicode <= 14.0 (and not a surrogate).
  static bool Assigned14(char32_t c) {
    if (c >= 0xD800 && c <= 0xDFFF) return false;
    UVersionInfo age;
    u_charAge(static_cast<UChar32>(c), age);
    return age[0] != 0 && (age[0] < 14 || (age[0] == 14 && age[1] == 0));
  }
  char32_t AnyAssigned(int lo, int hi) {
    for (;;) {
      auto c = static_cast<char32_t>(Int(lo, hi));
      if (Assigned14(c)) return c;
    }
  }
  int Pick(std::initializer_list<int> xs) {
    return *(xs.begin() + Int(0, static_cast<int>(xs.size()) - 1));
  }
  std::string Digits(int n) {
    std::string d;
    for (int k = 0; k < n; ++k) d.push_back(static_cast<char>('0' + Int(0, 9)));
    return d;
  }

  std::mt19937_64 rng_;
  std::vector<std::string> specials_;
};

}  // namespace troupe::testing
