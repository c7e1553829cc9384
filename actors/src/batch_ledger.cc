#include "batch_ledger.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "troupe/core/check.h"

namespace troupe::actors {
namespace {

constexpr const char* kTerms[] = {"trained", "skipped", "dropped_stale", "dropped_invalid",
                                  "dropped_unscored"};

int64_t* Term(LedgerCounts& c, const std::string& fate) {
  if (fate == "trained") return &c.trained;
  if (fate == "skipped") return &c.skipped;
  if (fate == "dropped_stale") return &c.dropped_stale;
  if (fate == "dropped_invalid") return &c.dropped_invalid;
  if (fate == "dropped_unscored") return &c.dropped_unscored;
  return nullptr;
}

bool ParseCount(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::stoll(s);
  return true;
}

}  // namespace

bool LedgerCounts::Add(const std::string& fate, int64_t n) {
  int64_t* t = Term(*this, fate);
  if (!t) return false;
  *t += n;
  return true;
}

std::map<std::string, int64_t> LedgerCounts::Terms() const {
  std::map<std::string, int64_t> out;
  LedgerCounts copy = *this;
  for (const char* t : kTerms) out[t] = *Term(copy, t);
  return out;
}

Result<std::unique_ptr<BatchLedger>> BatchLedger::Open(const std::string& path,
                                                       int64_t keep_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const int64_t size = fs::exists(path, ec) ? static_cast<int64_t>(fs::file_size(path, ec)) : 0;
  if (ec) return IoError("batch ledger {}: {}", path, ec.message());
  if (keep_bytes > size) {
    return Malformed(
        "batch ledger {} holds {} bytes but the checkpoint recorded {}: the file was truncated or "
        "replaced after that checkpoint",
        path, size, keep_bytes);
  }
  if (keep_bytes >= 0 && keep_bytes < size) {
    if (::truncate(path.c_str(), keep_bytes) != 0)
      return IoError("cannot truncate batch ledger {}: {}", path, std::strerror(errno));
  }
  std::vector<std::string> lines;
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!all.empty() && all.back() != '\n')
      return Malformed("batch ledger {}: the last line is incomplete", path);
    std::istringstream ss(all);
    for (std::string line; std::getline(ss, line);) lines.push_back(std::move(line));
  }
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return IoError("cannot open batch ledger {}: {}", path, std::strerror(errno));
  std::unique_ptr<BatchLedger> l(new BatchLedger(path, f));
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> col;
    std::istringstream ls(lines[i]);
    for (std::string c; std::getline(ls, c, '\t');) col.push_back(std::move(c));
    Entry e;
    LedgerCounts probe;
    if ((col.size() != 5 && col.size() != 6) || col[0].empty() || !probe.Add(col[1], 0) ||
        !ParseCount(col[2], &e.sequences) || !ParseCount(col[3], &e.unscored) ||
        (col.size() == 6 && !ParseCount(col[5], &e.stale))) {
      return Malformed("batch ledger {}: line {} is not '<id> <fate> <sequences> <unscored> "
                       "<source> [<stale>]' (tab-separated)",
                       path, i + 1);
    }
    e.fate = col[1];
    if (!l->entries_.emplace(col[0], e).second)
      return Malformed("batch ledger {}: line {} records batch '{}' a second time", path, i + 1,
                       col[0]);
    LedgerCounts& c = l->by_source_[col[4]];
    c.Add(e.fate, e.sequences);
    c.dropped_unscored += e.unscored;
    c.dropped_stale += e.stale;
  }
  return l;
}

BatchLedger::~BatchLedger() {
  if (file_) std::fclose(file_);
}

Status BatchLedger::Record(const std::string& id, const std::string& source,
                           const std::string& fate, int64_t sequences, int64_t unscored,
                           int64_t stale) {
  LedgerCounts& c = by_source_[source];
  TROUPE_CHECK_MSG(c.Add(fate, sequences), "unknown ledger fate '{}'", fate);
  c.dropped_unscored += unscored;
  c.dropped_stale += stale;
  TROUPE_CHECK_MSG(entries_.emplace(id, Entry{fate, sequences, unscored, stale}).second,
                   "batch '{}' recorded twice in the ledger", id);
  // Ids and sources come from the wire: keep the file parseable whatever they hold.
  auto clean = [](std::string s) {
    for (char& ch : s)
      if (ch == '\t' || ch == '\n' || ch == '\r') ch = ' ';
    return s;
  };
  std::string line = clean(id) + "\t" + fate + "\t" + std::to_string(sequences) + "\t" +
                     std::to_string(unscored) + "\t" + clean(source) + "\t" +
                     std::to_string(stale) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size())
    return IoError("cannot write batch ledger {}: {}", path_, std::strerror(errno));
  return Status::Ok();
}

Result<int64_t> BatchLedger::Sync() {
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    return IoError("cannot write batch ledger {}: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(::fileno(file_), &st) != 0)
    return IoError("batch ledger {}: {}", path_, std::strerror(errno));
  return static_cast<int64_t>(st.st_size);
}

const BatchLedger::Entry* BatchLedger::Find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

LedgerCounts BatchLedger::Total() const {
  LedgerCounts t;
  for (const auto& [src, c] : by_source_) {
    for (const auto& [term, n] : c.Terms()) t.Add(term, n);
  }
  return t;
}

}  // namespace troupe::actors
