// Learner configuration: typed, validated in one place, torch-free.
//
// The launcher (which never includes torch) maps the job YAML onto
// LearnerConfig and calls Validate() before spawning anything; the learner
// calls it again when it is constructed. Every field has a default that works
// for the default job (a 2-layer d_model-128 model on a character task); the
// comment on each field says what it means and what trading it off costs.
// Plain value type: copy freely; not shared between threads mutably.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/core/status.h"

namespace troupe::config {
class Binder;
}

namespace troupe::trainer {

// How a sequence's advantage is computed from the rewards of its group
// (the G samples drawn for one prompt).
enum class AdvantageEstimator {
  kGrpo,    // (r - mean_group) / (std_group + eps): GRPO (Shao et al. 2024)
  kDrGrpo,  // r - mean_group, no std division: Dr. GRPO (Liu et al. 2025)
  kRloo,    // r - mean of the OTHER G-1 rewards: leave-one-out (Ahmadian et al. 2024)
};

// How per-token losses are averaged into the loss of one optimizer update.
enum class LossAggregation {
  kTokenMean,     // sum over all trained tokens / number of trained tokens (DAPO):
                  // every token weighs the same, long answers weigh more.
  kSequenceMean,  // mean over sequences of each sequence's token mean (original GRPO):
                  // every sequence weighs the same, its tokens share 1/len each.
};

const char* Name(AdvantageEstimator e);  // "grpo", "dr_grpo", "rloo"
const char* Name(LossAggregation a);     // "token_mean", "sequence_mean"
// Parse the names above; the error lists the accepted values.
Result<AdvantageEstimator> ParseAdvantageEstimator(std::string_view name);
Result<LossAggregation> ParseLossAggregation(std::string_view name);

struct LearnerConfig {
  // ---- advantages
  // Advantage estimator (default grpo). dr_grpo avoids the std division that
  // over-weights groups with tiny reward spread; rloo is unbiased but needs G >= 2.
  AdvantageEstimator advantage = AdvantageEstimator::kGrpo;
  // Multiplies negative advantages (below-group-mean sequences). Default 1
  // (plain GRPO). Values in [0, 1) lean on what worked: 0 trains only on
  // better-than-average samples (RAFT-like), which tolerates much larger
  // learning rates when rewards are sparse; the price is a biased gradient.
  double negative_advantage_scale = 1.0;
  // Added to the group std before dividing (grpo only). Default 1e-6.
  double advantage_eps = 1e-6;
  // Leave groups whose rewards are all equal (zero advantage, no policy
  // gradient) out of the forward/backward pass. Default true: saves their
  // compute. They are counted either way. With kl_coef or entropy_coef > 0
  // those groups would still carry KL/entropy gradient, which skipping drops.
  bool skip_uniform_groups = true;

  // ---- policy loss (decoupled PPO, see docs/trainer.md)
  // Lower clip range: the ratio pi/pi_prox is clipped at 1 - clip_low. Default 0.2.
  double clip_low = 0.2;
  // Upper clip range (clip-higher, DAPO): clipped at 1 + clip_high. Default 0.28;
  // larger keeps exploration alive (low-probability tokens can grow), too large destabilises.
  double clip_high = 0.28;
  // Cap of the behaviour importance weight pi_prox/pi_behav (truncated importance
  // sampling). Default 5. Lower = less variance from stale batches, more bias.
  double is_cap = 5.0;
  // Token-level or sequence-level aggregation (default token_mean).
  LossAggregation aggregation = LossAggregation::kTokenMean;
  // Coefficient of the k3 KL penalty to the frozen reference policy. Default 0
  // (off, no reference forward). > 0 needs a reference model.
  double kl_coef = 0.0;
  // Coefficient of the entropy bonus (subtracted from the loss). Default 0.
  double entropy_coef = 0.0;
  // Sampling temperature the rollout actors used; log-probs are computed at the
  // same temperature so importance weights compare like with like. Default 1.
  double temperature = 1.0;

  // ---- optimizer and schedule (AdamW, linear warmup then cosine decay)
  // Peak RL learning rate. Default 1e-4. Measured on the default job (reverse task,
  // default model, after a supervised warm start): 1e-4 and 5e-5 climb from 0.90 to
  // 0.98+ held-out exact match in 100 updates, 1e-3 wipes the warm start out within
  // 60 updates (Adam moves every weight by ~lr per update whatever the gradient's
  // noise). LLMs want 1e-6..1e-5.
  double lr = 1e-4;
  // Optimizer updates of linear warmup from 0 to lr. Default 10.
  int64_t warmup_steps = 10;
  // Updates after which the cosine decay reaches min_lr_ratio * lr (and stays). Default 1000.
  int64_t total_steps = 1000;
  // Floor of the cosine decay as a fraction of lr. Default 0.1.
  double min_lr_ratio = 0.1;
  // Decoupled AdamW weight decay. Default 0.0 (short RL runs gain nothing from it).
  double weight_decay = 0.0;
  // AdamW betas and epsilon (of RL updates). Defaults 0.9, 0.999, 1e-8. A larger
  // epsilon (1e-4..1e-3) damps the updates of parameters whose gradients are
  // mostly noise, which sparse-reward RL produces a lot of.
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  // Global gradient-norm clip; 0 disables. Default 1.0.
  double grad_clip = 1.0;

  // ---- batching
  // Padded tokens (rows x longest row) per forward/backward micro-batch.
  // Gradients of the micro-batches of one update are accumulated, normalised by
  // token count, so the result does not depend on this value; larger = fewer,
  // bigger matmuls (faster) but more activation memory. Default 8192.
  int64_t micro_batch_tokens = 8192;
  // Threads of one RL update (CPU): the update's sequences are dealt round-robin, longest
  // first, to this many threads; each runs forward and backward of its share's
  // micro-batches with one intra-op thread, and their gradients are summed in thread order,
  // so the result does not depend on timing. 1 = the training thread alone. Default 1.
  int32_t threads = 1;
  // Where the learner's policy (and its KL reference) lives and trains: "cpu", "cuda" or
  // "cuda:N". Default "cpu". Read by the job's learner actor, which places the model; the
  // Learner itself trains on whatever device its model is on. Its evaluation engine follows
  // engine.device. With a CUDA device, threads must be 1.
  std::string device = "cpu";
  // Admitted batches consumed by one optimizer update. Default 1.
  int32_t batches_per_update = 1;
  // Optimizer updates made on the same batches (PPO epochs). Default 1. Each
  // reuse counts toward a batch's policy lag.
  int32_t updates_per_batch = 1;
  // Largest accepted learner_version - batch_version, checked on arrival and
  // before every update that uses the batch. Unset: updates_per_batch - 1
  // (strictly on-policy data, reused for its epochs). Must be >= 0.
  std::optional<int64_t> max_policy_lag;
  // Longest prompt + response (tokens) a batch may contain; longer sequences
  // reject the batch. 0 = the model's limit only. Default 0.
  int64_t max_sequence_tokens = 0;

  // ---- supervised warm start
  // Learning rate of SupervisedStep (constant, no schedule). Default 1e-3 (cross-entropy
  // gradients are consistent; the default model warm-starts well at 1e-3).
  double supervised_lr = 1e-3;
  // Start RL with fresh AdamW moments after a supervised warm start. Default true.
  bool reset_optimizer_for_rl = true;
  // AdamW epsilon of supervised updates (RL updates use adam_eps). Default 1e-8.
  double supervised_adam_eps = 1e-8;

  // ---- process
  // Learner::Create tunes glibc malloc for tensor workloads (process-wide, see
  // allocator.h): ~3x faster backward on CPU for more resident memory. Default true.
  bool tune_allocator = true;
  // Checkpoints kept under a checkpoint root (older ones are deleted). Default 3, >= 1.
  int32_t keep_checkpoints = 3;

  // The lag limit in force: max_policy_lag, or updates_per_batch - 1 when unset.
  int64_t effective_max_policy_lag() const {
    return max_policy_lag ? *max_policy_lag : static_cast<int64_t>(updates_per_batch) - 1;
  }

  // Checks every field; the error names the field, its value and the limit.
  Status Validate() const;
};

// The YAML keys of these structs, each documented once (troupe/core/config_binder.h; the
// launcher binds job files with them, `troupe config-keys` lists them).
void Describe(config::Binder& b, LearnerConfig& c);

}  // namespace troupe::trainer
