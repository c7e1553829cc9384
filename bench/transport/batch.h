// A realistic RolloutBatch for the transport benchmark: S sequences of a
// 128-token prompt and a 384-token response, column-wise as in troupe.capnp
// (token ids int32, offsets int64, behaviour log-probs float32, loss mask
// uint8, one SequenceMeta per sequence). One sequence is ~4 KiB, so S = 1,
// 16, 256, 4096 gives 4 KiB, 64 KiB, 1 MiB, 16 MiB batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/transport/message.h"
#include "troupe/transport/tensor.h"

namespace troupe::bench {

inline constexpr int kPromptTokens = 128;
inline constexpr int kResponseTokens = 384;

// Tensor contents, allocated once and referenced by every message built.
struct BatchData {
  int sequences = 0;
  std::shared_ptr<transport::AlignedBuffer> prompt_tokens, prompt_offsets, response_tokens,
      response_offsets, logprobs, mask;
  // Payload bytes of the tensors (what a batch carries).
  size_t tensor_bytes() const {
    return prompt_tokens->size() + prompt_offsets->size() + response_tokens->size() +
           response_offsets->size() + logprobs->size() + mask->size();
  }
};

BatchData MakeBatchData(int sequences, uint64_t seed);
// Builds a new message around `data` (tensors referenced, not copied).
transport::OutMessage BuildBatch(const BatchData& data, uint64_t index);

}  // namespace troupe::bench
