// Tokenizers behind one interface (torch-free; library troupe::tokenizer).
//
// A Tokenizer maps text to token ids and back and names its special tokens.
// Chat/prompt rendering is not here: tasks (envs/) render prompts and call
// Encode. Implementations are immutable after construction, so every method is
// const and safe to call from any number of threads at once.
//
// Two implementations: CharTokenizer (below) for the built-in toy tasks, and
// HfTokenizer (hf_tokenizer.h) for a Hugging Face tokenizer.json.
//
// CharTokenizer is the tokenizer of the built-in tasks: one token per byte of
// a fixed alphabet plus PAD (id 0), BOS (id 1) and EOS (id 2); alphabet byte i
// has id 3 + i. Text with a byte outside the alphabet is an error that names
// the byte and its offset (no silent drop, no UNK).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text -> ids (HfTokenizer: text that spells an added token, e.g. "<|im_end|>",
  // becomes that token, as in Hugging Face). Optionally prepends BOS (when the tokenizer has one) /
  // appends EOS (an error when it has none). Fails (naming the offending character and its byte
  // offset) when the text cannot be represented.
  virtual Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos = false,
                                              bool add_eos = false) const = 0;
  // Text -> ids as a model takes a whole input: Hugging Face's `tokenizer(text)`
  // (add_special_tokens=True), i.e. the post-processor's special tokens around the
  // text (Llama 3: BOS first; Qwen: none). CharTokenizer: BOS, then the text.
  virtual Result<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view text) const = 0;
  // Ids -> text. Special tokens (PAD/BOS/EOS) are dropped when skip_special, else rendered
  // as their piece ("<pad>", "<bos>", "<eos>"). Fails on an id outside [0, vocab_size()),
  // naming the id and its position.
  virtual Result<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special = true) const = 0;
  // The text of one token id; fails outside [0, vocab_size()).
  virtual Result<std::string> IdToPiece(int32_t id) const = 0;
  // Number of ids this tokenizer produces (ids are 0..vocab_size()-1). A model's
  // vocab_size may be larger (padded); never smaller.
  virtual int32_t vocab_size() const = 0;
  // Ids of the named special tokens; bos_id() is -1 when the tokenizer has no BOS
  // (Qwen), eos_id() is -1 only for a bare tokenizer.json that names none. pad_id() is
  // always a valid id (it fills padding, which is masked).
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  // True for PAD/BOS/EOS (and any other control token of the implementation).
  virtual bool IsSpecial(int32_t id) const = 0;
  // Id of the token spelled exactly `piece` (as IdToPiece gives it: a vocabulary entry
  // or an added token such as "<|im_end|>"), or -1 when there is none.
  virtual int32_t TokenToId(std::string_view piece) const = 0;
};

class CharTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kPadId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kNumSpecial = 3;

  // Builds a tokenizer over the bytes of `alphabet` (in order: byte alphabet[i] gets id
  // 3 + i). Fails on an empty alphabet or a repeated byte (naming it).
  static Result<std::unique_ptr<CharTokenizer>> Create(std::string_view alphabet);

  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos = false,
                                      bool add_eos = false) const override;
  Result<std::string> Decode(const std::vector<int32_t>& ids,
                             bool skip_special = true) const override;
  Result<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view text) const override {
    return Encode(text, /*add_bos=*/true, /*add_eos=*/false);
  }
  Result<std::string> IdToPiece(int32_t id) const override;
  int32_t TokenToId(std::string_view piece) const override;
  int32_t vocab_size() const override {
    return kNumSpecial + static_cast<int32_t>(alphabet_.size());
  }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  int32_t pad_id() const override { return kPadId; }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id < kNumSpecial; }

  // The alphabet the tokenizer was built from.
  const std::string& alphabet() const { return alphabet_; }
  // Id of one byte, or -1 when it is not in the alphabet.
  int32_t IdOf(unsigned char c) const { return byte_to_id_[c]; }

 private:
  explicit CharTokenizer(std::string alphabet);
  std::string alphabet_;
  int32_t byte_to_id_[256];
};

}  // namespace troupe::engine
