#include "hf/bpe.h"

#include <algorithm>
#include <functional>

#include "hf/json_fields.h"
#include "hf/unicode.h"

namespace troupe::engine::hf {
namespace {

// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards in byte order.
struct ByteAlphabet {
  char32_t to_char[256];
  ByteAlphabet() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    }
  }
};
const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Symbols of the word being merged and the candidate merges; reused per thread.
struct Symbol {
  int32_t id;      // -1: not in the vocabulary (never merges)
  uint32_t start;  // byte offset in the word
  uint32_t len;    // 0: merged into its left neighbour
  int32_t prev, next;
};
struct Candidate {
  int32_t rank, left, right, left_id, right_id, id;
  // Min-heap order: lowest rank first, then leftmost.
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};
struct MergeScratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<int32_t> ids;
};
MergeScratch& Scratch() {
  thread_local MergeScratch scratch;
  return scratch;
}

}  // namespace

char32_t ByteToChar(uint8_t byte) {
  return Alphabet().to_char[byte];
}

int ByteOfChar(char32_t c) {
  if (c < 256) {
    bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
    return printable ? static_cast<int>(c) : -1;
  }
  if (c >= 256 + 68) return -1;
  static const auto* const from_extra = [] {
    auto* table = new std::array<int, 68>();
    for (int b = 0; b < 256; ++b)
      if (Alphabet().to_char[b] >= 256) (*table)[Alphabet().to_char[b] - 256] = b;
    return table;
  }();
  return (*from_extra)[c - 256];
}

bool BpeModel::KeyOf(std::string_view model_string, std::string* key) const {
  key->clear();
  if (!byte_level_) {
    key->assign(model_string);
    return true;
  }
  for (size_t i = 0; i < model_string.size();) {
    int b = ByteOfChar(NextCodePoint(model_string, &i));
    if (b < 0) return false;
    key->push_back(static_cast<char>(b));
  }
  return true;
}

int32_t BpeModel::Lookup(std::string_view model_string) const {
  std::string key;
  if (!KeyOf(model_string, &key)) return -1;
  auto it = vocab_.find(key);
  return it == vocab_.end() ? -1 : it->second;
}

Result<std::unique_ptr<BpeModel>> BpeModel::FromParts(const nlohmann::json& model,
                                                      const std::vector<VocabEntry>& vocab,
                                                      const std::vector<MergeEntry>& merges,
                                                      bool byte_level, const std::string& where) {
  TROUPE_RETURN_IF_ERROR(
      CheckKeys(model, where,
                {"type", "vocab", "merges", "unk_token", "fuse_unk", "byte_fallback",
                 "ignore_merges", "dropout", "continuing_subword_prefix", "end_of_word_suffix"}));
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  TROUPE_ASSIGN_OR_RETURN(m->ignore_merges_, BoolField(model, "ignore_merges", where));
  TROUPE_ASSIGN_OR_RETURN(m->byte_fallback_, BoolField(model, "byte_fallback", where));
  TROUPE_ASSIGN_OR_RETURN(m->fuse_unk_, BoolField(model, "fuse_unk", where));
  if (m->byte_fallback_ && byte_level)
    return InvalidArgument("{}: byte_fallback with a ByteLevel pre-tokenizer is not supported",
                           where);
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0))
    return InvalidArgument("{}: BPE dropout {} is not supported (it makes encoding random)", where,
                           dropout->dump());
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    TROUPE_ASSIGN_OR_RETURN(std::string v, StringField(model, affix, where));
    if (!v.empty()) return InvalidArgument("{}: BPE {} '{}' is not supported", where, affix, v);
  }

  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id >= (int64_t{1} << 30))
      return InvalidArgument("{}: vocab id of '{}' is {}, not an id in [0, 2^30)", where, token,
                             id);
    max_id = std::max(max_id, id);
  }
  m->pieces_.assign(static_cast<size_t>(max_id + 1), std::string());
  m->has_.assign(static_cast<size_t>(max_id + 1), false);
  m->vocab_.reserve(vocab.size());
  std::string key;
  for (const auto& [token, id64] : vocab) {
    auto id = static_cast<int32_t>(id64);
    auto slot = static_cast<size_t>(id);
    if (m->has_[slot] && m->pieces_[slot] != token)
      return InvalidArgument("{}: vocab id {} is given to both '{}' and '{}'", where, id,
                             m->pieces_[slot], token);
    m->has_[slot] = true;
    m->pieces_[slot] = std::string(token);
    if (m->KeyOf(token, &key)) m->vocab_.insert_or_assign(key, id);  // a repeated key: last wins
  }

  m->merges_.reserve(merges.size());
  std::string ka, kb, kab;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    // A half outside the byte alphabet can never be a byte-level symbol: skip it.
    if (!m->KeyOf(a, &ka) || !m->KeyOf(b, &kb)) continue;
    kab = ka;
    kab += kb;
    auto ia = m->vocab_.find(ka), ib = m->vocab_.find(kb), iab = m->vocab_.find(kab);
    const std::string_view* missing = ia == m->vocab_.end()   ? &a
                                      : ib == m->vocab_.end() ? &b
                                                              : nullptr;
    if (missing)
      return InvalidArgument("{}: merges[{}] '{} {}' uses '{}', which is not in the vocabulary",
                             where, i, a, b, *missing);
    if (iab == m->vocab_.end())
      return InvalidArgument("{}: merges[{}] '{} {}' makes '{}{}', which is not in the vocabulary",
                             where, i, a, b, a, b);
    m->merges_[PairKey(ia->second, ib->second)] = Merge{static_cast<int32_t>(i), iab->second};
  }

  for (int byte = 0; byte < 256; ++byte) {
    std::string k =
        byte_level ? std::string(1, static_cast<char>(byte)) : fmt::format("<0x{:02X}>", byte);
    auto it = m->vocab_.find(k);
    m->byte_ids_[static_cast<size_t>(byte)] = it == m->vocab_.end() ? -1 : it->second;
  }
  for (int c = 0; c < 128; ++c) {
    auto it = m->vocab_.find(std::string(1, static_cast<char>(c)));
    m->ascii_ids_[static_cast<size_t>(c)] = it == m->vocab_.end() ? -1 : it->second;
  }
  TROUPE_ASSIGN_OR_RETURN(std::string unk, StringField(model, "unk_token", where));
  if (!unk.empty()) {
    m->unk_id_ = m->Lookup(unk);
    if (m->unk_id_ < 0)
      return InvalidArgument("{}: unk_token '{}' is not in the vocabulary", where, unk);
  }
  return m;
}

void BpeModel::AddToken(std::string_view content, int32_t id, bool insert_if_missing) {
  std::string key;
  if (!KeyOf(content, &key)) return;  // never a BPE output
  auto it = vocab_.find(key);
  if (it == vocab_.end()) {
    if (!insert_if_missing) return;
    vocab_.emplace(key, id);
    if (key.size() == 1) {
      auto b = static_cast<uint8_t>(key[0]);
      if (byte_level_ && byte_ids_[b] < 0) byte_ids_[b] = id;
      if (!byte_level_ && b < 128) ascii_ids_[b] = id;
    }
    return;
  }
  if (it->second != id) remap_[it->second] = id;
}

int32_t BpeModel::Remap(int32_t id) const {
  if (remap_.empty()) return id;
  auto it = remap_.find(id);
  return it == remap_.end() ? id : it->second;
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(Remap(it->second));
      return;
    }
  }
  bool cacheable = word.size() >= 2 && word.size() < 256;
  if (cacheable && cache_.Get(word, out)) return;
  size_t first = out->size();
  MergeWord(word, out);
  if (cacheable) cache_.Put(word, out->data() + first, out->size() - first);
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  MergeScratch& s = Scratch();
  auto& sym = s.symbols;
  auto& heap = s.heap;
  sym.clear();
  heap.clear();
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    int32_t id;
    auto byte = static_cast<uint8_t>(word[i]);
    if (byte_level_) {
      id = byte_ids_[byte];
      ++i;
    } else if (byte < 128) {
      id = ascii_ids_[byte];
      ++i;
    } else {
      NextCodePoint(word, &i);
      auto it = vocab_.find(word.substr(start, i - start));
      id = it == vocab_.end() ? -1 : it->second;
    }
    auto n = static_cast<int32_t>(sym.size());
    sym.push_back(
        Symbol{id, static_cast<uint32_t>(start), static_cast<uint32_t>(i - start), n - 1, n + 1});
  }
  sym.back().next = -1;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    int32_t a = sym[static_cast<size_t>(left)].id, b = sym[static_cast<size_t>(right)].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(PairKey(a, b));
    if (it == merges_.end()) return;
    heap.push_back(Candidate{it->second.rank, left, right, a, b, it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[static_cast<size_t>(c.left)];
    if (l.len == 0 || l.id != c.left_id || l.next != c.right) continue;
    Symbol& r = sym[static_cast<size_t>(c.right)];
    if (r.id != c.right_id) continue;
    l.id = c.id;
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    r.len = 0;
    push(l.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& y = sym[static_cast<size_t>(i)];
    if (y.id >= 0) {
      out->push_back(Remap(y.id));
      continue;
    }
    std::string_view text = word.substr(y.start, y.len);
    bool bytes_known = byte_fallback_;
    for (size_t k = 0; bytes_known && k < text.size(); ++k)
      bytes_known = byte_ids_[static_cast<uint8_t>(text[k])] >= 0;
    if (bytes_known) {
      for (char ch : text) out->push_back(Remap(byte_ids_[static_cast<uint8_t>(ch)]));
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
  }
}

BpeModel::Cache::Shard& BpeModel::Cache::ShardOf(std::string_view word) const {
  // The top bits of the map's own hash: the tables index with the low ones.
  return shards_[(StringHash()(word) >> 58) % kShards];
}

bool BpeModel::Cache::Get(std::string_view word, std::vector<int32_t>* out) const {
  Shard& shard = ShardOf(word);
  MutexLock lock(shard.mu);
  auto it = shard.map.find(word);
  if (it == shard.map.end()) return false;
  out->insert(out->end(), it->second.begin(), it->second.end());
  return true;
}

void BpeModel::Cache::Put(std::string_view word, const int32_t* ids, size_t n) const {
  Shard& shard = ShardOf(word);
  MutexLock lock(shard.mu);
  if (shard.map.size() >= kPerShard) shard.map.clear();
  shard.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

}  // namespace troupe::engine::hf
