// The reward actor's scorer: one call scores a batch of sampled sequences,
// locally with the task's verifier or remotely with a reward service.
//
//   rollout ──RolloutBatch──▶ reward actor: RewardScorer::ScoreBatch ──ScoredBatch──▶ learner
//                                ├─ task scored locally → Task::Verify (inline, microseconds)
//                                └─ scoring: external   → RewardClient (HTTP, in parallel)
//
// Routing per sample: the task is looked up by name (SequenceMeta.task); a
// task with a local verifier scores the sample itself (multi-turn tasks read
// the episode's recorded score from the metadata); a task configured with
// scoring "external" sends it to the service the sample names
// (SequenceMeta.service) or to the default service.
//
// Failures are values: an unknown task, a verifier that throws or returns a
// non-finite reward, or any HTTP failure gives reward 0 and a reason, counted
// per task (and per service in the client). Every reward returned is finite.
//
// Thread safety: all methods may be called from any thread concurrently.
// ScoreBatch blocks at most until min(deadline, now + call_timeout_ms) (see
// reward_client.h) plus the time of the local verifiers.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/envs/config.h"
#include "troupe/envs/reward_client.h"
#include "troupe/envs/tasks.h"

namespace troupe::envs {

// One sampled sequence as the reward actor sees it (fields of SequenceMeta).
struct ScoreRequest {
  std::string task;       // SequenceMeta.task
  std::string prompt;     // SequenceMeta.promptText
  std::string response;   // SequenceMeta.responseText
  std::string reference;  // SequenceMeta.reference
  std::string service;    // SequenceMeta.service ("" = the default service)
  std::string metadata;   // SequenceMeta.extra (JSON object text, may be empty)
};

struct TaskScoreStats {
  uint64_t samples = 0;
  uint64_t failures = 0;  // samples that got reward 0 with a failure reason
  double reward_sum = 0;  // over all samples (failures count as 0)
};

class RewardScorer {
 public:
  // Builds the tasks and (when any service is configured) the HTTP client;
  // checks the routing with ValidateRewardRouting.
  static Result<std::unique_ptr<RewardScorer>> Create(const std::vector<TaskConfig>& tasks,
                                                      const RewardClientConfig& client);
  // From parts (custom tasks); `client` may be null when no task is external.
  RewardScorer(std::shared_ptr<const TaskRegistry> tasks, std::unique_ptr<RewardClient> client);

  // Scores every request; results in input order, every reward finite.
  std::vector<VerifyResult> ScoreBatch(const std::vector<ScoreRequest>& requests,
                                       Deadline deadline = Deadline::Never());

  // Per-task counters, by task name (unknown names under "<unknown>").
  std::map<std::string, TaskScoreStats> TaskStats() const;
  // Task and service counters flattened for metrics ("task.<name>.reward_mean", ...).
  std::vector<std::pair<std::string, double>> StatsForMetrics() const;
  const TaskRegistry& tasks() const { return *tasks_; }
  RewardClient* client() const { return client_.get(); }

 private:
  VerifyResult ScoreLocal(const Task& task, const ScoreRequest& r) const;

  std::shared_ptr<const TaskRegistry> tasks_;
  std::unique_ptr<RewardClient> client_;
  mutable Mutex mu_;
  std::map<std::string, TaskScoreStats> stats_ TROUPE_GUARDED_BY(mu_);
};

}  // namespace troupe::envs
