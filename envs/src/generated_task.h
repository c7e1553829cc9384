// Base of the built-in generated tasks (private): a deterministic prompt
// stream with a disjoint held-out split.
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "rng.h"
#include "troupe/envs/config.h"
#include "troupe/envs/task.h"

namespace troupe::envs::detail {

struct GeneratedSample {
  std::string key;        // identity of the problem (split disjointness is on keys)
  std::string user;       // user message text
  std::string reference;  // expected answer
  std::string metadata;   // JSON object text or ""
};

class GeneratedTask : public Task {
 public:
  explicit GeneratedTask(TaskConfig config) : config_(std::move(config)) {}

  // Builds the held-out split; call once before use. Fails when the problem
  // space is too small for eval_size.
  Status Init();

  const std::string& name() const override { return config_.name; }
  uint64_t size(Split split) const override;
  Prompt GetPrompt(Split split, uint64_t index) const override;
  // exact: ExactMatch; partial: PartialCredit(); external: a failure.
  VerifyResult Verify(const VerifyInput& input) const override;
  // One assistant message holding the reference.
  Result<Conversation> Demonstration(const Prompt& prompt) const override;
  bool local_verifier() const override { return config_.scoring != "external"; }

 protected:
  // Draws one problem. Must be a pure function of the rng state.
  virtual GeneratedSample Generate(Rng& rng) const = 0;
  // Number of distinct keys Generate can produce (an estimate is fine when large).
  virtual double SpaceSize() const = 0;
  virtual double PartialCredit(std::string_view response, std::string_view reference) const {
    return PositionalCredit(response, reference);
  }
  // The opening messages of a prompt (default: one user message).
  virtual Conversation OpeningMessages(const GeneratedSample& sample) const;

  const TaskConfig& config() const { return config_; }
  bool compact() const { return config_.prompt_style == "compact"; }

 private:
  GeneratedSample TrainSample(uint64_t index) const;

  TaskConfig config_;
  std::vector<GeneratedSample> eval_;
  std::unordered_set<std::string> eval_keys_;
};

// A random lowercase word of c.min_len..c.max_len letters: every length equally
// likely when c.length_power is 0, else P(len) proportional to len^-length_power
// (a long tail of long words).
std::string RandomWord(Rng& rng, const TaskConfig& c);
// Number of lowercase words of c.min_len..c.max_len letters.
double WordSpace(const TaskConfig& c);

// One built-in task kind: the name a job file gives as `kind:`, whether its tasks run
// multi-turn episodes in a tool environment, and its factory. TaskKinds() (task.cc) is the
// only list of kinds: validation, MakeTask, `troupe config-keys` and the docs' key list read it.
struct TaskKind {
  const char* name;
  bool multi_turn;
  Result<std::unique_ptr<Task>> (*make)(const TaskConfig& config);
};
const std::vector<TaskKind>& TaskKinds();

// Constructs a task of type T and runs its Init() (the factory of most kinds).
template <typename T>
Result<std::unique_ptr<Task>> BuildTask(const TaskConfig& config) {
  auto task = std::make_unique<T>(config);
  TROUPE_RETURN_IF_ERROR(task->Init());
  return std::unique_ptr<Task>(std::move(task));
}

// The kinds each family defines, appended to TaskKinds() in this order.
void AddTextTaskKinds(std::vector<TaskKind>* kinds);       // text_tasks.cc: single-turn generated
void AddMultiTurnTaskKinds(std::vector<TaskKind>* kinds);  // multi_turn_tasks.cc: tool episodes
Result<std::unique_ptr<Task>> MakeJsonlTask(const TaskConfig& config);  // dataset.cc: kind jsonl

}  // namespace troupe::envs::detail
