// Which prompts a rollout actor generates from.
//
// A PromptStream is a deterministic, sharded stream over the job's training
// tasks, mixed by TaskConfig.weight. Draw k of shard s (of S shards) is the
// global draw g = k * S + s: its task is chosen from the weights by a hash of
// (seed, g), and its prompt is that task's training prompt number g. So
// rollout actors given shards 0..S-1 never generate the same prompt index,
// need no coordination, and a restarted actor resumes exactly where it was
// with Seek(position()). With one task the shards interleave that task's
// order (a JSONL dataset is visited once per epoch across all shards).
//
// EvalPrompts lists every held-out prompt of every task, for evaluation.
//
// Thread safety: a PromptStream is a small value owned by one actor thread;
// the registry it reads is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {

struct TaskPrompt {
  const Task* task = nullptr;  // borrowed from the registry
  Prompt prompt;
};

class PromptStream {
 public:
  // `weights`: task name -> weight (tasks missing from the map are not
  // trained on). InvalidArgument for unknown names, no positive weight, or
  // shard >= num_shards.
  static Result<PromptStream> Create(std::shared_ptr<const TaskRegistry> tasks,
                                     const std::vector<std::pair<std::string, double>>& weights,
                                     uint64_t seed, uint32_t shard, uint32_t num_shards);
  // Same, with the weights of the task configs.
  static Result<PromptStream> Create(std::shared_ptr<const TaskRegistry> tasks,
                                     const std::vector<TaskConfig>& configs, uint64_t seed,
                                     uint32_t shard, uint32_t num_shards);

  // The next training prompt.
  TaskPrompt Next();
  // Draws made so far (checkpoint it; Seek(position) resumes the same stream).
  uint64_t position() const { return position_; }
  void Seek(uint64_t position) { position_ = position; }

 private:
  PromptStream() = default;
  std::shared_ptr<const TaskRegistry> tasks_;
  std::vector<const Task*> mix_;
  std::vector<double> cumulative_;  // cumulative weights, last = total
  uint64_t seed_ = 0;
  uint32_t shard_ = 0;
  uint32_t num_shards_ = 1;
  uint64_t position_ = 0;
};

// Every eval prompt of every task (tasks in name order, prompts in index order).
std::vector<TaskPrompt> EvalPrompts(const TaskRegistry& tasks);

}  // namespace troupe::envs
