// Run folders: runs/<name>-<YYYYmmdd-HHMMSS>/ with config.yaml (resolved),
// head.json (control endpoint, pid), logs/<actor>.log, metrics.jsonl and
// checkpoints/; runs/latest is a symlink to the newest run. Functions here are
// plain filesystem operations, safe to call from any thread.
#pragma once

#include <string>

#include "troupe/core/status.h"

namespace troupe::launcher {

struct RunDir {
  std::string path;  // absolute path of the run folder

  std::string config() const { return path + "/config.yaml"; }
  std::string head_file() const { return path + "/head.json"; }
  std::string logs() const { return path + "/logs"; }
  std::string log_file(const std::string& actor) const { return logs() + "/" + actor + ".log"; }
  std::string metrics() const { return path + "/metrics.jsonl"; }
  std::string checkpoints() const { return path + "/checkpoints"; }
  std::string secrets() const { return path + "/secrets"; }
  std::string name() const;
};

// Creates a fresh run folder under `runs_root` and points runs_root/latest at it.
Result<RunDir> CreateRunDir(const std::string& runs_root, const std::string& job_name);

// Resolves a RUN argument: empty = runs_root/latest; an existing path; or a
// folder name under runs_root. Errors name what was tried.
Result<RunDir> ResolveRunDir(const std::string& runs_root, const std::string& run);

// Writes `content` to `path` atomically (temp file + fsync + rename), mode `mode`.
Status WriteFileAtomic(const std::string& path, const std::string& content, int mode = 0644);
Result<std::string> ReadFile(const std::string& path);

}  // namespace troupe::launcher
