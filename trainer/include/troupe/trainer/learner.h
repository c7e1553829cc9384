// Learner: turns scored rollout batches into policy updates.
//
//   rollout ──RolloutBatch──▶ reward ──ScoredBatch──▶ [learner actor] ──Offer()──▶ Learner
//                                                                         Step() ─▶ new version
//                                                     weights ◀── NamedWeights() ┘  (broadcast)
//
// Offer() validates a batch (shapes, token ids, log-probs, rewards: one finite
// reward per sequence) and applies the lag gate (DESIGN invariant 2): a batch
// from a version ahead of the learner is a protocol error, one more than
// max_policy_lag versions behind is stale; both are counted and never trained
// on. Accepted batches queue until Step() takes `batches_per_update` of them
// and makes `updates_per_batch` optimizer updates on them, one per Step()
// call; before every update each batch's lag is checked again, so reuse ages a
// batch exactly like waiting does. Each optimizer update (RL or supervised)
// increases the policy version by one.
//
// The loss is the decoupled PPO objective of loss.h; log-probs come from
// engine::TokenLogprobs at config.temperature, the same function the sampler
// records, so on fresh data the importance weight is 1 up to float rounding.
//
// Threads: Offer(), ReadyToStep(), version(), step() and counters() are
// thread-safe and never block on training (they take a short internal lock),
// so a receive thread may offer batches while the training thread runs Step().
// Everything else (Step, SupervisedStep, NamedWeights, SnapshotReference,
// SaveCheckpoint, LoadCheckpoint) must be called from one training thread;
// NamedWeights' tensors share storage with the model and change at the next
// update. Nothing here starts threads; Step blocks for the duration of one
// update (compute only), checkpoint calls block on file I/O.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "troupe/core/status.h"
#include "troupe/engine/model.h"
#include "troupe/trainer/batch.h"
#include "troupe/trainer/checkpoint.h"
#include "troupe/trainer/config.h"
#include "troupe/trainer/metrics.h"

namespace troupe::trainer {

// What Offer() did with an accepted batch.
struct Admission {
  uint64_t learner_version = 0;  // the learner's version when the batch was checked
  int64_t lag = 0;               // learner_version - batch version
  size_t queued_batches = 0;     // batches waiting (this one included)
  bool ready = false;            // ReadyToStep() after the offer
};

// What became of a batch the learner accepted (or dropped on arrival).
enum class BatchFate {
  kTrained,  // used by an update (counted at its first one)
  kStale,    // too old on arrival or before its first update (lag gate)
  kInvalid,  // failed validation, came from the future, or its update failed
  kSkipped,  // its update had no learning signal (every group uniform): no optimizer step
};
// "trained", "dropped_stale", "dropped_invalid", "skipped": the accounting term.
const char* BatchFateName(BatchFate fate);
// The fate of a batch Offer() refused with `s` (kStale -> stale, else invalid).
BatchFate FateOfRefusal(const Status& s);

// A batch whose fate is decided: trained, skipped (its update had no signal)
// or dropped after it was accepted (stale before its first update, or its
// update failed). The learner actor acknowledges (or rejects) it upstream.
struct FinishedBatch {
  std::string batch_id;
  BatchFate fate = BatchFate::kTrained;
  std::string reason;  // why it was dropped or skipped (empty when trained)
  int64_t sequences = 0;
  // Trained or skipped: the batch was used as intended and is acknowledged.
  bool accepted() const { return fate == BatchFate::kTrained || fate == BatchFate::kSkipped; }
};

class Learner {
 public:
  // Validates the config against the model (vocabulary, context length) and
  // builds the AdamW optimizer. `reference` is required when kl_coef > 0 (and
  // ignored otherwise); its weights are set to the policy's here and again by
  // SnapshotReference(). Models must live on the same device; the learner
  // trains on the policy's device.
  static Result<std::unique_ptr<Learner>> Create(
      const LearnerConfig& config, std::shared_ptr<engine::LlamaModel> policy,
      std::shared_ptr<engine::LlamaModel> reference = nullptr);
  ~Learner();
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  // Validates and gates a batch; queues it on success. Errors (the batch is
  // then dropped and counted): kInvalidArgument (malformed data or rewards),
  // kProtocol (version from the future), kStale (beyond max_policy_lag),
  // kAlreadyExists (batch id seen before: counted as a duplicate only).
  // Thread-safe, non-blocking.
  Result<Admission> Offer(TrainBatch batch);

  // True when Step() has data: batches in use with updates left, or
  // batches_per_update queued (some may still turn out stale). Thread-safe.
  bool ReadyToStep() const;

  // Makes one RL optimizer update. kUnavailable when not enough fresh data is
  // queued (nothing changes); kInternal when the update failed (non-finite
  // gradients or a torch error: the model is left untouched, the batches are
  // counted invalid). When every sequence is in a uniform-reward group (no
  // gradient) the batches are consumed without an optimizer update: the
  // returned metrics then have `tokens == 0` and the version does not move.
  Result<StepMetrics> Step();

  // One supervised (cross-entropy) update on demonstrations at
  // config.supervised_lr, token-mean over the trained response tokens (mask 1;
  // all of them without a mask). Increases the version like any update.
  // kInvalidArgument for malformed demonstrations.
  Result<StepMetrics> SupervisedStep(const Demonstrations& demos);

  // Forgets the AdamW moments (e.g. between the supervised warm start and RL:
  // the warm start's gradient statistics mislead the first RL updates).
  // Training thread only.
  void ResetOptimizer();

  // LoRA policies: whether the base weights train too (the full warm start), then a new
  // optimizer over what trains. InvalidArgument without LoRA. Training thread only.
  Status SetBaseTrainable(bool trainable);
  // True without LoRA; with LoRA, whether the base trains now.
  bool base_trainable() const;

  // Batches decided since the last call, in decision order. Thread-safe.
  std::vector<FinishedBatch> TakeFinishedBatches();

  // Copies the policy's current weights into the reference (e.g. after the
  // supervised warm start). No-op without a reference.
  void SnapshotReference();

  uint64_t version() const;  // policy version (optimizer updates + the checkpoint's start)
  uint64_t step() const;     // optimizer updates made (RL + supervised), restored from checkpoints
  LearnerCounters counters() const;
  const LearnerConfig& config() const { return config_; }
  engine::LlamaModel& policy() { return *policy_; }
  // The policy's weights under Hugging Face names, for the weight broadcast.
  engine::NamedTensors NamedWeights() const { return policy_->NamedWeights(); }
  // Everything a copy of the policy needs: NamedWeights() plus the LoRA adapters (if any).
  engine::NamedTensors StateWeights() const { return policy_->StateWeights(); }
  // What travels after an update: the adapters (PEFT names) of a LoRA policy, else
  // NamedWeights(). The base of a LoRA policy goes once (WeightSender::SetBase).
  engine::NamedTensors BroadcastWeights() const;

  // Writes a checkpoint under `root` (see checkpoint.h): model and reference
  // weights (safetensors), AdamW state, version, step, schedule position,
  // counters and the torch CPU generator state. Batches still queued or in use
  // are not part of it. Returns the checkpoint directory.
  // `extra_files` (name -> contents) are written into the checkpoint directory
  // before it is committed, so they appear atomically with it (the learner
  // actor's own state, e.g. its delivery and accounting ledger).
  Result<std::string> SaveCheckpoint(const std::string& root, const CheckpointHooks& hooks = {},
                                     const std::map<std::string, std::string>& extra_files = {});
  // Restores a checkpoint written by SaveCheckpoint: `path` is a root (its
  // `latest` is used) or one checkpoint directory. The learner must be idle (no
  // batch queued or in use) and built with the same model shape; on error it is
  // left unchanged unless the error says otherwise.
  Status LoadCheckpoint(const std::string& path);

 private:
  struct State;
  Learner(const LearnerConfig& config, std::shared_ptr<engine::LlamaModel> policy,
          std::shared_ptr<engine::LlamaModel> reference);

  LearnerConfig config_;
  std::shared_ptr<engine::LlamaModel> policy_;
  std::shared_ptr<engine::LlamaModel> reference_;
  std::unique_ptr<State> state_;
};

}  // namespace troupe::trainer
