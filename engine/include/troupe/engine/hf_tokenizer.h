// A Hugging Face tokenizer.json, tokenizing exactly as Hugging Face does (torch-free;
// library troupe::tokenizer).
//
//   text ─▶ valid UTF-8 ─▶ added tokens ─▶ normalizer ─▶ pre-tokenizer ─▶ BPE ─▶ ids
//   ids ─▶ token strings ─▶ decoder ─▶ (clean-up) ─▶ text
//
// Supported: BPE models, byte-level (GPT-2, Llama 3, Qwen2/2.5/3: regex Split, ByteLevel,
// ignore_merges) and SentencePiece-style with byte fallback (Llama 2, Mistral: Prepend /
// Replace normalizers or Metaspace, ByteFallback / Fuse / Strip / Replace decoders);
// added tokens with special / normalized / lstrip / rstrip / single_word; NFC, NFD, NFKC,
// NFKD, Lowercase, Strip, StripAccents normalizers; Sequence of any of them; the
// TemplateProcessing post-processor. tokenizer_config.json (next to tokenizer.json)
// names bos/eos/pad/unk and sets clean_up_tokenization_spaces. Anything else is refused
// at load with an error naming the component and the file, never approximated.
//
// The reference is tokenizers.js (@huggingface/tokenizers, what transformers.js runs):
// ids and decoded text are identical to it (tests/tokenizer/). Regexes run on PCRE2 with
// the meaning tokenizers.js gives Hugging Face's Oniguruma patterns; normalization and
// case mapping are ICU's. Ill-formed UTF-8 input is first made valid the way the
// reference receives it (each maximal ill-formed subpart -> U+FFFD); decoding produces
// valid UTF-8 the same way.
//
// Immutable after Load; every method is const and thread-safe (a sharded word cache
// inside is the only shared mutable state).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/engine/tokenizer.h"

namespace troupe::engine {

namespace hf {
class BpeModel;
class Decoder;
class Normalizer;
class PreTokenizer;
class Splitter;
}  // namespace hf

class HfTokenizer final : public Tokenizer {
 public:
  ~HfTokenizer() override;

  // `path`: a model folder holding tokenizer.json (and usually tokenizer_config.json),
  // or a tokenizer.json file (its folder's tokenizer_config.json is read when present).
  static Result<std::unique_ptr<HfTokenizer>> Load(const std::string& path);
  // From the two files' contents (`config_json` may be empty); `origin` names them in
  // errors, e.g. "models/qwen3/tokenizer.json".
  static Result<std::unique_ptr<HfTokenizer>> FromJson(std::string_view tokenizer_json,
                                                       std::string_view config_json,
                                                       const std::string& origin);

  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos = false,
                                      bool add_eos = false) const override;
  Result<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view text) const override;
  // Ids -> text as Hugging Face decodes them (skip_special drops the special tokens;
  // with it false they appear as their text). Ill-formed byte sequences, e.g. half a
  // UTF-8 character at the end, come out as U+FFFD.
  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special = true) const override;
  // The token's string as the vocabulary spells it ("Ġworld" in byte-level models).
  Result<std::string> IdToPiece(int32_t id) const override;
  int32_t TokenToId(std::string_view piece) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  bool IsSpecial(int32_t id) const override;

  // Encodes `texts` on `threads` threads (0: all cores), in order; the first error wins.
  Result<std::vector<std::vector<int32_t>>> EncodeBatch(const std::vector<std::string>& texts,
                                                        int threads = 0,
                                                        bool add_special_tokens = false) const;

  // Where it was loaded from (the tokenizer.json path, or FromJson's origin).
  const std::string& origin() const { return origin_; }
  // tokenizer_config.json as read (an empty object when there was none): the chat
  // template and the rest of what Hugging Face keeps there.
  const nlohmann::json& config() const { return config_; }
  // True for byte-level BPE (GPT-2 alphabet), false for SentencePiece-style.
  bool byte_level() const;

 private:
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
  };
  struct Scratch;

  HfTokenizer();
  Status Init(const nlohmann::json& tokenizer,
              const std::vector<std::pair<std::string_view, int64_t>>& vocab,
              const std::vector<std::pair<std::string_view, std::string_view>>& merges,
              const std::string& config_json);
  Status InitAddedTokens(const nlohmann::json& list);
  Status InitConfig();
  Status EncodeText(std::string_view text, std::vector<int32_t>* ids) const;
  Status EncodeSection(std::string_view section, size_t section_index, Scratch* s,
                       std::vector<int32_t>* ids) const;
  // An added token spelled exactly `text` (content or normalized content), or null.
  const AddedToken* FindAdded(std::string_view text) const;
  void StripAround(std::vector<std::string_view>* sections) const;
  Result<int32_t> ResolveToken(const std::string& text, const std::string& what) const;

  std::string origin_;
  nlohmann::json config_ = nlohmann::json::object();
  std::unique_ptr<hf::Normalizer> normalizer_;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<hf::BpeModel> model_;
  std::unique_ptr<hf::Decoder> decoder_;
  std::vector<std::vector<int32_t>> templates_;  // post-processor; -1 marks the text
  std::vector<AddedToken> added_;
  std::vector<std::pair<std::string, size_t>> added_by_text_;  // sorted: text -> added_ index
  std::unique_ptr<hf::Splitter> split_unnormalized_, split_normalized_;
  std::vector<std::string> pieces_;          // id -> token string ("" for unused ids)
  std::vector<bool> used_, special_, skip_;  // per id: exists, IsSpecial, dropped by skip_special
  int32_t vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1, pad_id_ = 0;
  bool clean_up_spaces_ = true;
};

}  // namespace troupe::engine
