// The pipeline stages of the HF tokenizer (private to engine/): normalizers,
// pre-tokenizers, decoders and the post-processor of tokenizer.json, each with the
// semantics tokenizers.js (the reference) gives it.
//
//   text ─▶ Normalizer ─▶ PreTokenizer ─▶ (BpeModel) ─▶ PostProcessor ─▶ ids
//   ids ─▶ token strings ─▶ Decoder ─▶ text
//
// Make* read one JSON component; an unsupported type or option is an error naming it
// and where it sits (e.g. "tokenizer.json pre_tokenizer.pretokenizers[0]"). Every stage
// is immutable after construction and thread-safe.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <absl/container/flat_hash_set.h>
#include <nlohmann/json.hpp>

#include "hf/regex.h"
#include "troupe/core/status.h"

namespace troupe::engine::hf {

// Strings with stable addresses, reused across calls (per-thread scratch).
class StringPool {
 public:
  std::string* Make() {
    if (used_ == items_.size()) items_.emplace_back();
    std::string* s = &items_[used_++];
    s->clear();
    return s;
  }
  // Reuses the strings; gives back the memory of any over 1 MiB (a long text once).
  void Reset() {
    for (size_t i = 0; i < used_; ++i)
      if (items_[i].capacity() > (size_t{1} << 20)) std::string().swap(items_[i]);
    used_ = 0;
  }

 private:
  std::deque<std::string> items_;
  size_t used_ = 0;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Appends the normalized `in` to `out` (in is well-formed UTF-8, and so is out).
  virtual Status Apply(std::string_view in, std::string* out) const = 0;
};
// null JSON -> nullptr (no normalizer).
Result<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j,
                                                   const std::string& where);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits/rewrites every piece of *pieces in place (order kept). New text lives in
  // `pool`; `section_index` is the index of the added-token section being encoded.
  virtual Status Apply(std::vector<std::string_view>* pieces,
                       std::vector<std::string_view>* scratch, StringPool* pool,
                       size_t section_index) const = 0;
};
// null JSON -> nullptr. *byte_level is set when the pipeline ends in ByteLevel (its
// pieces are then raw bytes for a byte-level BpeModel).
Result<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j,
                                                       const std::string& where, bool* byte_level);

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings (tokenizers.js's decode_chain).
  virtual void Apply(std::vector<std::string>* tokens) const = 0;
};
// `added`: contents of all added tokens (the ByteLevel decoder passes them through).
Result<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j, const std::string& where,
                                             const absl::flat_hash_set<std::string>& added);

// TemplateProcessing (single-sequence form), possibly several in a Sequence.
struct PostProcessor {
  struct Item {
    bool is_sequence;     // the encoded text ("Sequence A"); else a special token
    std::string special;  // the special token's text
  };
  std::vector<std::vector<Item>> templates;  // applied in order
};
// null JSON -> empty templates (nothing added).
Result<PostProcessor> MakePostProcessor(const nlohmann::json& j, const std::string& where);

// Appends `in` with every match of a "pattern" ({"String": ...} or {"Regex": ...})
// replaced by "content", as JavaScript's replaceAll does (Replace normalizer,
// pre-tokenizer and decoder).
class Replacer {
 public:
  static Result<std::unique_ptr<Replacer>> Make(const nlohmann::json& j, const std::string& where);
  Status Apply(std::string_view in, std::string* out) const;

 private:
  Replacer() = default;
  std::string literal_;           // a String pattern
  std::unique_ptr<Regex> regex_;  // a Regex pattern
  std::string content_;
};

}  // namespace troupe::engine::hf
