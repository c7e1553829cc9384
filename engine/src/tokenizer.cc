#include "troupe/engine/tokenizer.h"

#include <cctype>

#include <fmt/format.h>

namespace troupe::engine {
namespace {

// Printable form of a byte for error messages: 'a', or \xNN.
std::string ShowByte(unsigned char c) {
  if (std::isprint(c)) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("\\x{:02x}", c);
}

const char* const kSpecialPieces[CharTokenizer::kNumSpecial] = {"<pad>", "<bos>", "<eos>"};

}  // namespace

CharTokenizer::CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
  for (int32_t& id : byte_to_id_) id = -1;
  for (size_t i = 0; i < alphabet_.size(); ++i)
    byte_to_id_[static_cast<unsigned char>(alphabet_[i])] = kNumSpecial + static_cast<int32_t>(i);
}

Result<std::unique_ptr<CharTokenizer>> CharTokenizer::Create(std::string_view alphabet) {
  if (alphabet.empty()) return InvalidArgument("tokenizer alphabet is empty");
  bool seen[256] = {};
  for (size_t i = 0; i < alphabet.size(); ++i) {
    auto c = static_cast<unsigned char>(alphabet[i]);
    if (seen[c])
      return InvalidArgument("tokenizer alphabet repeats byte {} (at offset {})", ShowByte(c), i);
    seen[c] = true;
  }
  return std::unique_ptr<CharTokenizer>(new CharTokenizer(std::string(alphabet)));
}

Result<std::vector<int32_t>> CharTokenizer::Encode(std::string_view text, bool add_bos,
                                                   bool add_eos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (add_bos) ids.push_back(kBosId);
  for (size_t i = 0; i < text.size(); ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    int32_t id = byte_to_id_[c];
    if (id < 0)
      return InvalidArgument("character {} at byte offset {} is not in the tokenizer alphabet",
                             ShowByte(c), i);
    ids.push_back(id);
  }
  if (add_eos) ids.push_back(kEosId);
  return ids;
}

Result<std::string> CharTokenizer::Decode(const std::vector<int32_t>& ids,
                                          bool skip_special) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      return InvalidArgument("token id {} at position {} is outside the vocabulary [0, {})", id, i,
                             vocab_size());
    if (id < kNumSpecial) {
      if (!skip_special) out += kSpecialPieces[id];
      continue;
    }
    out.push_back(alphabet_[static_cast<size_t>(id - kNumSpecial)]);
  }
  return out;
}

Result<std::string> CharTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    return InvalidArgument("token id {} is outside the vocabulary [0, {})", id, vocab_size());
  if (id < kNumSpecial) return std::string(kSpecialPieces[id]);
  return std::string(1, alphabet_[static_cast<size_t>(id - kNumSpecial)]);
}

int32_t CharTokenizer::TokenToId(std::string_view piece) const {
  for (int32_t id = 0; id < kNumSpecial; ++id)
    if (piece == kSpecialPieces[id]) return id;
  return piece.size() == 1 ? byte_to_id_[static_cast<unsigned char>(piece[0])] : -1;
}

}  // namespace troupe::engine
