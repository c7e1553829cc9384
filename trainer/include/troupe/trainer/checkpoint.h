// Crash-safe checkpoint directories, torch-free.
//
// Layout under a checkpoint root:
//
//   <root>/ckpt-000000000120/      one complete checkpoint per directory
//   <root>/ckpt-000000000240/
//   <root>/latest                  one line: the name of the newest complete one
//   <root>/.tmp-ckpt-...           a save in progress (or one killed mid-way)
//
// A save writes every file into a fresh .tmp directory, fsyncs them, renames
// the directory to its final name (atomic), then replaces `latest` by writing
// latest.tmp and renaming it over (atomic). A process killed at any point
// leaves `latest` naming a complete checkpoint (or absent if none was ever
// completed); leftover .tmp directories are ignored by readers and removed by
// the next save. Older checkpoints beyond `keep` are deleted after `latest`
// moves. One writer per root at a time; readers may run concurrently.
// All calls block on file-system I/O only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "troupe/core/status.h"

namespace troupe::trainer {

// Fault-injection hooks for tests: called after each named stage of a save
// ("model", "reference", "optimizer", "rng", "state", "extra", "synced", "renamed",
// "latest"), on the saving thread. A test may block or kill the process there.
struct CheckpointHooks {
  std::function<void(std::string_view stage)> on_stage;
  void Stage(std::string_view stage) const {
    if (on_stage) on_stage(stage);
  }
};

// One save in progress. Not copyable; the destructor removes the temporary
// directory unless Commit() succeeded.
class CheckpointWriter {
 public:
  // Creates <root> if needed, removes stale .tmp directories, and creates a
  // fresh temporary directory for checkpoint `step`.
  static Result<CheckpointWriter> Begin(const std::string& root, uint64_t step);
  CheckpointWriter(CheckpointWriter&& other) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) = delete;
  CheckpointWriter(const CheckpointWriter&) = delete;
  ~CheckpointWriter();

  // The temporary directory to write files into.
  const std::string& dir() const { return tmp_dir_; }
  // Path of a file inside the temporary directory.
  std::string File(std::string_view name) const;
  // fsyncs the files, renames the directory into place, points `latest` at it,
  // and deletes all but the newest `keep` checkpoints. Returns the final path.
  Result<std::string> Commit(int32_t keep, const CheckpointHooks& hooks = {});

 private:
  CheckpointWriter(std::string root, std::string tmp_dir, std::string name);
  std::string root_, tmp_dir_, name_;
  bool committed_ = false;
};

// The checkpoint directory `path` refers to: a root (follows `latest`) or a
// checkpoint directory itself (holds state.json). NotFound when the root has
// no complete checkpoint yet.
Result<std::string> ResolveCheckpoint(const std::string& path);

// The policy weights file `path` names: a .safetensors file, a directory
// holding model.safetensors (a checkpoint), a checkpoints root or a run
// folder (then the checkpoint its `latest` names). NotFound names the path.
Result<std::string> ResolveWeightsFile(const std::string& path);

// Writes `contents` to `path` atomically (path.tmp, fsync, rename, fsync dir).
Status WriteFileAtomic(const std::string& path, std::string_view contents);
// Reads a whole file; the error names the path.
Result<std::string> ReadFile(const std::string& path);

}  // namespace troupe::trainer
