// The learner's in-memory batch types, torch-free.
//
// TrainBatch is one scored rollout batch as the learner consumes it; the
// actors layer fills it from the wire's ScoredBatch, whose RolloutBatch stores
// sequences column-wise (all prompt tokens concatenated, offsets per
// sequence, likewise for responses). Demonstrations are prompt/response pairs
// for the supervised warm start. Both are plain values (movable, copyable);
// validation never throws and never aborts: it returns an error naming the
// field, the sequence and the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::trainer {

struct TrainBatch {
  // Globally unique id ("rollout-1/i3/42"); the learner ignores repeats.
  std::string batch_id;
  // Policy version the rollout started from (wire RolloutBatch.policyVersion).
  uint64_t policy_version = 0;
  // Samples per prompt G. Without group_index, sequences [g*G, (g+1)*G) form group g.
  uint32_t group_size = 1;
  // Concatenated prompt tokens; sequence i's prompt is
  // prompt_tokens[prompt_offsets[i] .. prompt_offsets[i+1]). offsets.size() = N+1.
  std::vector<int32_t> prompt_tokens;
  std::vector<int64_t> prompt_offsets;
  // Concatenated response tokens (model AND environment tokens in multi-turn
  // episodes), same layout as the prompt.
  std::vector<int32_t> response_tokens;
  std::vector<int64_t> response_offsets;
  // Log-prob the sampler used for each response token (0 where loss_mask is 0).
  std::vector<float> behaviour_logprobs;
  // 1 = model token (trained), 0 = environment token (never trained). One per response token.
  std::vector<uint8_t> loss_mask;
  // One finite reward per sequence.
  std::vector<float> rewards;
  // Optional: the group of each sequence (sequences sharing a prompt share it),
  // in any order and with any group sizes. Empty: contiguous groups of group_size.
  std::vector<uint32_t> group_index;
  // Optional: the version each sequence's group started from (wire
  // RolloutBatch.sequenceVersions), each >= policy_version. Empty: policy_version for all.
  std::vector<uint64_t> sequence_versions;

  int64_t num_sequences() const {
    return prompt_offsets.empty() ? 0 : static_cast<int64_t>(prompt_offsets.size()) - 1;
  }
  int64_t num_response_tokens() const { return static_cast<int64_t>(response_tokens.size()); }
  // Removes the sequences i with drop[i] != 0 (groups keep their members:
  // group_index is filled in first when empty; sequence_versions is kept in step).
  // Returns how many were removed; 0 and unchanged when `drop`, the offsets, the
  // rewards or the versions do not have one entry per sequence (validation then
  // reports the batch as it came).
  int64_t RemoveSequences(const std::vector<uint8_t>& drop);
  // Appends one sequence (convenience for tests, benchmarks and tools).
  // `behaviour` and `mask` must have response.size() entries.
  void AddSequence(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
                   const std::vector<float>& behaviour, const std::vector<uint8_t>& mask,
                   float reward);
};

// Bounds a batch is checked against.
struct BatchLimits {
  // Token ids must lie in [0, vocab_size).
  int64_t vocab_size = 0;
  // Longest prompt + response in tokens (0: unbounded).
  int64_t max_sequence_tokens = 0;
};

// Checks everything the learner relies on: a non-empty batch_id, offsets (start at 0,
// non-decreasing, end at the column sizes), column sizes agree, token ids in range, every prompt
// non-empty, sequence length within the limit, loss mask 0/1, finite behaviour log-probs <= 0 on
// trained tokens, group layout, and rewards: exactly one per sequence and all finite. The error
// names the field, index and value.
Status ValidateTrainBatch(const TrainBatch& batch, const BatchLimits& limits);
// Only the reward checks (shape, finiteness) of ValidateTrainBatch.
Status ValidateRewards(const TrainBatch& batch);

// Supervised demonstrations: the response tokens of each pair are trained with
// cross-entropy given the prompt. Same column layout as TrainBatch. A
// multi-turn demonstration's response holds the tool turns too; its loss mask
// keeps them (mask 0) out of the loss, exactly as RL does.
struct Demonstrations {
  std::vector<int32_t> prompt_tokens;
  std::vector<int64_t> prompt_offsets;  // N+1 entries
  std::vector<int32_t> response_tokens;
  std::vector<int64_t> response_offsets;  // N+1 entries
  // Optional: 1 = trained token, 0 = environment token, one per response
  // token. Empty = every response token is trained.
  std::vector<uint8_t> loss_mask;

  int64_t num_sequences() const {
    return prompt_offsets.empty() ? 0 : static_cast<int64_t>(prompt_offsets.size()) - 1;
  }
  // Appends one pair, every response token trained (convenience for tests and tools).
  void Add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response);
  // Appends one pair with a per-token loss mask (`mask` must have
  // response.size() entries; ValidateDemonstrations reports a mismatch).
  void Add(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response,
           const std::vector<uint8_t>& mask);
};

// Checks the columns as ValidateTrainBatch does, and the loss mask (empty, or
// one 0/1 entry per response token) and that at least one token is trained.
Status ValidateDemonstrations(const Demonstrations& demos, const BatchLimits& limits);

}  // namespace troupe::trainer
