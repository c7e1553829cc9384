#include "troupe/envs/sampler.h"

#include <algorithm>

#include "rng.h"

namespace troupe::envs {

Result<PromptStream> PromptStream::Create(
    std::shared_ptr<const TaskRegistry> tasks,
    const std::vector<std::pair<std::string, double>>& weights, uint64_t seed, uint32_t shard,
    uint32_t num_shards) {
  if (!tasks) return InvalidArgument("PromptStream: no task registry");
  if (num_shards == 0 || shard >= num_shards)
    return InvalidArgument("PromptStream: shard {} is not in [0, {})", shard, num_shards);
  PromptStream s;
  double total = 0;
  for (const auto& [name, w] : weights) {
    const Task* t = tasks->Find(name);
    if (!t) return InvalidArgument("PromptStream: unknown task '{}'", name);
    if (!(w >= 0 && w <= 1e6))
      return InvalidArgument("PromptStream: task '{}' has weight {}", name, w);
    if (w == 0) continue;
    if (t->size(Split::kTrain) == 0)
      return InvalidArgument("task '{}' has no training prompts", name);
    total += w;
    s.mix_.push_back(t);
    s.cumulative_.push_back(total);
  }
  if (s.mix_.empty()) return InvalidArgument("PromptStream: no task has a positive weight");
  s.tasks_ = std::move(tasks);
  s.seed_ = seed;
  s.shard_ = shard;
  s.num_shards_ = num_shards;
  return s;
}

Result<PromptStream> PromptStream::Create(std::shared_ptr<const TaskRegistry> tasks,
                                          const std::vector<TaskConfig>& configs, uint64_t seed,
                                          uint32_t shard, uint32_t num_shards) {
  std::vector<std::pair<std::string, double>> weights;
  for (const auto& c : configs) weights.emplace_back(c.name, c.weight);
  return Create(std::move(tasks), weights, seed, shard, num_shards);
}

TaskPrompt PromptStream::Next() {
  uint64_t g = position_++ * num_shards_ + shard_;
  size_t pick = 0;
  if (mix_.size() > 1) {
    detail::Rng rng(detail::Mix({seed_, 0x6d6978ULL, g}));
    double x = rng.UniformReal() * cumulative_.back();
    pick = static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), x) -
                               cumulative_.begin());
    pick = std::min(pick, mix_.size() - 1);
  }
  const Task* t = mix_[pick];
  return TaskPrompt{t, t->GetPrompt(Split::kTrain, g)};
}

std::vector<TaskPrompt> EvalPrompts(const TaskRegistry& tasks) {
  std::vector<TaskPrompt> out;
  for (const auto& name : tasks.names()) {
    const Task* t = tasks.Find(name);
    for (uint64_t i = 0; i < t->size(Split::kEval); ++i)
      out.push_back({t, t->GetPrompt(Split::kEval, i)});
  }
  return out;
}

}  // namespace troupe::envs
