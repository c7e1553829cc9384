// The learner's batch ledger: every batch whose fate it decided, in decision
// order, in one append-only file of the run folder (`<run>/batches.tsv`):
//
//   <batch id> \t <fate> \t <sequences> \t <unscored> \t <source> \t <stale> \n
//
// fate is the accounting term the batch's sequences went to ("trained",
// "skipped", "dropped_stale", "dropped_invalid"); `unscored` counts sequences
// of the batch left out before training because their reward could not be
// computed (reward service failure with on_failure: drop); source is the
// producer incarnation ("rollout-0/<incarnation hex>"); `stale` counts
// sequences of the batch's groups that were too old on arrival and left out
// (the per-group lag gate: dropped_stale). Lines of five columns (ledgers
// written before the per-group gate) read as stale 0.
//
// The ledger is what makes a learner restart exactly-once and the job's
// accounting exact:
//   * at a checkpoint the learner Sync()s it and stores the returned size in
//     the checkpoint; a learner resumed from that checkpoint Open()s the file
//     truncated to that size, so the ledger lists exactly the batches whose
//     effect is in the restored weights (later decisions are redone when the
//     batches are re-delivered);
//   * Find() answers a re-delivered batch with its recorded fate instead of
//     training it again (the in-memory dedupe of trainer::Learner does not
//     survive the process);
//   * Counts() per source are the learner's side of the accounting.
//
// Not thread-safe: the learner's loop owns it. All calls block on file I/O
// only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "troupe/core/status.h"

namespace troupe::actors {

// Sequences per accounting term, for one producer incarnation (or all).
struct LedgerCounts {
  int64_t trained = 0;
  int64_t skipped = 0;
  int64_t dropped_stale = 0;
  int64_t dropped_invalid = 0;
  int64_t dropped_unscored = 0;
  int64_t decided() const {
    return trained + skipped + dropped_stale + dropped_invalid + dropped_unscored;
  }
  // Adds `n` sequences to the term named `fate`; false if no term has that name.
  bool Add(const std::string& fate, int64_t n);
  // ("trained", n), ("skipped", n), ... for every term.
  std::map<std::string, int64_t> Terms() const;
};

class BatchLedger {
 public:
  struct Entry {
    std::string fate;
    int64_t sequences = 0;
    int64_t unscored = 0;
    int64_t stale = 0;
  };

  // Opens (creating) `path`. `keep_bytes` < 0 keeps the whole file; otherwise
  // the file is truncated to its first `keep_bytes` bytes (what a checkpoint
  // recorded), which must end on a line boundary. Malformed lines are an
  // error naming the file and line.
  static Result<std::unique_ptr<BatchLedger>> Open(const std::string& path, int64_t keep_bytes);
  ~BatchLedger();
  BatchLedger(const BatchLedger&) = delete;
  BatchLedger& operator=(const BatchLedger&) = delete;

  // Records one decided batch (buffered; Sync() makes it durable). `fate` is
  // a LedgerCounts term. Recording an id twice is a bug (checked).
  Status Record(const std::string& id, const std::string& source, const std::string& fate,
                int64_t sequences, int64_t unscored, int64_t stale = 0);
  // Flushes and fsyncs; returns the file's size in bytes (to store in a checkpoint).
  Result<int64_t> Sync();

  // The recorded entry of `id`, or null.
  const Entry* Find(const std::string& id) const;
  const std::map<std::string, LedgerCounts>& Counts() const { return by_source_; }
  LedgerCounts Total() const;
  size_t size() const { return entries_.size(); }
  const std::string& path() const { return path_; }

 private:
  BatchLedger(std::string path, std::FILE* f) : path_(std::move(path)), file_(f) {}
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unordered_map<std::string, Entry> entries_;
  std::map<std::string, LedgerCounts> by_source_;
};

}  // namespace troupe::actors
