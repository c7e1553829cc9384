#include "troupe/trainer/config.h"

#include <cmath>
#include "troupe/core/config_binder.h"
#include "troupe/engine/engine_config.h"

namespace troupe::trainer {

const char* Name(AdvantageEstimator e) {
  switch (e) {
    case AdvantageEstimator::kGrpo:
      return "grpo";
    case AdvantageEstimator::kDrGrpo:
      return "dr_grpo";
    case AdvantageEstimator::kRloo:
      return "rloo";
  }
  return "unknown";
}

const char* Name(LossAggregation a) {
  switch (a) {
    case LossAggregation::kTokenMean:
      return "token_mean";
    case LossAggregation::kSequenceMean:
      return "sequence_mean";
  }
  return "unknown";
}

Result<AdvantageEstimator> ParseAdvantageEstimator(std::string_view name) {
  for (auto e :
       {AdvantageEstimator::kGrpo, AdvantageEstimator::kDrGrpo, AdvantageEstimator::kRloo}) {
    if (name == Name(e)) return e;
  }
  return InvalidArgument("advantage estimator '{}' is unknown (expected grpo, dr_grpo or rloo)",
                         name);
}

Result<LossAggregation> ParseLossAggregation(std::string_view name) {
  for (auto a : {LossAggregation::kTokenMean, LossAggregation::kSequenceMean}) {
    if (name == Name(a)) return a;
  }
  return InvalidArgument("loss aggregation '{}' is unknown (expected token_mean or sequence_mean)",
                         name);
}

namespace {

// Ok if lo <= v <= hi and v is finite.
Status InRange(const char* field, double v, double lo, double hi) {
  if (!std::isfinite(v) || v < lo || v > hi) {
    return InvalidArgument("trainer.{} = {} is out of range [{}, {}]", field, v, lo, hi);
  }
  return Status::Ok();
}

Status Positive(const char* field, double v) {
  if (!std::isfinite(v) || v <= 0) {
    return InvalidArgument("trainer.{} = {} must be a finite number > 0", field, v);
  }
  return Status::Ok();
}

}  // namespace

Status LearnerConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(Positive("advantage_eps", advantage_eps));
  TROUPE_RETURN_IF_ERROR(InRange("clip_low", clip_low, 0.0, 1.0));
  TROUPE_RETURN_IF_ERROR(InRange("clip_high", clip_high, 0.0, 1e3));
  if (!std::isfinite(is_cap) || is_cap < 1.0) {
    return InvalidArgument(
        "trainer.is_cap = {} must be >= 1 (a cap below 1 shrinks on-policy data)", is_cap);
  }
  TROUPE_RETURN_IF_ERROR(InRange("kl_coef", kl_coef, 0.0, 1e6));
  TROUPE_RETURN_IF_ERROR(InRange("entropy_coef", entropy_coef, 0.0, 1e6));
  TROUPE_RETURN_IF_ERROR(Positive("temperature", temperature));
  TROUPE_RETURN_IF_ERROR(Positive("lr", lr));
  if (warmup_steps < 0) {
    return InvalidArgument("trainer.warmup_steps = {} must be >= 0", warmup_steps);
  }
  if (total_steps < 1) return InvalidArgument("trainer.total_steps = {} must be >= 1", total_steps);
  if (warmup_steps > total_steps) {
    return InvalidArgument("trainer.warmup_steps = {} exceeds trainer.total_steps = {}",
                           warmup_steps, total_steps);
  }
  TROUPE_RETURN_IF_ERROR(InRange("min_lr_ratio", min_lr_ratio, 0.0, 1.0));
  TROUPE_RETURN_IF_ERROR(InRange("weight_decay", weight_decay, 0.0, 1.0));
  if (!(adam_beta1 >= 0.0 && adam_beta1 < 1.0)) {
    return InvalidArgument("trainer.adam_beta1 = {} must be in [0, 1)", adam_beta1);
  }
  if (!(adam_beta2 >= 0.0 && adam_beta2 < 1.0)) {
    return InvalidArgument("trainer.adam_beta2 = {} must be in [0, 1)", adam_beta2);
  }
  TROUPE_RETURN_IF_ERROR(Positive("adam_eps", adam_eps));
  TROUPE_RETURN_IF_ERROR(InRange("grad_clip", grad_clip, 0.0, 1e12));
  if (micro_batch_tokens < 1) {
    return InvalidArgument("trainer.micro_batch_tokens = {} must be >= 1", micro_batch_tokens);
  }
  TROUPE_RETURN_IF_ERROR(engine::ValidateDeviceName("trainer.device", device));
  if (device != "cpu" && threads != 1) {
    return InvalidArgument(
        "trainer.threads = {} with trainer.device {}: update threads are for the CPU (use 1)",
        threads, device);
  }
  if (threads < 1 || threads > 64) {
    return InvalidArgument("trainer.threads = {} must be in [1, 64]", threads);
  }
  if (batches_per_update < 1) {
    return InvalidArgument("trainer.batches_per_update = {} must be >= 1", batches_per_update);
  }
  if (updates_per_batch < 1) {
    return InvalidArgument("trainer.updates_per_batch = {} must be >= 1", updates_per_batch);
  }
  if (max_policy_lag) {
    if (*max_policy_lag < 0) {
      return InvalidArgument("max_policy_lag = {} must be >= 0 (0 = strictly on-policy)",
                             *max_policy_lag);
    }
    if (*max_policy_lag < updates_per_batch - 1) {
      return InvalidArgument(
          "trainer.max_policy_lag = {} is below updates_per_batch - 1 = {}: even fresh batches "
          "would turn stale before their last update",
          *max_policy_lag, updates_per_batch - 1);
    }
  }
  if (max_sequence_tokens < 0) {
    return InvalidArgument("trainer.max_sequence_tokens = {} must be >= 0 (0 = model limit)",
                           max_sequence_tokens);
  }
  TROUPE_RETURN_IF_ERROR(Positive("supervised_lr", supervised_lr));
  TROUPE_RETURN_IF_ERROR(InRange("negative_advantage_scale", negative_advantage_scale, 0.0, 1.0));
  TROUPE_RETURN_IF_ERROR(Positive("supervised_adam_eps", supervised_adam_eps));
  if (keep_checkpoints < 1) {
    return InvalidArgument("trainer.keep_checkpoints = {} must be >= 1", keep_checkpoints);
  }
  return Status::Ok();
}

// Describe(): the YAML keys of the config structs, one documented line each
// (troupe/core/config_binder.h).
using config::Binder;
using config::EnumField;

void Describe(Binder& b, LearnerConfig& c) {
  EnumField<AdvantageEstimator>(
      b, "advantage", &c.advantage, "advantage estimator: grpo | dr_grpo | rloo",
      [](AdvantageEstimator e) { return std::string(Name(e)); }, ParseAdvantageEstimator);
  b.Field("advantage_eps", &c.advantage_eps, "added to the group std before dividing (grpo)");
  b.Field("negative_advantage_scale", &c.negative_advantage_scale,
          "scale of negative advantages (1: GRPO; 0: only better-than-average samples)");
  b.Field("skip_uniform_groups", &c.skip_uniform_groups,
          "skip groups whose rewards are all equal (no gradient)");
  b.Field("clip_low", &c.clip_low, "PPO ratio clipped at 1 - clip_low");
  b.Field("clip_high", &c.clip_high, "PPO ratio clipped at 1 + clip_high (clip-higher)");
  b.Field("is_cap", &c.is_cap,
          "cap of the behaviour importance weight (truncated IS for stale batches)");
  EnumField<LossAggregation>(
      b, "aggregation", &c.aggregation, "loss aggregation: token_mean | sequence_mean",
      [](LossAggregation a) { return std::string(Name(a)); }, ParseLossAggregation);
  b.Field("kl_coef", &c.kl_coef, "k3 KL penalty to the reference policy (0: off)");
  b.Field("entropy_coef", &c.entropy_coef, "entropy bonus coefficient (0: off)");
  b.Field("temperature", &c.temperature,
          "temperature of the learner's log-probs (set from sampling.temperature)");
  b.Field("lr", &c.lr, "peak learning rate (AdamW)");
  b.Field("warmup_steps", &c.warmup_steps, "linear warmup updates");
  b.Field("total_steps", &c.total_steps,
          "updates until the cosine decay reaches min_lr_ratio * lr");
  b.Field("min_lr_ratio", &c.min_lr_ratio, "floor of the cosine decay as a fraction of lr");
  b.Field("weight_decay", &c.weight_decay, "AdamW weight decay");
  b.Field("adam_beta1", &c.adam_beta1, "AdamW beta1");
  b.Field("adam_beta2", &c.adam_beta2, "AdamW beta2");
  b.Field("adam_eps", &c.adam_eps, "AdamW epsilon of RL updates (larger damps noisy parameters)");
  b.Field("grad_clip", &c.grad_clip, "global gradient-norm clip (0: off)");
  b.Field("micro_batch_tokens", &c.micro_batch_tokens,
          "padded tokens per forward/backward micro-batch");
  b.Field("device", &c.device, "where the learner trains: cpu | cuda | cuda:N");
  b.Field("threads", &c.threads,
          "threads of an RL update (CPU; sequences dealt round-robin, gradients summed in order)");
  b.Field("updates_per_batch", &c.updates_per_batch, "optimizer updates per batch (PPO epochs)");
  b.Field("max_policy_lag", &c.max_policy_lag,
          "largest learner_version - batch_version accepted (unset: updates_per_batch - 1)");
  b.Field("max_sequence_tokens", &c.max_sequence_tokens,
          "longest prompt + response accepted (0: model limit)");
  b.Field("supervised_lr", &c.supervised_lr, "learning rate of the supervised warm start");
  b.Field("supervised_adam_eps", &c.supervised_adam_eps,
          "AdamW epsilon of the supervised warm start");
  b.Field("reset_optimizer_for_rl", &c.reset_optimizer_for_rl,
          "start RL with fresh AdamW moments after the warm start");
  b.Field("tune_allocator", &c.tune_allocator,
          "keep freed memory in the process (glibc malloc tuning)");
  b.Field("keep_checkpoints", &c.keep_checkpoints, "checkpoints kept");
}

}  // namespace troupe::trainer
