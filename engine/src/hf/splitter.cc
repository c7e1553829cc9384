#include "hf/splitter.h"

#include "hf/unicode.h"

namespace troupe::engine::hf {

Splitter::Splitter(const std::vector<Entry>& entries) : nodes_(1), entries_(entries) {
  for (size_t e = 0; e < entries_.size(); ++e) {
    const std::string& t = entries_[e].text;
    if (t.empty()) continue;
    first_byte_[static_cast<uint8_t>(t[0])] = true;
    int32_t node = 0;
    for (char c : t) {
      int32_t next = Child(node, static_cast<uint8_t>(c));
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].kids.emplace_back(static_cast<uint8_t>(c), next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[static_cast<size_t>(node)].entry = static_cast<int32_t>(e);
  }
}

int32_t Splitter::Child(int32_t node, uint8_t byte) const {
  for (const auto& [b, n] : nodes_[static_cast<size_t>(node)].kids)
    if (b == byte) return n;
  return -1;
}

bool Splitter::Accept(std::string_view text, size_t begin, size_t end, int32_t entry) const {
  if (!entries_[static_cast<size_t>(entry)].single_word) return true;
  if (begin > 0 && IsWordChar(PrevCodePoint(text, begin))) return false;
  size_t next = end;
  return end == text.size() || !IsWordChar(NextCodePoint(text, &next));
}

void Splitter::Split(std::string_view text, std::vector<std::string_view>* out) const {
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = i;
    for (size_t j = i; j < text.size(); ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].entry >= 0) {
        best = nodes_[static_cast<size_t>(node)].entry;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    if (!Accept(text, i, best_end, best)) {  // stays text; matching resumes after it
      i = best_end;
      continue;
    }
    if (i > start) out->push_back(text.substr(start, i - start));
    out->push_back(text.substr(i, best_end - i));
    i = start = best_end;
  }
  if (start < text.size()) out->push_back(text.substr(start));
}

}  // namespace troupe::engine::hf
