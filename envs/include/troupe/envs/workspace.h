// A per-episode scratch directory confined to itself, and the file tools
// (read, write, edit, list, submit) that multi-turn tasks run over it.
//
// Confinement: paths are relative, at most max_path_chars long and
// max_depth deep; absolute paths, "..", NUL bytes and control characters are
// rejected before touching the filesystem; every component is opened with
// O_NOFOLLOW relative to the workspace's own directory descriptor, so a
// symbolic link (even one planted by hand, pointing outside) is never followed
// and only regular files are read or written (FIFOs and devices are refused
// without blocking). Quotas bound file size, total bytes and file count.
// Error messages name the relative path and the limit and never reveal the
// host path. The destructor removes the directory tree (links are removed,
// not followed).
//
// Thread safety: a Workspace belongs to one episode and is used by one thread
// at a time. No call blocks beyond small local file I/O; nothing throws.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/envs/config.h"
#include "troupe/envs/environment.h"

namespace troupe::envs {

class Workspace {
 public:
  struct Entry {
    std::string name;
    enum class Type { kFile, kDir, kLink, kOther } type = Type::kFile;
    int64_t bytes = 0;  // files only
  };
  struct Usage {
    int64_t files = 0;  // files, directories and other entries
    int64_t bytes = 0;  // bytes in regular files
  };

  // Makes a fresh directory "<root>/troupe-ws-XXXXXX" (mode 0700). kIo when
  // the root is missing or not writable (the message names it).
  static Result<std::unique_ptr<Workspace>> Create(const WorkspaceConfig& config);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Host path of the directory (for tests and task setup; never shown to the model).
  const std::string& path() const { return path_; }
  const WorkspaceConfig& config() const { return config_; }

  // The whole file; InvalidArgument/NotFound messages fit for the model.
  Result<std::string> ReadFile(std::string_view rel) const;
  // Creates or replaces a file, creating missing parent directories.
  Status WriteFile(std::string_view rel, std::string_view content);
  // Replaces the single occurrence of `old_text` with `new_text`.
  Status EditFile(std::string_view rel, std::string_view old_text, std::string_view new_text);
  // Entries of a directory ("" or "." = the workspace), sorted by name, at
  // most max_list_entries (`truncated` set when there were more).
  Result<std::vector<Entry>> List(std::string_view rel, bool* truncated = nullptr) const;
  // Files and bytes under the workspace (scan capped at 4 * max_files entries).
  Usage ComputeUsage() const;

 private:
  Workspace(WorkspaceConfig config, std::string path, int dir_fd);
  Result<std::vector<std::string>> SplitPath(std::string_view rel, bool allow_root) const;
  // Opens the directory holding the last component (creating parents when `create`).
  Result<int> OpenParent(const std::vector<std::string>& parts, bool create,
                         int64_t* created) const;

  WorkspaceConfig config_;
  std::string path_;
  int dir_fd_ = -1;
};

// Scores a finished workspace episode from the workspace and the submitted
// answer (nullopt when the episode ended without submit, or submit had no
// "answer"). Must not throw whatever the workspace holds.
using WorkspaceScorer = std::function<VerifyResult(
    const Workspace& workspace, const std::optional<std::string>& answer, bool submitted)>;

// The specs of the file tools below (for tool instructions).
const std::vector<ToolSpec>& WorkspaceToolSpecs();

// An Environment with the file tools over a fresh workspace holding
// `initial_files` (relative path -> content):
//   read   {"path": str, "offset"?: int, "limit"?: int}  file content (a slice of it)
//   write  {"path": str, "content": str}                 create or replace a file
//   edit   {"path": str, "old": str, "new": str}         replace one exact occurrence
//   list   {"path"?: str}                                directory entries
//   submit {"answer"?: str}                              end the episode
Result<std::unique_ptr<Environment>> NewWorkspaceEnvironment(
    const WorkspaceConfig& config, const std::map<std::string, std::string>& initial_files,
    WorkspaceScorer scorer);

}  // namespace troupe::envs
