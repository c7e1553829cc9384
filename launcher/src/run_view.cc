#include "run_view.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

namespace troupe::launcher {

namespace {

// Reads up to `n` bytes at `offset` (short at the end of the file).
Result<std::string> PRead(int fd, uint64_t offset, size_t n, const std::string& path) {
  std::string buf(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return IoError("cannot read '{}': {}", path, std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return buf;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The kinds of metrics.jsonl lines the dashboard charts or shows.
bool Charted(const std::string& kind) {
  static const std::set<std::string> kKinds = {"train",  "eval",    "warm_start", "heartbeat",
                                               "resume", "summary", "job_summary"};
  return kKinds.count(kind) > 0;
}

}  // namespace

bool JsonlTail::Poll(const std::function<void(std::string_view, uint64_t)>& on_line,
                     const std::function<void()>& on_reset) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return false;  // not written yet
  bool reset = false;
  if ((inode_ != 0 && st.st_ino != inode_) || static_cast<uint64_t>(st.st_size) < offset_ +
                                                                                       partial_.size()) {
    offset_ = 0;
    partial_.clear();
    reset = true;
    on_reset();
  }
  inode_ = st.st_ino;
  const uint64_t have = offset_ + partial_.size();
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == have) return reset;
  Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return reset;
  // Bounded per call (64 MiB): a huge file is read over several polls.
  auto chunk = PRead(f.fd, have, static_cast<size_t>(std::min<uint64_t>(size - have, 64u << 20)),
                     path_);
  if (!chunk.ok()) return reset;
  partial_ += *chunk;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(partial_.data() + start, nl - start);
    if (!line.empty()) on_line(line, offset_ + start);
  }
  offset_ += start;
  partial_.erase(0, start);
  return reset;
}

// ------------------------------------------------------------------ metrics

void MetricsStore::PollLocked() {
  tail_.Poll(
      [&](std::string_view line, uint64_t) TROUPE_REQUIRES(mu_) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return;  // a torn or foreign line
        const std::string kind = j.value("kind", "");
        counts_[kind]++;
        last_[kind] = std::string(line);
        if (Charted(kind)) lines_.emplace_back(line);
      },
      [&]() TROUPE_REQUIRES(mu_) {
        lines_.clear();
        last_.clear();
        counts_.clear();
      });
}

std::string MetricsStore::RecordsFrom(size_t from, size_t max, size_t* next, size_t* total) {
  MutexLock l(mu_);
  PollLocked();
  *total = lines_.size();
  std::string out = "[";
  size_t i = std::min(from, lines_.size());
  const size_t end = std::min(lines_.size(), i + max);
  for (; i < end; ++i) {
    if (out.size() > 1) out += ',';
    out += lines_[i];
  }
  out += ']';
  *next = i;
  return out;
}

std::optional<nlohmann::json> MetricsStore::Last(const std::string& kind) {
  MutexLock l(mu_);
  PollLocked();
  auto it = last_.find(kind);
  if (it == last_.end()) return std::nullopt;
  return nlohmann::json::parse(it->second, nullptr, false);
}

size_t MetricsStore::Count(const std::string& kind) {
  MutexLock l(mu_);
  PollLocked();
  auto it = counts_.find(kind);
  return it == counts_.end() ? 0 : it->second;
}

// ------------------------------------------------------------------ rollouts

void RolloutIndex::PollLocked() {
  tail_.Poll(
      [&](std::string_view line, uint64_t offset) TROUPE_REQUIRES(mu_) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return;
        Entry e;
        e.offset = offset;
        e.length = static_cast<uint32_t>(std::min<size_t>(line.size(), UINT32_MAX));
        e.step = j.value("step", int64_t{0});
        e.reward = j.value("reward", 0.0);
        const std::string task = j.value("task", "");
        auto it = std::find(tasks_.begin(), tasks_.end(), task);
        if (it == tasks_.end()) {
          if (tasks_.size() >= 65535) return;  // (not a real job)
          tasks_.push_back(task);
          it = tasks_.end() - 1;
        }
        e.task = static_cast<uint16_t>(it - tasks_.begin());
        entries_.push_back(e);
      },
      [&]() TROUPE_REQUIRES(mu_) {
        entries_.clear();
        tasks_.clear();
      });
}

Result<RolloutIndex::Page> RolloutIndex::Query(const RolloutQuery& q) {
  MutexLock l(mu_);
  PollLocked();
  Page page;
  page.total = entries_.size();
  page.tasks = tasks_;
  if (!entries_.empty()) {
    page.step_min = page.step_max = entries_[0].step;
    for (const auto& e : entries_) {
      page.step_min = std::min(page.step_min, e.step);
      page.step_max = std::max(page.step_max, e.step);
    }
  }
  int task = -1;
  if (!q.task.empty()) {
    auto it = std::find(tasks_.begin(), tasks_.end(), q.task);
    if (it == tasks_.end()) return page;  // no such task: nothing matches
    task = static_cast<int>(it - tasks_.begin());
  }
  Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0 && !entries_.empty())
    return IoError("cannot read '{}': {}", path_, std::strerror(errno));
  int64_t start = static_cast<int64_t>(entries_.size()) - 1;
  if (q.before) start = std::min(start, *q.before - 1);
  for (int64_t i = start; i >= 0; --i) {
    const Entry& e = entries_[static_cast<size_t>(i)];
    if ((q.step_min && e.step < *q.step_min) || (q.step_max && e.step > *q.step_max) ||
        (q.reward_min && e.reward < *q.reward_min) || (q.reward_max && e.reward > *q.reward_max) ||
        (task >= 0 && e.task != task))
      continue;
    std::string line;
    if (!q.text.empty() || page.lines.size() < q.limit) {
      TROUPE_ASSIGN_OR_RETURN(line, PRead(f.fd, e.offset, e.length, path_));
      if (!q.text.empty()) {
        // Searched in the texts only (not in ids or field names).
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.value("prompt_text", "").find(q.text) == std::string::npos &&
            j.value("response_text", "").find(q.text) == std::string::npos)
          continue;
      }
    }
    ++page.matched;
    if (page.lines.size() < q.limit) page.lines.emplace_back(i, std::move(line));
  }
  return page;
}

// ------------------------------------------------------------------ logs

Result<LogChunk> ReadLogChunk(const std::string& path, int64_t offset, size_t max) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return NotFound("cannot read '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return IoError("cannot stat '{}': {}", path, std::strerror(errno));
  LogChunk c;
  c.size = static_cast<uint64_t>(st.st_size);
  bool from_tail = offset < 0;
  uint64_t at = from_tail ? (c.size > max ? c.size - max : 0)
                          : std::min<uint64_t>(static_cast<uint64_t>(offset), c.size);
  TROUPE_ASSIGN_OR_RETURN(std::string text, PRead(f.fd, at, std::min<uint64_t>(max, c.size - at),
                                                  path));
  if (from_tail && at > 0) {
    // Start at a line: drop the cut first line.
    size_t nl = text.find('\n');
    size_t drop = nl == std::string::npos ? text.size() : nl + 1;
    text.erase(0, drop);
    at += drop;
  }
  // End at a line: an incomplete last line is read next time.
  // (A line longer than `max` is returned cut, so a reader never stalls on it.)
  size_t last = text.rfind('\n');
  if (last != std::string::npos)
    text.resize(last + 1);
  else if (text.size() < max)
    text.clear();
  c.offset = at;
  c.next = at + text.size();
  c.text = std::move(text);
  return c;
}

bool SafeFileName(std::string_view name) {
  if (name.empty() || name.size() > 200 || name[0] == '.') return false;
  return name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
         std::string_view::npos;
}

}  // namespace troupe::launcher
