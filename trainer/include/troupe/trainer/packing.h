// Packing sequences into padded micro-batches for one forward pass each.
//
// A sequence is prompt p_0..p_{P-1} followed by response y_0..y_{R-1}. Row i of
// a micro-batch holds its first P+R-1 tokens (the last token is never an
// input), right-padded to the longest row; position t's logits predict token
// t+1, so response token y_j is the target at position P-1+j. Per position the
// micro-batch carries the target, the trained-token mask and the per-token
// loss inputs, all [rows, T]; causal attention makes right padding harmless.
// Sequences are grouped by length so rows x T stays within the token budget
// with little padding. Functions are pure; thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace troupe::trainer {

// A borrowed view of one sequence and its per-sequence loss inputs.
struct SequenceView {
  const int32_t* prompt = nullptr;
  int64_t prompt_len = 0;
  const int32_t* response = nullptr;
  int64_t response_len = 0;
  const float* behaviour = nullptr;  // per response token; null = 0
  const uint8_t* mask = nullptr;     // per response token; null = all trained
  float advantage = 0.0f;
  float token_weight = 0.0f;  // aggregation weight of each of its trained tokens
  int64_t flat_offset = 0;    // index of y_0 in the caller's flat response-token space

  int64_t input_len() const { return prompt_len + response_len - 1; }
};

struct PackedMicroBatch {
  at::Tensor ids;         // int64 [rows, T] input tokens (0 on padding)
  at::Tensor targets;     // int64 [rows, T] token predicted at each position (0 off-response)
  at::Tensor mask;        // float [rows, T] 1 where the target is a trained response token
  at::Tensor behaviour;   // float [rows, T] behaviour log-prob of the target (0 elsewhere)
  at::Tensor advantages;  // float [rows, T] the row's advantage on response positions
  at::Tensor weights;     // float [rows, T] aggregation weight on trained positions
  at::Tensor flat_index;  // int64 [rows, T] flat response-token index of the target, -1 elsewhere
  at::Tensor valid;       // bool [rows, T] flat_index >= 0
  at::Tensor valid_flat_index;  // int64 [n_valid] flat_index at valid positions (row-major)
  at::Tensor lengths;     // int64 [rows] each row's input length (the rest of T is padding)
  int64_t rows = 0;
  int64_t length = 0;  // T
  int64_t trained_tokens = 0;
};

// Splits the sequences (by index) into micro-batches of at most `budget`
// padded tokens each (a single sequence longer than the budget gets its own
// micro-batch). Longer sequences come first; the order is deterministic.
std::vector<std::vector<int64_t>> PlanMicroBatches(const std::vector<SequenceView>& seqs,
                                                   int64_t budget);

// Packs the listed sequences into one micro-batch. Every listed sequence must
// have input_len() >= 1 (a non-empty prompt and at least one response token).
PackedMicroBatch PackMicroBatch(const std::vector<SequenceView>& seqs,
                                const std::vector<int64_t>& rows);

}  // namespace troupe::trainer
