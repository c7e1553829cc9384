// The BPE model of the HF tokenizer (private to engine/).
//
//   pre-token (bytes) ──initial symbols──▶ merges by rank (leftmost first) ──▶ ids
//
// Byte-level models (GPT-2, Llama 3, Qwen) are keyed by raw bytes: the vocabulary's
// GPT-2 byte-to-unicode strings are turned back into the bytes they stand for at load,
// so a pre-token is merged as bytes and never re-encoded. Other models (SentencePiece
// style, Llama 2) start from one symbol per code point, with ByteFallback to <0xNN>
// tokens and UNK for what the vocabulary lacks. Merges are a hash map from the pair of
// symbol ids to (rank, merged id); repeated words are served from a cache.
//
// Encode is const and thread-safe: the cache is sharded, each shard behind its own lock.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/hash/hash.h>
#include <nlohmann/json.hpp>

#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"

namespace troupe::engine::hf {

// Hash and equality for maps keyed by std::string that look up by std::string_view
// (Debian's abseil has its own string_view, so the defaults do not accept ours).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    return absl::Hash<absl::string_view>()(absl::string_view(s.data(), s.size()));
  }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, StringHash, StringEq>;

// GPT-2's reversible byte <-> printable code point map (bytes_to_unicode).
char32_t ByteToChar(uint8_t byte);
// The byte a code point of that map stands for, or -1.
int ByteOfChar(char32_t c);

class BpeModel {
 public:
  // The "model" object of tokenizer.json (type BPE), read in parts: `options` holds
  // every key but the two big ones, `vocab` the token -> id entries in file order,
  // `merges` the pairs in rank order. `byte_level`: the pipeline ends in a ByteLevel
  // pre-tokenizer, so pre-tokens arrive as raw bytes. Errors name `where` (e.g.
  // "tokenizer.json model") and the offending entry.
  using VocabEntry = std::pair<std::string_view, int64_t>;
  using MergeEntry = std::pair<std::string_view, std::string_view>;
  static Result<std::unique_ptr<BpeModel>> FromParts(const nlohmann::json& options,
                                                     const std::vector<VocabEntry>& vocab,
                                                     const std::vector<MergeEntry>& merges,
                                                     bool byte_level, const std::string& where);

  // Makes the model-space string `content` encode to `id`, as tokenizers.js does for
  // added tokens: their content joins the model's map (insert_if_missing), and a
  // vocabulary entry equal to an added token's (or its normalized form's) text encodes
  // to the added id.
  void AddToken(std::string_view content, int32_t id, bool insert_if_missing);

  // Appends the ids of one pre-token (raw bytes when byte-level, else UTF-8).
  void Encode(std::string_view word, std::vector<int32_t>* out) const;

  // Id -> token string as the vocabulary spells it (GPT-2 alphabet when byte-level);
  // has[id] is false for ids the vocabulary does not use.
  const std::vector<std::string>& vocab_pieces() const { return pieces_; }
  const std::vector<bool>& vocab_has() const { return has_; }
  int32_t unk_id() const { return unk_id_; }
  bool fuse_unk() const { return fuse_unk_; }
  bool byte_level() const { return byte_level_; }
  // Lookup of a model-space string (as tokenizers.js's tokens_to_ids), or -1.
  int32_t Lookup(std::string_view model_string) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  // Cache of whole-word results: shards of word -> ids, each shard cleared when full.
  class Cache {
   public:
    bool Get(std::string_view word, std::vector<int32_t>* out) const;
    void Put(std::string_view word, const int32_t* ids, size_t n) const;

   private:
    static constexpr size_t kShards = 64, kPerShard = 4096;
    struct Shard {
      mutable Mutex mu;
      mutable StringMap<std::vector<int32_t>> map TROUPE_GUARDED_BY(mu);
    };
    Shard& ShardOf(std::string_view word) const;
    mutable std::array<Shard, kShards> shards_;
  };

  BpeModel() = default;
  // The key of a model-space string in `vocab_` (bytes when byte-level); false when a
  // character is outside the byte alphabet (such a token can never come out of BPE).
  bool KeyOf(std::string_view model_string, std::string* key) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;
  int32_t Remap(int32_t id) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  StringMap<int32_t> vocab_;                     // key -> id
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left id << 32 | right id)
  absl::flat_hash_map<int32_t, int32_t> remap_;  // vocab id -> added token id (rare)
  std::array<int32_t, 256> byte_ids_{};          // byte-level: id of each byte; else <0xNN>
  std::array<int32_t, 128> ascii_ids_{};         // not byte-level: id of each ASCII character
  std::vector<std::string> pieces_;
  std::vector<bool> has_;
  Cache cache_;
};

}  // namespace troupe::engine::hf
