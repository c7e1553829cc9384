// Rollout data on the wire (private to actors/): building RolloutBatch and
// ScoredBatch messages and reading them back, torch-free.
//
//   rollout: SequenceRecord[] ──BuildRolloutBatch──▶ RolloutBatch (tensors as own frames)
//   reward:  RolloutBatch ──ForwardScored──▶ ScoredBatch (tensors re-referenced, not copied)
//   learner: ScoredBatch ──ReadTrainBatch──▶ trainer::TrainBatch (validated)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/status.h"
#include "troupe/trainer/batch.h"
#include "troupe/transport/message.h"

namespace troupe::actors {

// One sampled sequence (or multi-turn episode) as a rollout actor ships it.
struct SequenceRecord {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<float> logprobs;           // per response token (0 where mask is 0)
  std::vector<uint8_t> mask;             // 1 model token, 0 environment token
  std::vector<uint64_t> token_versions;  // per response token (optional, may be empty)
  uint32_t group_index = 0;
  wire::FinishReason finish = wire::FinishReason::STOP;
  std::string reject_reason;
  std::string prompt_id, task, reference, service, prompt_text, response_text, extra;
  // Version the sequence's group started from (RolloutBatch.sequenceVersions); sent only when
  // every sequence of a batch has one.
  static constexpr uint64_t kNoVersion = UINT64_MAX;
  uint64_t start_version = kNoVersion;
};

struct RolloutBatchInfo {
  std::string batch_id;
  uint64_t policy_version = 0;  // version at generation start (the oldest of the batch)
  std::string producer;
  uint64_t producer_incarnation = 0;  // the producer process (its network incarnation)
  uint64_t grant_learner = 0;         // learner process whose credits started granted_groups
  uint32_t granted_groups = 0;
  uint32_t group_size = 1;
  int64_t generate_time_ns = 0;
  int64_t created_ns = 0;
};

// Fills `msg` with a RolloutBatch; bulk columns become tensors sent without copies.
Status BuildRolloutBatch(const RolloutBatchInfo& info, const std::vector<const SequenceRecord*>& seqs,
                         transport::OutMessage* msg);
// The same over records held in one vector.
Status BuildRolloutBatch(const RolloutBatchInfo& info, const std::vector<SequenceRecord>& seqs,
                         transport::OutMessage* msg);

// What the reward actor needs of each sequence.
struct ScoringItem {
  std::string task, prompt_text, response_text, reference, service, extra;
};
// Reads the per-sequence metadata of a received RolloutBatch (validated:
// sequence count and offsets agree). Also returns the batch id.
Result<std::vector<ScoringItem>> ReadScoringItems(const transport::InMessage& msg,
                                                  std::string* batch_id, uint32_t* num_sequences);

struct RewardRecord {
  float reward = 0;
  std::string scorer, failure;
  std::vector<std::pair<std::string, double>> components;
  bool unscored = false;  // leave out of training (reward service failed, on_failure: drop)
};
// Builds a ScoredBatch from a received RolloutBatch: scalar fields and
// metadata are copied, tensors are referenced (kept alive by `rollout`).
Status ForwardScored(const transport::InMessage& rollout, const std::vector<RewardRecord>& rewards,
                     const std::string& scorer, int64_t score_time_ns, transport::OutMessage* out);

// Which producer process made a batch: the rollout actor's id and its
// incarnation. Source() ("rollout-0/<incarnation hex>") keys the accounting.
struct BatchOrigin {
  std::string producer;
  uint64_t incarnation = 0;
  uint64_t grant_learner = 0;  // RolloutBatch.grantLearner / grantedGroups
  uint32_t granted_groups = 0;
  std::string Source() const;
};

// Reads a received ScoredBatch into the learner's batch type. Errors name the
// field (dtype, size, offsets); the learner validates the content further.
// `unscored` (optional) gets one flag per sequence: RewardDetail.unscored. The batch's
// sequence_versions are RolloutBatch.sequenceVersions (when sent); one below the batch's
// policyVersion is an error.
Result<trainer::TrainBatch> ReadTrainBatch(const transport::InMessage& msg, BatchOrigin* origin,
                                           std::vector<uint8_t>* unscored = nullptr);

}  // namespace troupe::actors
