// Finds added tokens in text (private to engine/): at each position the longest token
// that starts there, scanning left to right (leftmost-longest, as tokenizers.js's
// DictionarySplitter and Hugging Face's Aho-Corasick matcher do). Immutable, thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::engine::hf {

class Splitter {
 public:
  struct Entry {
    std::string text;
    // Hugging Face's single_word: the match counts only when no word character
    // (Rust regex \w) touches it on either side; a rejected match stays plain text.
    bool single_word = false;
  };
  explicit Splitter(const std::vector<Entry>& entries);

  // Cuts `text` into its pieces, in order: the text between matches and the matches
  // themselves; no empty pieces. Appends to *out (views into text).
  void Split(std::string_view text, std::vector<std::string_view>* out) const;
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    int32_t entry = -1;                             // an entry ends here
    std::vector<std::pair<uint8_t, int32_t>> kids;  // byte -> node
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  bool Accept(std::string_view text, size_t begin, size_t end, int32_t entry) const;

  std::vector<Node> nodes_;
  std::vector<Entry> entries_;
  bool first_byte_[256] = {};
};

}  // namespace troupe::engine::hf
