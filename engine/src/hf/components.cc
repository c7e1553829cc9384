#include "hf/components.h"

#include <optional>

#include <unicode/uchar.h>

#include "hf/bpe.h"
#include "hf/json_fields.h"
#include "hf/unicode.h"

namespace troupe::engine::hf {
namespace {

std::string At(const std::string& where, const char* key, size_t i) {
  return fmt::format("{}.{}[{}]", where, key, i);
}

// ---- normalizers ----------------------------------------------------------------

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  Status Apply(std::string_view in, std::string* out) const override {
    return AppendNormalized(form_, in, out);
  }

 private:
  NormalForm form_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Apply(std::string_view in, std::string* out) const override {
    *out += prefix_;
    out->append(in);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  explicit ReplaceNormalizer(std::unique_ptr<Replacer> r) : replacer_(std::move(r)) {}
  Status Apply(std::string_view in, std::string* out) const override {
    return replacer_->Apply(in, out);
  }

 private:
  std::unique_ptr<Replacer> replacer_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status Apply(std::string_view in, std::string* out) const override {
    return AppendLowercase(in, out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Apply(std::string_view in, std::string* out) const override {
    if (left_) in = TrimJsStart(in);
    if (right_) in = TrimJsEnd(in);
    out->append(in);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

// Removes every \p{M} code point (JavaScript's text.replace(/\p{M}/gu, "")).
class StripAccentsNormalizer final : public Normalizer {
 public:
  Status Apply(std::string_view in, std::string* out) const override {
    for (size_t i = 0; i < in.size();) {
      size_t start = i;
      auto type = u_charType(static_cast<UChar32>(NextCodePoint(in, &i)));
      if (type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
          type == U_COMBINING_SPACING_MARK)
        continue;
      out->append(in.substr(start, i - start));
    }
    return Status::Ok();
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  Status Apply(std::string_view in, std::string* out) const override {
    thread_local std::string a, b;
    std::string_view cur = in;
    std::string* buf = &a;
    for (size_t k = 0; k < parts_.size(); ++k) {
      std::string* dst = k + 1 == parts_.size() ? out : buf;
      if (dst != out) dst->clear();
      TROUPE_RETURN_IF_ERROR(parts_[k]->Apply(cur, dst));
      if (dst != out) {
        cur = *dst;
        buf = buf == &a ? &b : &a;
      }
    }
    if (parts_.empty()) out->append(in);
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- pre-tokenizers -------------------------------------------------------------

// The reference's built-in GPT-2 split, a plain JavaScript regex (JS \s).
std::string Gpt2Pattern() {
  const std::string s = kJsWhitespaceClass;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + s + "\\p{L}\\p{N}]+|[" + s +
         "]+(?![^" + s + "])|[" + s + "]+";
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>* scratch,
               StringPool* pool, size_t) const override {
    if (add_prefix_space_) {
      for (auto& p : *pieces) {
        if (!p.empty() && p[0] == ' ') continue;
        std::string* s = pool->Make();
        s->push_back(' ');
        s->append(p);
        p = *s;
      }
    }
    if (!split_) return Status::Ok();  // bytes go to the model as they are
    scratch->clear();
    for (std::string_view p : *pieces) {
      TROUPE_RETURN_IF_ERROR(split_->ForEach(p, [&](size_t b, size_t e) {
        if (e > b) scratch->push_back(p.substr(b, e - b));
      }));
    }
    pieces->swap(*scratch);
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> split_;  // null: use_regex false
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, bool removed)
      : re_(std::move(re)), removed_(removed) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>* scratch,
               StringPool*, size_t) const override {
    scratch->clear();
    for (std::string_view p : *pieces) {
      size_t prev = 0;
      TROUPE_RETURN_IF_ERROR(re_->ForEach(p, [&](size_t b, size_t e) {
        if (prev < b) scratch->push_back(p.substr(prev, b - prev));
        if (e > b && !removed_) scratch->push_back(p.substr(b, e - b));
        prev = e;
      }));
      if (prev < p.size()) scratch->push_back(p.substr(prev));
    }
    pieces->swap(*scratch);
    return Status::Ok();
  }

 private:
  std::unique_ptr<Regex> re_;
  bool removed_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>*,
               StringPool* pool, size_t section_index) const override {
    for (auto& p : *pieces) {
      std::string* s = pool->Make();
      bool add =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && section_index == 0);
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == ' ')
          *s += replacement_;
        else
          s->push_back(p[i]);
      }
      if (add && std::string_view(*s).substr(0, replacement_.size()) != replacement_)
        s->insert(0, replacement_);
      p = *s;
    }
    return Status::Ok();
  }

 private:
  std::string replacement_;
  Prepend prepend_;
};

// Runs of ASCII digits and of everything else (JavaScript's /[^\d]+|\d+/ without u).
class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>* scratch,
               StringPool*, size_t) const override {
    scratch->clear();
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    for (std::string_view p : *pieces) {
      size_t i = 0;
      while (i < p.size()) {
        size_t j = i + 1;
        if (digit(p[i])) {
          while (!individual_ && j < p.size() && digit(p[j])) ++j;
        } else {
          while (j < p.size() && !digit(p[j])) ++j;
        }
        scratch->push_back(p.substr(i, j - i));
        i = j;
      }
    }
    pieces->swap(*scratch);
    return Status::Ok();
  }

 private:
  bool individual_;
};

class ReplacePreTokenizer final : public PreTokenizer {
 public:
  explicit ReplacePreTokenizer(std::unique_ptr<Replacer> r) : replacer_(std::move(r)) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>*,
               StringPool* pool, size_t) const override {
    for (auto& p : *pieces) {
      std::string* s = pool->Make();
      TROUPE_RETURN_IF_ERROR(replacer_->Apply(p, s));
      p = *s;
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<Replacer> replacer_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  Status Apply(std::vector<std::string_view>* pieces, std::vector<std::string_view>* scratch,
               StringPool* pool, size_t section_index) const override {
    for (const auto& p : parts_)
      TROUPE_RETURN_IF_ERROR(p->Apply(pieces, scratch, pool, section_index));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Result<std::unique_ptr<Regex>> SplitRegex(const nlohmann::json& pattern, const std::string& where) {
  if (!pattern.is_object() || pattern.size() != 1)
    return InvalidArgument("{}: 'pattern' must be {{\"String\": ...}} or {{\"Regex\": ...}}",
                           where);
  std::string source;
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
    TROUPE_ASSIGN_OR_RETURN(source, TranslatePattern(pattern["Regex"].get<std::string>()));
  } else if (pattern.contains("String") && pattern["String"].is_string()) {
    if (pattern["String"].get<std::string>().empty())
      return InvalidArgument("{}: an empty String pattern is not supported", where);
    source = QuoteLiteral(pattern["String"].get<std::string>());
  } else {
    return InvalidArgument("{}: 'pattern' must be {{\"String\": ...}} or {{\"Regex\": ...}}",
                           where);
  }
  return Regex::Compile(source, where);
}

Result<std::unique_ptr<PreTokenizer>> MakeSplit(const nlohmann::json& j, const std::string& where) {
  TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "pattern", "behavior", "invert"}));
  TROUPE_ASSIGN_OR_RETURN(bool invert, BoolField(j, "invert", where));
  if (invert) return InvalidArgument("{}: Split with invert=true is not supported", where);
  TROUPE_ASSIGN_OR_RETURN(std::string behavior, StringField(j, "behavior", where));
  if (behavior != "Isolated" && behavior != "Removed")
    return InvalidArgument("{}: Split behavior '{}' is not supported (Isolated and Removed are)",
                           where, behavior);
  if (!j.contains("pattern")) return InvalidArgument("{}: Split has no 'pattern'", where);
  TROUPE_ASSIGN_OR_RETURN(auto re, SplitRegex(j["pattern"], where));
  // The reference removes with String.prototype.split, which keeps capture groups and
  // treats empty matches its own way: refuse what would make them differ.
  if (behavior == "Removed" && (re->capture_count() > 0 || re->can_match_empty()))
    return InvalidArgument(
        "{}: Split Removed with a pattern that has groups or can match empty "
        "is not supported",
        where);
  return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), behavior == "Removed"));
}

Result<std::unique_ptr<PreTokenizer>> MakeMetaspace(const nlohmann::json& j,
                                                    const std::string& where) {
  TROUPE_RETURN_IF_ERROR(CheckKeys(
      j, where, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
  TROUPE_ASSIGN_OR_RETURN(std::string replacement,
                          StringField(j, "replacement", where, "\xE2\x96\x81"));
  TROUPE_ASSIGN_OR_RETURN(std::string str_rep, StringField(j, "str_rep", where, replacement));
  if (replacement.empty() || str_rep != replacement)
    return InvalidArgument("{}: Metaspace replacement '{}' (str_rep '{}') is not supported", where,
                           replacement, str_rep);
  auto split = j.find("split");
  if (split == j.end() || !split->is_boolean() || split->get<bool>())
    return InvalidArgument(
        "{}: Metaspace without split=false is not supported (Hugging Face then splits on '{}', "
        "tokenizers.js does not)",
        where, replacement);
  std::string scheme;
  if (j.contains("prepend_scheme")) {
    TROUPE_ASSIGN_OR_RETURN(scheme, StringField(j, "prepend_scheme", where));
  } else {
    TROUPE_ASSIGN_OR_RETURN(bool add, BoolField(j, "add_prefix_space", where, true));
    if (!add)
      return InvalidArgument(
          "{}: Metaspace add_prefix_space=false without prepend_scheme is not "
          "supported (Hugging Face and tokenizers.js disagree on it)",
          where);
    scheme = "always";
  }
  MetaspacePreTokenizer::Prepend p;
  if (scheme == "always")
    p = MetaspacePreTokenizer::Prepend::kAlways;
  else if (scheme == "first")
    p = MetaspacePreTokenizer::Prepend::kFirst;
  else if (scheme == "never")
    p = MetaspacePreTokenizer::Prepend::kNever;
  else
    return InvalidArgument("{}: Metaspace prepend_scheme '{}' is not supported", where, scheme);
  return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(replacement, p));
}

Result<std::unique_ptr<PreTokenizer>> MakeOne(const nlohmann::json& j, const std::string& where,
                                              bool last, bool* byte_level) {
  TROUPE_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "ByteLevel") {
    TROUPE_RETURN_IF_ERROR(
        CheckKeys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    if (!last) return InvalidArgument("{}: a ByteLevel pre-tokenizer must come last", where);
    TROUPE_ASSIGN_OR_RETURN(bool prefix, BoolField(j, "add_prefix_space", where, false));
    TROUPE_ASSIGN_OR_RETURN(bool use_regex, BoolField(j, "use_regex", where, true));
    std::unique_ptr<Regex> split;
    if (use_regex) {
      TROUPE_ASSIGN_OR_RETURN(split, Regex::Compile(Gpt2Pattern(), where));
    }
    *byte_level = true;
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(prefix, std::move(split)));
  }
  if (type == "Split") return MakeSplit(j, where);
  if (type == "Metaspace") return MakeMetaspace(j, where);
  if (type == "Digits") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "individual_digits"}));
    TROUPE_ASSIGN_OR_RETURN(bool individual, BoolField(j, "individual_digits", where));
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(individual));
  }
  if (type == "Replace") {
    TROUPE_ASSIGN_OR_RETURN(auto r, Replacer::Make(j, where));
    return std::unique_ptr<PreTokenizer>(new ReplacePreTokenizer(std::move(r)));
  }
  if (type == "Sequence") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "pretokenizers"}));
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return InvalidArgument("{}: Sequence needs a 'pretokenizers' array", where);
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = j["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto p, MakeOne(list[i], At(where, "pretokenizers", i),
                                              last && i + 1 == list.size(), byte_level));
      parts.push_back(std::move(p));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  return InvalidArgument("{}: pre-tokenizer type '{}' is not supported", where, type);
}

// ---- decoders -------------------------------------------------------------------

class ByteLevelDecoder final : public Decoder {
 public:
  explicit ByteLevelDecoder(const absl::flat_hash_set<std::string>& added) : added_(added) {}
  void Apply(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      std::string text;
      AppendValidUtf8(bytes, &text);
      out.push_back(std::move(text));
      bytes.clear();
    };
    bool pending = false;
    for (const std::string& t : *tokens) {
      if (added_.contains(t)) {
        if (pending) flush();
        pending = false;
        out.push_back(t);
        continue;
      }
      pending = true;
      for (size_t i = 0; i < t.size();) {
        int b = ByteOfChar(NextCodePoint(t, &i));
        bytes.push_back(static_cast<char>(b < 0 ? 0 : b));  // the reference maps unknowns to 0
      }
    }
    if (pending) {
      if (bytes.empty())
        out.emplace_back();
      else
        flush();
    }
    tokens->swap(out);
  }

 private:
  absl::flat_hash_set<std::string> added_;
};

class ReplaceDecoder final : public Decoder {
 public:
  explicit ReplaceDecoder(std::unique_ptr<Replacer> r) : replacer_(std::move(r)) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::string s;
      if (replacer_->Apply(t, &s).ok()) t.swap(s);
    }
  }

 private:
  std::unique_ptr<Replacer> replacer_;
};

// parseInt(text, 16) as JavaScript computes it (leading whitespace, a sign, then hex
// digits as far as they go); nullopt for NaN.
std::optional<int> ParseIntHex(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t next = i;
    if (!IsJsWhitespace(NextCodePoint(text, &next))) break;
    i = next;
  }
  int sign = 1;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) sign = text[i++] == '-' ? -1 : 1;
  std::optional<int> value;
  for (; i < text.size(); ++i) {
    char c = text[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) break;
    value = value.value_or(0) * 16 + d;
  }
  if (value) *value *= sign;
  return value;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      std::string text;
      AppendValidUtf8(bytes, &text);
      // TextDecoder() (ignoreBOM false) drops a leading byte order mark.
      if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
      out.push_back(std::move(text));
      bytes.clear();
    };
    for (std::string& t : *tokens) {
      // "<0x" + two UTF-16 units + ">" (the reference tests token.length === 6).
      std::optional<int> byte;
      if (t.size() >= 6 && t.compare(0, 3, "<0x") == 0 && t.back() == '>' && Utf16Length(t) == 6)
        byte = ParseIntHex(std::string_view(t).substr(3, t.size() - 4));
      if (byte) {
        bytes.push_back(static_cast<char>(static_cast<uint8_t>(*byte)));  // Uint8Array wraps
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens->swap(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, int64_t start, int64_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      size_t cut = 0;
      for (int64_t k = 0; k < start_ && cut < t.size(); ++k) {
        size_t next = cut;
        if (NextCodePoint(t, &next) != content_) break;
        cut = next;
      }
      size_t end = t.size();
      for (int64_t k = 0; k < stop_ && end > cut; ++k) {
        size_t start = end - 1;
        while (start > 0 && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) --start;
        size_t probe = start;
        if (NextCodePoint(t, &probe) != content_) break;
        end = start;
      }
      t = t.substr(cut, end - cut);
    }
  }

 private:
  char32_t content_;
  int64_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  explicit MetaspaceDecoder(std::string replacement) : replacement_(std::move(replacement)) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string s;
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          s.push_back(' ');
          p += replacement_.size();
        } else {
          s.push_back(t[p++]);
        }
      }
      if (i == 0 && !s.empty() && s[0] == ' ') s.erase(0, 1);
      t.swap(s);
    }
  }

 private:
  std::string replacement_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->Apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

// ---- factories ------------------------------------------------------------------

Result<std::unique_ptr<Replacer>> Replacer::Make(const nlohmann::json& j,
                                                 const std::string& where) {
  TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "pattern", "content"}));
  std::unique_ptr<Replacer> r(new Replacer());
  TROUPE_ASSIGN_OR_RETURN(r->content_, StringField(j, "content", where));
  if (r->content_.find('$') != std::string::npos)
    return InvalidArgument("{}: Replace content '{}' with '$' is not supported", where,
                           r->content_);
  auto pattern = j.find("pattern");
  if (pattern == j.end()) return InvalidArgument("{}: Replace has no 'pattern'", where);
  if (pattern->is_object() && pattern->size() == 1 && pattern->contains("String") &&
      (*pattern)["String"].is_string()) {
    r->literal_ = (*pattern)["String"].get<std::string>();
    if (r->literal_.empty())
      return InvalidArgument("{}: an empty String pattern is not supported", where);
    return r;
  }
  TROUPE_ASSIGN_OR_RETURN(r->regex_, SplitRegex(*pattern, where));
  return r;
}

Status Replacer::Apply(std::string_view in, std::string* out) const {
  if (!regex_) {
    size_t prev = 0;
    for (size_t at = in.find(literal_); at != std::string_view::npos;
         at = in.find(literal_, prev)) {
      out->append(in.substr(prev, at - prev));
      *out += content_;
      prev = at + literal_.size();
    }
    out->append(in.substr(prev));
    return Status::Ok();
  }
  size_t prev = 0;
  TROUPE_RETURN_IF_ERROR(regex_->ForEach(in, [&](size_t b, size_t e) {
    out->append(in.substr(prev, b - prev));
    *out += content_;
    prev = e;
  }));
  out->append(in.substr(prev));
  return Status::Ok();
}

Result<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j,
                                                   const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  TROUPE_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  std::unique_ptr<Normalizer> n;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type"}));
    NormalForm form = type == "NFC"    ? NormalForm::kNFC
                      : type == "NFD"  ? NormalForm::kNFD
                      : type == "NFKC" ? NormalForm::kNFKC
                                       : NormalForm::kNFKD;
    n = std::make_unique<UnicodeNormalizer>(form);
  } else if (type == "Prepend") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "prepend"}));
    TROUPE_ASSIGN_OR_RETURN(std::string prefix, StringField(j, "prepend", where));
    n = std::make_unique<PrependNormalizer>(prefix);
  } else if (type == "Replace") {
    TROUPE_ASSIGN_OR_RETURN(auto r, Replacer::Make(j, where));
    n = std::make_unique<ReplaceNormalizer>(std::move(r));
  } else if (type == "Lowercase") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type"}));
    n = std::make_unique<LowercaseNormalizer>();
  } else if (type == "StripAccents") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type"}));
    n = std::make_unique<StripAccentsNormalizer>();
  } else if (type == "Strip") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "strip_left", "strip_right"}));
    TROUPE_ASSIGN_OR_RETURN(bool left, BoolField(j, "strip_left", where));
    TROUPE_ASSIGN_OR_RETURN(bool right, BoolField(j, "strip_right", where));
    n = std::make_unique<StripNormalizer>(left, right);
  } else if (type == "Sequence") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "normalizers"}));
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return InvalidArgument("{}: Sequence needs a 'normalizers' array", where);
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto p,
                              MakeNormalizer(j["normalizers"][i], At(where, "normalizers", i)));
      if (p) parts.push_back(std::move(p));
    }
    n = std::make_unique<SequenceNormalizer>(std::move(parts));
  } else {
    return InvalidArgument("{}: normalizer type '{}' is not supported", where, type);
  }
  return n;
}

Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j,
                                                       const std::string& where, bool* byte_level) {
  *byte_level = false;
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  return MakeOne(j, where, /*last=*/true, byte_level);
}

Result<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j, const std::string& where,
                                             const absl::flat_hash_set<std::string>& added) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  TROUPE_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "ByteLevel") {
    TROUPE_RETURN_IF_ERROR(
        CheckKeys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    return std::unique_ptr<Decoder>(new ByteLevelDecoder(added));
  }
  if (type == "Replace") {
    TROUPE_ASSIGN_OR_RETURN(auto r, Replacer::Make(j, where));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(r)));
  }
  if (type == "ByteFallback") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type"}));
    return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  }
  if (type == "Fuse") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type"}));
    return std::unique_ptr<Decoder>(new FuseDecoder());
  }
  if (type == "Strip") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "content", "start", "stop"}));
    TROUPE_ASSIGN_OR_RETURN(std::string content, StringField(j, "content", where));
    size_t i = 0;
    char32_t c = content.empty() ? 0 : NextCodePoint(content, &i);
    if (content.empty() || i != content.size() || c > 0xFFFF)
      return InvalidArgument("{}: Strip content '{}' must be one BMP character", where, content);
    TROUPE_ASSIGN_OR_RETURN(int64_t start, IntField(j, "start", where));
    TROUPE_ASSIGN_OR_RETURN(int64_t stop, IntField(j, "stop", where));
    return std::unique_ptr<Decoder>(new StripDecoder(c, start, stop));
  }
  if (type == "Metaspace") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(
        j, where,
        {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
    TROUPE_ASSIGN_OR_RETURN(std::string replacement,
                            StringField(j, "replacement", where, "\xE2\x96\x81"));
    if (replacement.empty()) return InvalidArgument("{}: empty Metaspace replacement", where);
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(replacement));
  }
  if (type == "Sequence") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "decoders"}));
    if (!j.contains("decoders") || !j["decoders"].is_array())
      return InvalidArgument("{}: Sequence needs a 'decoders' array", where);
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < j["decoders"].size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(auto p,
                              MakeDecoder(j["decoders"][i], At(where, "decoders", i), added));
      if (!p) return InvalidArgument("{}: null decoder", At(where, "decoders", i));
      parts.push_back(std::move(p));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  return InvalidArgument("{}: decoder type '{}' is not supported", where, type);
}

Result<PostProcessor> MakePostProcessor(const nlohmann::json& j, const std::string& where) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  TROUPE_ASSIGN_OR_RETURN(std::string type, TypeOf(j, where));
  if (type == "ByteLevel") {
    TROUPE_RETURN_IF_ERROR(
        CheckKeys(j, where, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    return pp;
  }
  if (type == "Sequence") {
    TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "processors"}));
    if (!j.contains("processors") || !j["processors"].is_array())
      return InvalidArgument("{}: Sequence needs a 'processors' array", where);
    for (size_t i = 0; i < j["processors"].size(); ++i) {
      TROUPE_ASSIGN_OR_RETURN(PostProcessor part,
                              MakePostProcessor(j["processors"][i], At(where, "processors", i)));
      for (auto& t : part.templates) pp.templates.push_back(std::move(t));
    }
    return pp;
  }
  if (type != "TemplateProcessing")
    return InvalidArgument("{}: post-processor type '{}' is not supported", where, type);
  TROUPE_RETURN_IF_ERROR(CheckKeys(j, where, {"type", "single", "pair", "special_tokens"}));
  if (!j.contains("single") || !j["single"].is_array())
    return InvalidArgument("{}: TemplateProcessing needs a 'single' array", where);
  std::vector<PostProcessor::Item> items;
  for (size_t i = 0; i < j["single"].size(); ++i) {
    const auto& item = j["single"][i];
    std::string at = At(where, "single", i);
    if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
        item["SpecialToken"]["id"].is_string()) {
      items.push_back({false, item["SpecialToken"]["id"].get<std::string>()});
    } else if (item.contains("Sequence") && item["Sequence"].contains("id") &&
               item["Sequence"]["id"].is_string()) {
      std::string seq = item["Sequence"]["id"].get<std::string>();
      if (seq != "A")
        return InvalidArgument("{}: a single template may only use sequence A, not {}", at, seq);
      items.push_back({true, ""});
    } else {
      return InvalidArgument("{}: {} is neither a SpecialToken nor a Sequence", at, item.dump());
    }
  }
  pp.templates.push_back(std::move(items));
  return pp;
}

}  // namespace troupe::engine::hf
