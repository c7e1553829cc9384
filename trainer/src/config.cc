#include "troupe/trainer/config.h"

#include <cmath>

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
    return InvalidArgument("learner.{} = {} is out of range [{}, {}]", field, v, lo, hi);
  }
  return Status::Ok();
}

Status Positive(const char* field, double v) {
  if (!std::isfinite(v) || v <= 0) {
    return InvalidArgument("learner.{} = {} must be a finite number > 0", field, v);
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
        "learner.is_cap = {} must be >= 1 (a cap below 1 shrinks on-policy data)", is_cap);
  }
  TROUPE_RETURN_IF_ERROR(InRange("kl_coef", kl_coef, 0.0, 1e6));
  TROUPE_RETURN_IF_ERROR(InRange("entropy_coef", entropy_coef, 0.0, 1e6));
  TROUPE_RETURN_IF_ERROR(Positive("temperature", temperature));
  TROUPE_RETURN_IF_ERROR(Positive("lr", lr));
  if (warmup_steps < 0) {
    return InvalidArgument("learner.warmup_steps = {} must be >= 0", warmup_steps);
  }
  if (total_steps < 1) return InvalidArgument("learner.total_steps = {} must be >= 1", total_steps);
  if (warmup_steps > total_steps) {
    return InvalidArgument("learner.warmup_steps = {} exceeds learner.total_steps = {}",
                           warmup_steps, total_steps);
  }
  TROUPE_RETURN_IF_ERROR(InRange("min_lr_ratio", min_lr_ratio, 0.0, 1.0));
  TROUPE_RETURN_IF_ERROR(InRange("weight_decay", weight_decay, 0.0, 1.0));
  if (!(adam_beta1 >= 0.0 && adam_beta1 < 1.0)) {
    return InvalidArgument("learner.adam_beta1 = {} must be in [0, 1)", adam_beta1);
  }
  if (!(adam_beta2 >= 0.0 && adam_beta2 < 1.0)) {
    return InvalidArgument("learner.adam_beta2 = {} must be in [0, 1)", adam_beta2);
  }
  TROUPE_RETURN_IF_ERROR(Positive("adam_eps", adam_eps));
  TROUPE_RETURN_IF_ERROR(InRange("grad_clip", grad_clip, 0.0, 1e12));
  if (micro_batch_tokens < 1) {
    return InvalidArgument("learner.micro_batch_tokens = {} must be >= 1", micro_batch_tokens);
  }
  if (batches_per_update < 1) {
    return InvalidArgument("learner.batches_per_update = {} must be >= 1", batches_per_update);
  }
  if (updates_per_batch < 1) {
    return InvalidArgument("learner.updates_per_batch = {} must be >= 1", updates_per_batch);
  }
  if (max_policy_lag) {
    if (*max_policy_lag < 0) {
      return InvalidArgument("max_policy_lag = {} must be >= 0 (0 = strictly on-policy)",
                             *max_policy_lag);
    }
    if (*max_policy_lag < updates_per_batch - 1) {
      return InvalidArgument(
          "learner.max_policy_lag = {} is below updates_per_batch - 1 = {}: even fresh batches "
          "would turn stale before their last update",
          *max_policy_lag, updates_per_batch - 1);
    }
  }
  if (max_sequence_tokens < 0) {
    return InvalidArgument("learner.max_sequence_tokens = {} must be >= 0 (0 = model limit)",
                           max_sequence_tokens);
  }
  TROUPE_RETURN_IF_ERROR(Positive("supervised_lr", supervised_lr));
  TROUPE_RETURN_IF_ERROR(InRange("negative_advantage_scale", negative_advantage_scale, 0.0, 1.0));
  TROUPE_RETURN_IF_ERROR(Positive("supervised_adam_eps", supervised_adam_eps));
  if (keep_checkpoints < 1) {
    return InvalidArgument("learner.keep_checkpoints = {} must be >= 1", keep_checkpoints);
  }
  return Status::Ok();
}

}  // namespace troupe::trainer
