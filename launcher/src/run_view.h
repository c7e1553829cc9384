// What the dashboard reads from a run folder, live or finished: it follows the
// files the head writes and never writes them.
//
//   metrics.jsonl ──JsonlTail──▶ MetricsStore  (chart records, last train/eval, summaries)
//   rollouts.jsonl ─JsonlTail──▶ RolloutIndex  (offset, step, reward, task per line; filters)
//   logs/<actor>.log ──────────▶ ReadLogChunk  (tail and follow by byte offset)
//
// Each class follows a file that only grows (appends); a file that shrinks or
// is replaced is read again from the start. Thread-safety: every public
// method may be called from any thread (the HTTP server's); each class
// serialises its own state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"

namespace troupe::launcher {

// Reads complete lines appended to a file since the last Poll.
class JsonlTail {
 public:
  explicit JsonlTail(std::string path) : path_(std::move(path)) {}
  // Calls on_line(line, byte offset of the line) for each new complete line.
  // Returns true when the file was truncated or replaced since the last call:
  // the caller drops what it derived from the old content first (on_line then
  // sees the new file from its start).
  bool Poll(const std::function<void(std::string_view, uint64_t)>& on_line,
            const std::function<void()>& on_reset);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t offset_ = 0;  // bytes consumed (complete lines)
  ino_t inode_ = 0;
  std::string partial_;  // an incomplete last line
};

// The metrics.jsonl records the dashboard charts, in file order.
class MetricsStore {
 public:
  explicit MetricsStore(const std::string& path) : tail_(path) {}
  // Records from index `from` on (at most `max`), as a JSON array text of
  // the original lines; *next = index after the last one returned; *total = records known.
  std::string RecordsFrom(size_t from, size_t max, size_t* next, size_t* total);
  // The last record of `kind` ("train", "eval", "summary", "job_summary", ...), if any.
  std::optional<nlohmann::json> Last(const std::string& kind);
  // Records of `kind` seen so far.
  size_t Count(const std::string& kind);

 private:
  void PollLocked() TROUPE_REQUIRES(mu_);
  Mutex mu_;
  JsonlTail tail_ TROUPE_GUARDED_BY(mu_);
  std::vector<std::string> lines_ TROUPE_GUARDED_BY(mu_);  // charted records (raw JSON lines)
  std::map<std::string, std::string> last_ TROUPE_GUARDED_BY(mu_);  // last line per kind
  std::map<std::string, size_t> counts_ TROUPE_GUARDED_BY(mu_);
};

// Filters of the rollout viewer (unset: no bound).
struct RolloutQuery {
  std::optional<int64_t> step_min, step_max;
  std::optional<double> reward_min, reward_max;
  std::string task;              // exact task name (empty: any)
  std::string text;              // substring of the prompt or response (empty: any)
  std::optional<int64_t> before;  // only lines with index < before (paging, newest first)
  size_t limit = 50;
};

// Index of rollouts.jsonl: one entry per sampled sequence.
class RolloutIndex {
 public:
  explicit RolloutIndex(const std::string& path) : tail_(path), path_(path) {}
  struct Page {
    size_t total = 0;    // sequences in the file
    size_t matched = 0;  // of them, matching the filters
    std::vector<std::pair<int64_t, std::string>> lines;  // (index, raw line), newest first
    std::vector<std::string> tasks;                      // every task name seen
    int64_t step_min = 0, step_max = 0;                  // over the whole file
  };
  Result<Page> Query(const RolloutQuery& q);

 private:
  struct Entry {
    uint64_t offset = 0;
    uint32_t length = 0;
    int64_t step = 0;
    double reward = 0;
    uint16_t task = 0;  // index into tasks_
  };
  void PollLocked() TROUPE_REQUIRES(mu_);
  Mutex mu_;
  JsonlTail tail_ TROUPE_GUARDED_BY(mu_);
  std::string path_;
  std::vector<Entry> entries_ TROUPE_GUARDED_BY(mu_);
  std::vector<std::string> tasks_ TROUPE_GUARDED_BY(mu_);
};

// A piece of logs/<actor>.log: bytes [offset, offset + max) cut back to the
// last complete line. offset < 0: the last `max` bytes, starting at a line.
struct LogChunk {
  uint64_t offset = 0;  // where `text` starts
  uint64_t next = 0;    // where the next read should start
  uint64_t size = 0;    // the file's size now
  std::string text;
};
Result<LogChunk> ReadLogChunk(const std::string& path, int64_t offset, size_t max);

// True for a name that can only be a file in one folder ([A-Za-z0-9._-], no "..").
bool SafeFileName(std::string_view name);

}  // namespace troupe::launcher
