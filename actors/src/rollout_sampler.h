// Samples the sequences of accepted batches for RUN/rollouts.jsonl, the
// dashboard's rollout viewer (private to actors/, torch-free).
//
//   reward ──ScoredBatch──▶ learner (accepted) ──Offer──▶ RolloutSampler ──Metrics "rollouts"──▶ head
//                                                                              └──▶ rollouts.jsonl
//
// Per optimizer update at most rollout_samples.per_update sequences, spread
// over the update's batches (prompts_per_update / groups_per_message of them),
// chosen with a seeded generator. Each record carries what the wire batch
// says: prompt and response texts, tokens with loss mask and per-token
// versions, the response as text segments by mask (multi-turn environment
// tokens marked), reward with scorer/failure/components, policy version and
// the lag at arrival. Learner thread only.
#pragma once

#include <cstdint>
#include <random>

#include <nlohmann/json.hpp>

#include "troupe/actors/runtime.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/launcher/job_config.h"
#include "troupe/transport/message.h"

namespace troupe::actors {

// The update that will train a batch the learner just queued, 1-based (Offer's `update`):
// the learner takes queued batches in order, `batches_per_update` (>= 1) at a time, so
// after `updates_done` updates a batch with `queued_batches` waiting (itself included, >= 1)
// is trained by update updates_done + 1 + (queued_batches - 1) / batches_per_update. Keyed by
// arrival instead, a burst arriving while the learner steps gave the next update its whole
// quota and the updates after it none.
inline uint64_t UpdateThatTrains(uint64_t updates_done, uint64_t queued_batches,
                                 uint64_t batches_per_update) {
  return updates_done + 1 + (queued_batches - 1) / batches_per_update;
}

class RolloutSampler {
 public:
  RolloutSampler(const launcher::JobConfig& job, const engine::Tokenizer* tokenizer, uint64_t seed);
  // A batch the learner accepted at `learner_version` for update number
  // `update` (1-based: the updates made so far + 1; its quota). Sends the chosen sequences
  // to the head as one "rollouts" metrics message (nothing when the update's
  // quota is used up). Never fails the learner: an unreadable batch is skipped.
  void Offer(ActorRuntime& rt, const transport::InMessage& scored, uint64_t learner_version,
             uint64_t update);
  // The records Offer would send (exposed for tests); empty when none.
  nlohmann::json Sample(const transport::InMessage& scored, uint64_t learner_version,
                        uint64_t update);

 private:
  launcher::RolloutSampleSpec spec_;
  uint32_t per_batch_;  // ceil(per_update / batches per update)
  const engine::Tokenizer* tokenizer_;
  std::mt19937_64 rng_;
  uint64_t update_ = UINT64_MAX;  // the update whose quota `taken_` counts
  uint32_t taken_ = 0;
};

}  // namespace troupe::actors
